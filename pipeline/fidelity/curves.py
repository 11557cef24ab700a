"""Fidelity against step: the curves, the gap between closed and open loop, steps to the first divergence.

Per domain (and `all`, every domain pooled) and mode, from a rollout's scored steps
(pipeline/fidelity/rollouts.py):
- the mean score (0-100) at each step with its 95% bootstrap interval over the trajectories that reached the
  step, and the masked exact-match rate likewise (pipeline/evaluation/intervals.py `bootstrap_mean`);
- the gap at each step, closed minus open, paired on the trajectories scored in both modes
  (`paired_difference`): the same turn asked with the simulator's own history and with the real one, so a
  hard turn is hard for both and the interval is of the compounding alone;
- steps to the first divergence: the first step whose score is below `DIVERGENCE_THRESHOLD`. A trajectory
  that never diverges is censored at its length (the last step it was followed to): it says divergence comes
  later than that, not when. The median per domain is the Kaplan-Meier median (the first step at which the
  estimated share of trajectories not yet diverged is at most one half), which counts a censored trajectory
  as not diverged for as long as it was followed and no further. Counting it as diverging at its length would
  shorten the median; leaving it out would too (the trajectories that hold out are the ones left out). Where
  fewer than half diverge within what was followed, the median is not reached: None, reported as "more than"
  the longest follow-up. A step without a score (a failed generation, an invalid judgement) ends what is
  known of the trajectory: it is censored at the step before.
Then a PNG (score against step, open and closed with their interval bands, a panel per domain) and a
plain-text table of the same numbers.
"""

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.fidelity import DIVERGENCE_THRESHOLD
from pipeline.evaluation.intervals import Interval, bootstrap_mean, paired_by_key
from pipeline.fidelity.rollouts import CLOSED_LOOP, MODES, OPEN_LOOP, Rollouts, ScoredStep

ALL_DOMAINS = "all"


@dataclass(frozen=True, slots=True)
class StepPoint:
    domain: str
    mode: str
    step: int
    score: Interval  # 0-100, over the trajectories scored at this step
    exact_match: Interval  # the masked exact-match rate, 0-1


@dataclass(frozen=True, slots=True)
class StepGap:
    domain: str
    step: int
    gap: Interval  # closed minus open, paired on the trajectories scored in both


@dataclass(frozen=True, slots=True)
class Divergence:
    """One trajectory in one mode: the first step below the threshold (`diverged`), or the last step it was
    followed to without one (censored)."""

    trajectory_id: str
    domain: str
    mode: str
    steps: int
    diverged: bool


@dataclass(frozen=True, slots=True)
class MedianDivergence:
    domain: str
    mode: str
    trajectories: int
    diverged: int
    median: int | None  # Kaplan-Meier; None: not reached (fewer than half diverged within what was followed)
    longest: int  # the longest follow-up, in steps: a median not reached is more than this

    def text(self) -> str:
        median = f"more than {self.longest}" if self.median is None else str(self.median)
        return f"{median} ({self.diverged} of {self.trajectories} diverged)"


@dataclass(frozen=True, slots=True)
class FidelityCurves:
    simulator: str
    judge: str
    threshold: float
    points: tuple[StepPoint, ...]
    gaps: tuple[StepGap, ...]
    divergences: tuple[Divergence, ...]
    medians: tuple[MedianDivergence, ...]


def _domains(steps: Iterable[ScoredStep]) -> list[str]:
    return sorted({step.domain for step in steps}) + [ALL_DOMAINS]


def _in(domain: str, step: ScoredStep) -> bool:
    return domain in (ALL_DOMAINS, step.domain)


