"""95% intervals by bootstrap over targets, for a mean and for a paired difference of means (issue 28).

Every score the project reports is a mean over target turns, and a few targets make a wide interval:
on 6 targets one answer moves a mean by 17 points. The interval is the percentile bootstrap over the
targets (resample the targets with replacement, take the mean, read the 2.5th and 97.5th percentiles
of those means), as lm-evaluation-harness reports a bootstrap stderr beside each metric. Two models
asked the same targets are compared *paired*: the difference per target, then its mean and interval,
which is much narrower than two separate intervals would suggest, since a hard target is hard for
both. A difference is *measurable* only when its interval excludes zero; otherwise it is "no
measurable change", never "improved".

The resampling is seeded (numpy's PCG64 with a fixed seed), so a report says the same every time it
is computed from the same rows.
"""

from collections.abc import Sequence
from dataclasses import dataclass

RESAMPLES = 2000
SEED = 20261202
LEVEL = 0.95


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean over `n` targets and its bootstrap interval [low, high]."""

    mean: float | None
    low: float | None
    high: float | None
    n: int

    @property
    def measurable(self) -> bool:
        """The interval excludes zero (meaningful for a difference)."""
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    @property
    def direction(self) -> str:
        """`better`, `worse` or `no measurable change`, for a difference where higher is better."""
        if not self.measurable:
            return "no measurable change"
        return "better" if self.low > 0 else "worse"  # type: ignore[operator]  # measurable: low is set

    @property
    def half_width(self) -> float | None:
        """Half the interval's width: a spread to print beside a mean, as lm-evaluation-harness prints a
        stderr (for a normal mean, about 1.96 standard errors)."""
        if self.low is None or self.high is None:
            return None
        return (self.high - self.low) / 2.0

    def text(self, signed: bool = False, digits: int = 1) -> str:
        """`41.1 [35.2, 47.0]`, or with `signed` `+6.3 [+1.2, +11.0]`; `-` when there is no value."""
        if self.mean is None:
            return "-"
        spec = f"+.{digits}f" if signed else f".{digits}f"
        if self.low is None or self.high is None:
            return format(self.mean, spec)
        return f"{self.mean:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"

    def as_dict(self) -> dict[str, float | int | None]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


def _values(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None]


def bootstrap_mean(
    values: Sequence[float | None], resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL
) -> Interval:
    """The mean of the values (None left out) and its percentile-bootstrap interval. One value has no
    spread to resample: its interval is the value itself; none gives no mean."""
    import numpy as np

    kept = _values(values)
    if not kept:
        return Interval(None, None, None, 0)
    data = np.asarray(kept, dtype=float)
    mean = float(data.mean())
    if len(data) == 1:
        return Interval(mean, mean, mean, 1)
    rng = np.random.Generator(np.random.PCG64(seed))
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return Interval(mean, float(low), float(high), len(data))


def bootstrap_macro_mean(
    groups: Sequence[Sequence[float | None]], resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL
) -> Interval:
    """The mean of the groups' means (a macro mean: AgentWorldBench's Overall, every domain weighing alike)
    and its bootstrap interval, the targets resampled within each group (a stratified bootstrap: every
    resample keeps each domain's size, as the eval set does). Groups without a value are left out, as
    the macro mean leaves out a domain without a score."""
    import numpy as np

    kept = [np.asarray(_values(group), dtype=float) for group in groups]
    kept = [group for group in kept if len(group)]
    if not kept:
        return Interval(None, None, None, 0)
    mean = float(np.mean([group.mean() for group in kept]))
    rng = np.random.Generator(np.random.PCG64(seed))
    means = np.mean(
        [group[rng.integers(0, len(group), size=(resamples, len(group)))].mean(axis=1) for group in kept], axis=0
    )
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return Interval(mean, float(low), float(high), sum(len(group) for group in kept))


def paired_difference(
    after: Sequence[float | None],
    before: Sequence[float | None],
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> Interval:
    """after - before, per target (the two sequences are aligned by target; a target missing on either
    side is left out), its mean and bootstrap interval."""
    if len(after) != len(before):
        raise ValueError(f"paired difference over {len(after)} and {len(before)} targets: align them by target first")
    differences = [a - b for a, b in zip(after, before) if a is not None and b is not None]
    return bootstrap_mean(differences, resamples, seed, level)


def paired_by_key(after: dict[str, float | None], before: dict[str, float | None], **kwargs) -> Interval:
    """`paired_difference` over the targets (keys) both sides scored."""
    shared = sorted(set(after) & set(before))
    return paired_difference([after[k] for k in shared], [before[k] for k in shared], **kwargs)


def verdict(interval: Interval, lower_is_better: bool = False) -> str:
    """`improved`, `WORSE` or `no measurable change` for a difference `after - before`; with
    `lower_is_better` (a cross-entropy) a difference below zero is the improvement."""
    if not interval.measurable:
        return "no measurable change"
    return "improved" if (interval.direction == "better") != lower_is_better else "WORSE"


def change_words(interval: Interval, what: str = "", lower_is_better: bool = False, digits: int = 1) -> str:
    """`improved +6.3 [+1.2, +11.0]`, `WORSE -4.0 [-7.9, -0.6]` or `no measurable change +1.0 [-2.1, +4.3]`:
    a summary line's words for a difference, so a reader never sees "improved" on an interval that
    crosses zero. `what` names the measure (`val score`); the sign is always after - before, and with
    `lower_is_better` a negative difference is the one called improved."""
    label = f"{what} " if what else ""
    return f"{label}{verdict(interval, lower_is_better)} {interval.text(signed=True, digits=digits)}"
