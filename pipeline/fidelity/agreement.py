"""Policy agreement (issue 31, deliver 2): does a simulator rank the policies as the real environment does?

The ladder's policies (pipeline/fidelity/policies.py) play the same tasks and seeds in the real environment and
in the simulator, each episode judged by the task's own success check (pipeline/fidelity/episodes.py). From
those outcomes, per environment and over all of them (`all`: every environment's episodes pooled):

- each policy's success rate on each side, with its 95% **Wilson score interval**. A rate here is a count of
  successes out of 10 or 20 episodes, often all or none (the solver always succeeds in the real environment,
  the random policy never): the bootstrap of pipeline/evaluation/intervals.py gives such a rate an interval of
  no width, [1, 1], which claims a certainty ten episodes do not have; the normal (Wald) interval collapses
  the same way. Wilson's interval (Wilson 1927; Newcombe 1998, Statist. Med. 17:857) is the score test
  inverted: 10 of 10 is [0.72, 1], and its coverage stays near 95% at small n and at the ends;
- the difference simulator - real per policy, **paired**: the same policy, task and seed on both sides, so the
  pairs are the episodes both sides finished. Its interval is Newcombe's square-and-add interval for paired
  proportions (Newcombe 1998, Statist. Med. 17:2635, method 10): the two Wilson intervals combined with the
  estimated correlation of the pairs (corrected toward zero for 0 < ad - bc <= n/2, as the paper does). A
  simulator that is right episode by episode has a narrow difference even where each rate is wide;
- the rank agreement: Kendall's tau between the policies' simulated and real success rates, tau-b, which
  counts a tie (two noisy rungs both at 0) as neither concordant nor discordant and scales by the ties on
  each side (`scipy.stats.kendalltau`'s default). 1: the simulator orders the ladder as reality does; 0: no
  better than chance; -1: reversed. Where one side gives every policy the same rate there is no ranking to
  agree with: tau is undefined (None, with the reason). Five policies give tau in steps of about 0.2, and
  with few episodes a rung's rank moves with sampling: read tau beside the rates' intervals.
An episode that did not finish (its request to the simulator failed) is left out of its side's rate and of the
pairs; `episodes` counts what each rate is over.
"""

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.evaluation.intervals import LEVEL, Interval

ALL_ENVIRONMENTS = "all"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One finished episode: which environment, policy and seed, and whether the task's check passed."""

    environment: str
    policy: str
    seed: int
    success: bool


@dataclass(frozen=True, slots=True)
class PolicyRates:
    environment: str
    policy: str
    real: Interval  # success rate, 0-1, with its Wilson interval; n: episodes
    simulated: Interval
    difference: Interval  # simulated - real over the paired episodes, Newcombe's interval; n: pairs


@dataclass(frozen=True, slots=True)
class RankAgreement:
    environment: str
    policies: int
    tau: float | None  # Kendall's tau-b; None: undefined (`why`)
    why: str | None = None


@dataclass(frozen=True, slots=True)
class PolicyAgreement:
    simulator: str
    rates: tuple[PolicyRates, ...]  # per environment (then `all`), policies in ladder order
    ranks: tuple[RankAgreement, ...]  # per environment, then `all`

    def tau(self, environment: str = ALL_ENVIRONMENTS) -> float | None:
        return next((rank.tau for rank in self.ranks if rank.environment == environment), None)


def _z(level: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + level / 2.0)


def wilson_interval(successes: int, episodes: int, level: float = LEVEL) -> Interval:
    """The rate and its Wilson score interval; no episodes give no rate."""
    if episodes == 0:
        return Interval(None, None, None, 0)
    z = _z(level)
    rate = successes / episodes
    scale = 1.0 + z * z / episodes
    centre = (rate + z * z / (2 * episodes)) / scale
    half = z * math.sqrt(rate * (1.0 - rate) / episodes + z * z / (4 * episodes * episodes)) / scale
    # At 0 of n the interval starts at 0, at n of n it ends at 1, exactly (the formula's rounding aside).
    low = 0.0 if successes == 0 else centre - half
    high = 1.0 if successes == episodes else centre + half
    return Interval(rate, low, high, episodes)


def paired_difference_interval(pairs: Sequence[tuple[bool, bool]], level: float = LEVEL) -> Interval:
    """first - second over (first, second) success pairs: the difference of the two rates and Newcombe's
    square-and-add interval for paired proportions (his method 10)."""
    n = len(pairs)
    if n == 0:
        return Interval(None, None, None, 0)
    both = sum(1 for a, b in pairs if a and b)
    first_only = sum(1 for a, b in pairs if a and not b)
    second_only = sum(1 for a, b in pairs if b and not a)
    neither = n - both - first_only - second_only
    p1, p2 = (both + first_only) / n, (both + second_only) / n
    first, second = wilson_interval(both + first_only, n, level), wilson_interval(both + second_only, n, level)
    l1, u1, l2, u2 = first.low, first.high, second.low, second.high
    assert l1 is not None and u1 is not None and l2 is not None and u2 is not None  # n > 0
    margins = (both + first_only) * (second_only + neither) * (both + second_only) * (first_only + neither)
    cross = both * neither - first_only * second_only
    # The correlation of the pair, corrected toward 0 as Newcombe does (0 where 0 <= ad - bc <= n/2); 0 where a
    # margin is empty (a rate of 0 or 1 on either side: nothing to correlate).
    corrected = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = corrected / math.sqrt(margins) if margins else 0.0
    difference = p1 - p2
    below = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    above = math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    return Interval(difference, max(-1.0, difference - below), min(1.0, difference + above), n)


