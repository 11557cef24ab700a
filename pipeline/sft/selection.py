"""Choosing a query's winner among its judged candidates, and whether it is kept (issues 10 and 17).

1. Candidates that parsed and got a valid pointwise judgement are the contenders; none: the query is
   discarded (`no_parsed_candidate` when nothing parsed, `no_valid_judgement` otherwise).
2. Only contenders that pass both gates compete (SPEC: "If the best falls below a minimum score the
   query is discarded"; a winner that fails a gate would discard a query another candidate could keep):
   - `min_score`: the pointwise score; none passes: `below_min_score`;
   - the thinking check, `min_agreement` (None: off): the sample trains on the winner's thinking then
     the *real* observation, so the thinking must lead to that observation. The winner's own
     prediction must agree with the real one on deterministic content: the judge's measure of it
     (pipeline/sft/judging.py: content agreement for the similarity judge, factuality for the LLM
     judge) at least `min_agreement`; none passes: `thinking_inconsistent`.
   A discarded query records its best contender (by pointwise score) as `winner`, for inspection.
3. The competitors are ranked by pointwise score, ties by candidate order (generator order in the
   config, then sample index). One alone wins (`decided_by = only_candidate`).
4. Two or more, with a judge that compares pairwise (the LLM judge): every ordered pair meets, round
   robin in both orders (A/B and B/A), which cancels a judge's preference for a position. Each valid,
   non-tie answer is a vote. Most votes win: `pairwise` when the winner was preferred over every other
   competitor in both orders, `pairwise_majority` otherwise. Equal votes at the top (the judge followed
   the position, or abstained) leave it to the pointwise scores (`pointwise`), and equal scores to
   candidate order (`candidate_order`).
5. With a judge that does not compare (the similarity judge, whose "pairwise" answer would restate its
   pointwise scores, not a second opinion): the ranking decides, `pointwise` (or `candidate_order` on
   equal scores), and no pairwise judgement is made.
The winner of step 3-5 is kept (`kept`).
"""

from collections.abc import Mapping
from dataclasses import dataclass

# Part of every selection's key (pipeline/sft/sampling.py): a changed rule decides again rather than
# reusing decisions made by the old one. 2: gates before competing, round robin, the thinking check.
SELECTION_RULES = 2


@dataclass(frozen=True, slots=True)
class Contender:
    candidate_id: str
    order: int  # position among the query's candidates: generator order, then sample index
    score: float
    agreement: float | None = None  # of its prediction with the real observation, on the judge's measure


@dataclass(frozen=True, slots=True)
class Rules:
    min_score: float
    min_agreement: float | None = None  # the thinking check; None: off
    pairwise: bool = True  # whether the judge compares competitors pairwise


@dataclass(frozen=True, slots=True)
class Selection:
    kept: bool
    reason: str
    winner: str | None = None
    runner_up: str | None = None
    decided_by: str | None = None
    score: float | None = None


# (candidate shown as A, candidate shown as B) -> the judge's answer: A, B, tie, or None when invalid or missing.
Preferences = Mapping[tuple[str, str], str | None]


def ranked(contenders: list[Contender]) -> list[Contender]:
    return sorted(contenders, key=lambda c: (-c.score, c.order))


def consistent(contender: Contender, rules: Rules) -> bool:
    if rules.min_agreement is None:
        return True
    return contender.agreement is not None and contender.agreement >= rules.min_agreement


def competitors(contenders: list[Contender], rules: Rules) -> list[Contender]:
    """The contenders that pass `min_score` and the thinking check, ranked."""
    return [c for c in ranked(contenders) if c.score >= rules.min_score and consistent(c, rules)]


def pairings(competing: list[Contender]) -> list[tuple[Contender, Contender]]:
    """Round robin in both orders: every ordered pair of distinct competitors, (first, second) as (A, B)."""
    return [(a, b) for a in competing for b in competing if a.candidate_id != b.candidate_id]


def votes(competing: list[Contender], preferences: Preferences) -> dict[str, int]:
    tally = {c.candidate_id: 0 for c in competing}
    for a, b in pairings(competing):
        answer = preferences.get((a.candidate_id, b.candidate_id))
        if answer == "A":
            tally[a.candidate_id] += 1
        elif answer == "B":
            tally[b.candidate_id] += 1
    return tally


def _preferred_in_both_orders(winner: Contender, competing: list[Contender], preferences: Preferences) -> bool:
    return all(
        preferences.get((winner.candidate_id, other.candidate_id)) == "A"
        and preferences.get((other.candidate_id, winner.candidate_id)) == "B"
        for other in competing
        if other is not winner
    )


def _discarded(reason: str, field: list[Contender]) -> Selection:
    best = field[0]
    return Selection(
        False,
        reason,
        best.candidate_id,
        field[1].candidate_id if len(field) > 1 else None,
        "pointwise" if len(field) > 1 else "only_candidate",
        best.score,
    )


def decide(
    contenders: list[Contender], any_parsed: bool, rules: Rules, preferences: Preferences | None = None
) -> Selection:
    """The selection of one query; `preferences` holds the pairwise answers over `pairings(competitors(...))`."""
    if not contenders:
        return Selection(False, "no_valid_judgement" if any_parsed else "no_parsed_candidate")
    passing = [c for c in ranked(contenders) if c.score >= rules.min_score]
    if not passing:
        return _discarded("below_min_score", ranked(contenders))
    competing = [c for c in passing if consistent(c, rules)]
    if not competing:
        return _discarded("thinking_inconsistent", passing)
    if len(competing) == 1:
        return Selection(True, "kept", competing[0].candidate_id, None, "only_candidate", competing[0].score)
    if rules.pairwise:
        tally = votes(competing, preferences or {})
        order = sorted(competing, key=lambda c: (-tally[c.candidate_id], -c.score, c.order))
    else:
        tally, order = {c.candidate_id: 0 for c in competing}, competing
    winner, runner_up = order[0], order[1]
    if tally[winner.candidate_id] > tally[runner_up.candidate_id]:
        decided_by = (
            "pairwise" if _preferred_in_both_orders(winner, competing, preferences or {}) else "pairwise_majority"
        )
    elif winner.score != runner_up.score:
        decided_by = "pointwise"
    else:
        decided_by = "candidate_order"
    return Selection(True, "kept", winner.candidate_id, runner_up.candidate_id, decided_by, winner.score)