def step_points(steps: Sequence[ScoredStep]) -> list[StepPoint]:
    """The mean score and exact-match rate per domain, mode and step, each with its 95% interval."""
    grouped: dict[tuple[str, str, int], list[ScoredStep]] = defaultdict(list)
    for domain in _domains(steps):
        for step in steps:
            if _in(domain, step):
                grouped[(domain, step.mode, step.step)].append(step)
    return [
        StepPoint(
            domain,
            mode,
            number,
            bootstrap_mean([s.score for s in chosen]),
            bootstrap_mean([None if s.exact_match is None else float(s.exact_match) for s in chosen]),
        )
        for (domain, mode, number), chosen in sorted(grouped.items(), key=lambda item: _order(item[0]))
    ]


def _order(key: tuple[str, str, int]) -> tuple[bool, str, int, int]:
    domain, mode, number = key
    return domain == ALL_DOMAINS, domain, number, MODES.index(mode)


def step_gaps(steps: Sequence[ScoredStep]) -> list[StepGap]:
    """Closed minus open per domain and step, paired by trajectory."""
    scores: dict[tuple[str, int, str], dict[str, float | None]] = defaultdict(dict)
    for domain in _domains(steps):
        for step in steps:
            if _in(domain, step):
                scores[(domain, step.step, step.mode)][step.trajectory_id] = step.score
    keys = sorted({(domain, number) for domain, number, _ in scores}, key=lambda k: (k[0] == ALL_DOMAINS, *k))
    return [
        StepGap(
            domain, number, paired_by_key(scores[(domain, number, CLOSED_LOOP)], scores[(domain, number, OPEN_LOOP)])
        )
        for domain, number in keys
        if (domain, number, CLOSED_LOOP) in scores and (domain, number, OPEN_LOOP) in scores
    ]


def first_divergence(scores: Sequence[float | None], threshold: float = DIVERGENCE_THRESHOLD) -> tuple[int, bool]:
    """(steps, diverged) of one trajectory's scores from step 1 on: the first step below `threshold`, or the
    last step followed without one (censored); an unscored step censors at the step before it."""
    for number, score in enumerate(scores, start=1):
        if score is None:
            return number - 1, False
        if score < threshold:
            return number, True
    return len(scores), False


def divergences(steps: Sequence[ScoredStep], threshold: float = DIVERGENCE_THRESHOLD) -> list[Divergence]:
    followed: dict[tuple[str, str], list[ScoredStep]] = defaultdict(list)
    for step in steps:
        followed[(step.trajectory_id, step.mode)].append(step)
    result = []
    for (trajectory_id, mode), chosen in followed.items():
        chosen.sort(key=lambda s: s.step)
        number, diverged = first_divergence([s.score for s in chosen], threshold)
        result.append(Divergence(trajectory_id, chosen[0].domain, mode, number, diverged))
    return result


def kaplan_meier_median(followed: Sequence[tuple[int, bool]]) -> int | None:
    """The first step at which the Kaplan-Meier estimate of the share not yet diverged is at most one half,
    over (steps, diverged) pairs; None where it never is. A trajectory censored at step k was at risk up to
    and including step k: had it diverged at k, that would have been seen."""
    surviving = 1.0
    for number in sorted({steps for steps, diverged in followed if diverged}):
        at_risk = sum(1 for steps, _ in followed if steps >= number)
        events = sum(1 for steps, diverged in followed if diverged and steps == number)
        surviving *= 1.0 - events / at_risk
        if surviving <= 0.5:
            return number
    return None


def median_divergences(found: Sequence[Divergence]) -> list[MedianDivergence]:
    medians = []
    for domain in sorted({d.domain for d in found}) + [ALL_DOMAINS]:
        for mode in MODES:
            chosen = [d for d in found if d.mode == mode and domain in (ALL_DOMAINS, d.domain)]
            if not chosen:
                continue
            pairs = [(d.steps, d.diverged) for d in chosen]
            medians.append(
                MedianDivergence(
                    domain,
                    mode,
                    len(chosen),
                    sum(d.diverged for d in chosen),
                    kaplan_meier_median(pairs),
                    max(d.steps for d in chosen),
                )
            )
    return medians