def kendall_tau(environment: str, real: Sequence[float], simulated: Sequence[float]) -> RankAgreement:
    """Kendall's tau-b between the real and the simulated rates of the same policies, in the same order."""
    if len(real) < 2:
        return RankAgreement(environment, len(real), None, "fewer than two policies: nothing to rank")
    if len(set(real)) == 1 or len(set(simulated)) == 1:
        side = "real environment" if len(set(real)) == 1 else "simulator"
        why = f"the {side} gives every policy the same success rate: no ranking"
        return RankAgreement(environment, len(real), None, why)
    from scipy.stats import kendalltau

    return RankAgreement(environment, len(real), float(kendalltau(real, simulated).statistic))


def _pooled(outcomes: Iterable[Outcome]) -> dict[tuple[str, str], dict[tuple[str, int], bool]]:
    """(environment, policy) -> {(environment, seed): success}, each environment and `all`."""
    grouped: dict[tuple[str, str], dict[tuple[str, int], bool]] = defaultdict(dict)
    for outcome in outcomes:
        for environment in (outcome.environment, ALL_ENVIRONMENTS):
            grouped[(environment, outcome.policy)][(outcome.environment, outcome.seed)] = outcome.success
    return grouped


def policy_agreement(
    simulator: str, real: Sequence[Outcome], simulated: Sequence[Outcome], policies: Sequence[str]
) -> PolicyAgreement:
    """Every rate, difference and tau of one simulator against the real environments, policies in `policies`'
    order (best first, as the ladder runs)."""
    real_by, simulated_by = _pooled(real), _pooled(simulated)
    environments = sorted({o.environment for o in real} | {o.environment for o in simulated})
    environments += [ALL_ENVIRONMENTS] if environments else []
    rates, ranks = [], []
    for environment in environments:
        present = [p for p in policies if (environment, p) in real_by or (environment, p) in simulated_by]
        rows = []
        for policy in present:
            there, here = real_by.get((environment, policy), {}), simulated_by.get((environment, policy), {})
            paired = [(here[key], there[key]) for key in sorted(there.keys() & here.keys())]
            rows.append(
                PolicyRates(
                    environment,
                    policy,
                    wilson_interval(sum(there.values()), len(there)),
                    wilson_interval(sum(here.values()), len(here)),
                    paired_difference_interval(paired),
                )
            )
        rates += rows
        scored = [row for row in rows if row.real.mean is not None and row.simulated.mean is not None]
        real_rates = [row.real.mean for row in scored if row.real.mean is not None]
        simulated_rates = [row.simulated.mean for row in scored if row.simulated.mean is not None]
        ranks.append(kendall_tau(environment, real_rates, simulated_rates))
    return PolicyAgreement(simulator, tuple(rates), tuple(ranks))


def _rate(interval: Interval) -> str:
    return interval.text(digits=2) if interval.mean is not None else "-"


def agreement_table(agreements: Sequence[PolicyAgreement]) -> str:
    """Plain text: per simulator and environment, each policy's real and simulated success rate with their
    Wilson intervals and the paired difference; then Kendall's tau."""
    lines = [
        "Policy agreement: success rate [95% Wilson interval] per policy, real environment and simulator, the same "
        "tasks and seeds (episodes real/simulated: those that finished); sim - real paired on the episodes both "
        "finished (Newcombe's interval); Kendall tau-b between the policies' rates"
    ]
    header = f"{'policy':<18}  {'episodes':>8}  {'real':<20}  {'simulated':<20}  sim - real (pairs)"
    for agreement in agreements:
        for environment in dict.fromkeys(row.environment for row in agreement.rates):
            lines += ["", f"{agreement.simulator}: {environment}", header]
            for row in agreement.rates:
                if row.environment == environment:
                    episodes = f"{row.real.n}/{row.simulated.n}"
                    lines.append(
                        f"{row.policy:<18}  {episodes:>8}  {_rate(row.real):<20}  {_rate(row.simulated):<20}  "
                        f"{row.difference.text(signed=True, digits=2)} ({row.difference.n})"
                    )
            lines.append(f"Kendall tau-b: {tau_text(agreement, environment)}")
    return "\n".join(lines) + "\n"


def tau_text(agreement: PolicyAgreement, environment: str = ALL_ENVIRONMENTS) -> str:
    rank = next((r for r in agreement.ranks if r.environment == environment), None)
    if rank is None:
        return "-"
    if rank.tau is None:
        return f"undefined ({rank.why})"
    return f"{rank.tau:+.2f} over {rank.policies} policies"
