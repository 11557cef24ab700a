"""Selecting a query's winner: the min_score and thinking gates before anyone competes, round-robin pairwise
votes in both orders among the competitors, the pointwise ranking where the judge does not compare."""

import pytest

from pipeline.sft.selection import Contender, Rules, decide, pairings

# Pointwise score, then the agreement of the candidate's own prediction with the real observation.
A = Contender("a", 0, 4.0, 0.9)
B = Contender("b", 1, 3.5, 0.8)
B_EQUAL = Contender("b", 1, 4.0, 0.8)
C = Contender("c", 2, 3.2, 0.7)
LOW = Contender("low", 3, 2.0, 1.0)
A_GUESSED = Contender("a", 0, 4.5, 0.2)  # scores well, but its prediction is not the real observation's content
B_GUESSED = Contender("b", 1, 3.5, 0.0)

LLM = Rules(min_score=3.0, min_agreement=0.5, pairwise=True)
LLM_NO_CHECK = Rules(min_score=3.0, min_agreement=None, pairwise=True)
SEMANTIC = Rules(min_score=3.0, min_agreement=0.5, pairwise=False)


def answers(*pairs: tuple[str, str, str | None]) -> dict[tuple[str, str], str | None]:
    """(shown as A, shown as B, answer) triples as the preference map."""
    return {(a, b): answer for a, b, answer in pairs}


def beats(winner: str, loser: str) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    return (winner, loser, "A"), (loser, winner, "B")