def fidelity_curves(rollouts: Rollouts, threshold: float = DIVERGENCE_THRESHOLD) -> FidelityCurves:
    """Every aggregate of one simulator's rollouts."""
    found = divergences(rollouts.steps, threshold)
    return FidelityCurves(
        rollouts.simulator,
        rollouts.judge,
        threshold,
        tuple(step_points(rollouts.steps)),
        tuple(step_gaps(rollouts.steps)),
        tuple(sorted(found, key=lambda d: (d.domain, d.mode, d.trajectory_id))),
        tuple(median_divergences(found)),
    )


def fidelity_table(curves: FidelityCurves) -> str:
    """The numbers as plain text: per domain, a row per step (trajectories, open and closed score with their
    intervals, the paired gap, exact match open / closed), then the median steps to the first divergence."""
    by_point = {(p.domain, p.mode, p.step): p for p in curves.points}
    by_gap = {(g.domain, g.step): g for g in curves.gaps}
    lines = [
        f"Closed-loop fidelity of {curves.simulator} (judge: {curves.judge}); score 0-100, mean [95% bootstrap "
        f"interval] over trajectories; gap = closed - open, paired; divergence: first step scoring below "
        f"{curves.threshold:g}"
    ]
    header = f"{'step':>4}  {'n':>4}  {'open':<20}  {'closed':<20}  {'closed - open':<24}  exact match open / closed"
    for domain in dict.fromkeys(p.domain for p in curves.points):
        lines += ["", f"{domain}", header]
        numbers = sorted({p.step for p in curves.points if p.domain == domain})
        for number in numbers:
            opened, closed = by_point.get((domain, OPEN_LOOP, number)), by_point.get((domain, CLOSED_LOOP, number))
            gap = by_gap.get((domain, number))
            count = max(p.score.n for p in (opened, closed) if p is not None)
            lines.append(
                f"{number:>4}  {count:>4}  {_score(opened):<20}  {_score(closed):<20}  "
                f"{gap.gap.text(signed=True) if gap else '-':<24}  "
                f"{_rate(opened)} / {_rate(closed)}"
            )
        for median in curves.medians:
            if median.domain == domain:
                lines.append(f"steps to first divergence, {median.mode} loop (Kaplan-Meier median): {median.text()}")
    return "\n".join(lines) + "\n"


def _score(point: StepPoint | None) -> str:
    return "-" if point is None else point.score.text()


def _rate(point: StepPoint | None) -> str:
    return "-" if point is None or point.exact_match.mean is None else f"{point.exact_match.mean:.2f}"


def fidelity_plot(curves: FidelityCurves, path: Path) -> Path:
    """Score against step, open and closed loop with their 95% interval bands, a panel per domain (and one
    for all domains pooled where there are several)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = list(dict.fromkeys(p.domain for p in curves.points))
    if len(domains) == 2:  # one domain and `all`, the same numbers twice
        domains = domains[:1]
    columns = min(3, len(domains))
    rows = -(-len(domains) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.5 * rows), squeeze=False)
    for panel, domain in zip(axes.flat, domains):
        for mode, style in ((OPEN_LOOP, "-"), (CLOSED_LOOP, "--")):
            shown = [p for p in curves.points if p.domain == domain and p.mode == mode and p.score.mean is not None]
            if not shown:
                continue
            steps = [p.step for p in shown]
            line = panel.plot(steps, [p.score.mean for p in shown], style, marker="o", label=f"{mode} loop")[0]
            panel.fill_between(
                steps, [p.score.low for p in shown], [p.score.high for p in shown], color=line.get_color(), alpha=0.2
            )
        panel.axhline(curves.threshold, color="grey", linewidth=0.8, linestyle=":", label="divergence threshold")
        panel.set_title(domain, fontsize=10)
        panel.set_xlabel("step")
        panel.set_ylabel("score, 0-100")
        panel.set_ylim(0, 100)
        panel.legend(fontsize=7)
    for panel in list(axes.flat)[len(domains) :]:
        panel.set_visible(False)
    figure.suptitle(f"Fidelity against step: {curves.simulator} (judge {curves.judge}), 95% intervals", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