CASES = [
    # (why, contenders, any_parsed, rules, preferences, expected: kept, reason, winner, runner_up, decided_by)
    ("nothing parsed", [], False, LLM, {}, (False, "no_parsed_candidate", None, None, None)),
    ("parsed but every judgement invalid", [], True, LLM, {}, (False, "no_valid_judgement", None, None, None)),
    ("one candidate", [A], True, LLM, {}, (True, "kept", "a", None, "only_candidate")),
    ("one candidate below min_score", [LOW], True, LLM, {}, (False, "below_min_score", "low", None, "only_candidate")),
    ("both orders prefer b", [A, B], True, LLM, answers(*beats("b", "a")), (True, "kept", "b", "a", "pairwise")),
    ("both orders prefer a", [A, B], True, LLM, answers(*beats("a", "b")), (True, "kept", "a", "b", "pairwise")),
    (
        "position bias (always A) cancels out: pointwise decides",
        [A, B],
        True,
        LLM,
        answers(("a", "b", "A"), ("b", "a", "A")),
        (True, "kept", "a", "b", "pointwise"),
    ),
    (
        "one order prefers b, the other ties",
        [A, B],
        True,
        LLM,
        answers(("a", "b", "B"), ("b", "a", "tie")),
        (True, "kept", "b", "a", "pairwise_majority"),
    ),
    (
        "one order invalid, the other prefers b",
        [A, B],
        True,
        LLM,
        answers(("a", "b", None), ("b", "a", "A")),
        (True, "kept", "b", "a", "pairwise_majority"),
    ),
    (
        "ties and equal scores: candidate order",
        [B_EQUAL, A],
        True,
        LLM,
        answers(("a", "b", "tie"), ("b", "a", "tie")),
        (True, "kept", "a", "b", "candidate_order"),
    ),
    # 8(b): a candidate below min_score does not compete, so it cannot win the pairwise step and drop the query.
    (
        "a candidate below min_score does not compete: the other wins alone",
        [A, LOW],
        True,
        LLM,
        answers(*beats("low", "a")),
        (True, "kept", "a", None, "only_candidate"),
    ),
    # 8(a): the third candidate meets the other two.
    (
        "round robin: the third by pointwise wins every comparison",
        [A, B, C],
        True,
        LLM,
        answers(*beats("c", "a"), *beats("c", "b"), *beats("a", "b")),
        (True, "kept", "c", "a", "pairwise"),
    ),
    (
        "round robin: most votes without beating everyone in both orders",
        [A, B, C],
        True,
        LLM,
        answers(*beats("c", "a"), ("c", "b", "A"), ("b", "c", "tie"), *beats("b", "a")),
        (True, "kept", "c", "b", "pairwise_majority"),
    ),
    (
        "round robin: equal votes at the top go to the pointwise score",
        [A, B, C],
        True,
        LLM,
        answers(*beats("b", "a"), *beats("c", "b"), *beats("a", "c")),
        (True, "kept", "a", "b", "pointwise"),
    ),
    (
        "round robin: only competitors meet (low is below min_score)",
        [A, B, LOW],
        True,
        LLM,
        answers(*beats("b", "a"), *beats("low", "b")),
        (True, "kept", "b", "a", "pairwise"),
    ),
    # Item 7: the thinking check.
    (
        "the best-scored prediction is not the real observation: the consistent one wins",
        [A_GUESSED, B],
        True,
        LLM,
        answers(*beats("a", "b")),
        (True, "kept", "b", None, "only_candidate"),
    ),
    (
        "no prediction agrees with the real observation: thinking_inconsistent",
        [A_GUESSED, B_GUESSED, LOW],
        True,
        LLM,
        {},
        (False, "thinking_inconsistent", "a", "b", "pointwise"),
    ),
    (
        "the consistent candidate is below min_score, the one above it guessed: thinking_inconsistent",
        [A_GUESSED, LOW],
        True,
        LLM,
        {},
        (False, "thinking_inconsistent", "a", None, "only_candidate"),
    ),
    (
        "nothing passes min_score: below_min_score, whatever the agreement",
        [LOW, Contender("x", 4, 1.5, 0.0)],
        True,
        LLM,
        {},
        (False, "below_min_score", "low", "x", "pointwise"),
    ),
    (
        "agreement exactly at the threshold passes",
        [Contender("a", 0, 4.0, 0.5)],
        True,
        LLM,
        {},
        (True, "kept", "a", None, "only_candidate"),
    ),
    (
        "no agreement measured fails a check that is on",
        [Contender("a", 0, 4.0, None)],
        True,
        LLM,
        {},
        (False, "thinking_inconsistent", "a", None, "only_candidate"),
    ),
    (
        "the check off (None): the best-scored wins",
        [A_GUESSED, B],
        True,
        LLM_NO_CHECK,
        answers(*beats("a", "b")),
        (True, "kept", "a", "b", "pairwise"),
    ),
    # 8(c): the similarity judge does not compare; its ranking decides, whatever a preference map says.
    (
        "similarity judge: the ranking decides",
        [B, A, C],
        True,
        SEMANTIC,
        answers(*beats("c", "a")),
        (True, "kept", "a", "b", "pointwise"),
    ),
    (
        "similarity judge: equal scores go to candidate order",
        [B_EQUAL, A],
        True,
        SEMANTIC,
        {},
        (True, "kept", "a", "b", "candidate_order"),
    ),
    (
        "similarity judge: the thinking check applies",
        [A_GUESSED, B],
        True,
        SEMANTIC,
        {},
        (True, "kept", "b", None, "only_candidate"),
    ),
]


@pytest.mark.parametrize(
    ("why", "contenders", "any_parsed", "rules", "preferences", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_decide(why, contenders, any_parsed, rules, preferences, expected):
    selection = decide(contenders, any_parsed, rules, preferences)
    assert (selection.kept, selection.reason, selection.winner, selection.runner_up, selection.decided_by) == expected


def test_the_score_recorded_is_the_winners():
    assert decide([A, B], True, LLM, answers(*beats("b", "a"))).score == 3.5


def test_pairings_are_a_round_robin_in_both_orders():
    pairs = {(a.candidate_id, b.candidate_id) for a, b in pairings([A, B, C])}
    assert pairs == {("a", "b"), ("b", "a"), ("a", "c"), ("c", "a"), ("b", "c"), ("c", "b")}
