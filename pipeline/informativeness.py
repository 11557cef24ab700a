"""Turn informativeness (SPEC.md, Qwen-AgentWorld): word sets, four metrics, a category, a keep ratio.

Two renderings of one definition live here side by side, so that a change to one is made to the
other in the same edit (and `SCORER_VERSION` bumped):
- the per-turn Python functions (`word_set`, `turn_metrics`, `categorize`, `score_turn`): the
  readable specification, used by the tests and as the baseline of bench/score.py;
- `scores_sql`: the same computation as one DuckDB statement over a relation of turns, which
  `stages/score.py` runs on every kept turn at once. tests/test_informativeness.py checks the two
  agree on thousands of random turns.

Tokenisation. A word is a maximal run of Unicode letters, numbers and underscores, after
lower-casing; everything else (whitespace, punctuation, symbols, combining marks) separates words.
So `{"user_id": 42}` has the words {user_id, 42}; `src/app/main.py` has {src, app, main, py};
`2024-05-15` has {2024, 05, 15}; `don't` has {don, t}; a punctuation-only text has none. Splitting
paths and dotted names lets `cat src/app/main.py` overlap an observation that cites `main.py:12`,
and keeps a sentence's final period off its last word. Lower-casing is per character (Unicode's
simple case mapping, as DuckDB's `lower()` does): `str.lower()` differs only in two context rules,
undone before it is called (see `fold_case`). Python 3.11's `\\w` and RE2's `[\\pL\\pN_]` agree on
every code point of Unicode 14; characters first assigned later (CJK extension H, Kawi, ...)
count as letters in SQL only.

Edge cases. A metric whose denominator is empty is undefined and stored as NULL (None):
overlap when the action has no words, novelty when the observation has none, Jaccard when neither
has any, the length ratio when the action has no characters. A threshold test on an undefined
metric never matches, so an observation without words ("", "{}", "---") is `other` (keep ratio 1:
it has next to no tokens to mask), and an action without words is judged on novelty and length.
"""

import re
from dataclasses import dataclass

from pipeline.config.score import ScoreConfig

# Bump when the tokenisation, a metric or a signature changes: every stored score is recomputed.
SCORER_VERSION = "1"

WORD = re.compile(r"\w+")
WORD_SQL = r"[\pL\pN_]+"


def fold_case(text: str) -> str:
    """Lower-case character by character. `str.lower()` maps a word-final capital sigma to `ς` and
    `İ` to `i` + a combining dot; DuckDB's `lower()` (and Unicode's simple mapping) gives `σ` and `i`."""
    return text.replace("Σ", "σ").replace("İ", "i").lower()


def word_set(text: str) -> frozenset[str]:
    return frozenset(WORD.findall(fold_case(text)))


@dataclass(frozen=True, slots=True)
class TurnMetrics:
    overlap: float | None  # OL  = |A ∩ O| / |A|
    novelty: float | None  # Nov = |O \ A| / |O|
    jaccard: float | None  # Jac = |A ∩ O| / |A ∪ O|
    length_ratio: float | None  # R = characters(observation) / characters(action)
    observation_chars: int


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def turn_metrics(action: str, observation: str) -> TurnMetrics:
    a, o = word_set(action), word_set(observation)
    shared = len(a & o)
    return TurnMetrics(
        overlap=_ratio(shared, len(a)),
        novelty=_ratio(len(o) - shared, len(o)),
        jaccard=_ratio(shared, len(a) + len(o) - shared),
        length_ratio=_ratio(len(observation), len(action)),
        observation_chars=len(observation),
    )


def _at_least(value: float | None, bound: float) -> bool:
    return value is not None and value >= bound


def _below(value: float | None, bound: float) -> bool:
    return value is not None and value < bound


def _above(value: float | None, bound: float) -> bool:
    return value is not None and value > bound


def _at_most(value: float | None, bound: float) -> bool:
    return value is not None and value <= bound


def matches(category: str, m: TurnMetrics, c: ScoreConfig) -> bool:
    """Whether a turn's metrics carry one category's signature (SPEC.md's table)."""
    if category == "echo":
        return (
            _at_least(m.overlap, c.echo_overlap_min)
            and _below(m.novelty, c.echo_novelty_max)
            and (c.echo_jaccard_min is None or _at_least(m.jaccard, c.echo_jaccard_min))
        )
    if category == "boilerplate":
        return _at_least(m.overlap, c.boilerplate_overlap_min) and _below(m.novelty, c.boilerplate_novelty_max)
    if category == "transform":
        return _below(m.novelty, c.transform_novelty_max) and _below(m.length_ratio, c.transform_ratio_max)
    if category == "expansion":
        return (
            _at_least(m.overlap, c.expansion_overlap_min)
            and _at_least(m.novelty, c.expansion_novelty_min)
            and _above(m.length_ratio, c.expansion_ratio_min)
        )
    if category == "retrieval":
        return _at_least(m.novelty, c.retrieval_novelty_min) and _above(m.length_ratio, c.retrieval_ratio_min)
    if category == "action":
        short = m.observation_chars <= c.short_observation_chars
        return _at_least(m.novelty, c.action_novelty_min) and (_at_most(m.length_ratio, c.action_ratio_max) or short)
    if category == "other":
        return True
    raise ValueError(f"unknown category {category!r}")


def categorize(m: TurnMetrics, c: ScoreConfig) -> str:
    """The first category in `c.precedence` whose signature matches."""
    return next(category for category in c.precedence if matches(category, m, c))


@dataclass(frozen=True, slots=True)
class TurnScore:
    metrics: TurnMetrics
    category: str
    keep_ratio: float


def score_turn(action: str, observation: str, c: ScoreConfig) -> TurnScore:
    metrics = turn_metrics(action, observation)
    category = categorize(metrics, c)
    return TurnScore(metrics, category, c.keep_ratios.of(category))


# --- The same definition as one DuckDB statement -------------------------------------------------


def _number(value: float) -> str:
    """A DOUBLE literal: `0.7` alone would be a DECIMAL in DuckDB; repr() round-trips exactly."""
    return f"CAST('{float(value)!r}' AS DOUBLE)"


def _signature_sql(category: str, c: ScoreConfig) -> str:
    """SQL condition of one signature. Comparisons with NULL are NULL, and CASE takes NULL as no
    match: an undefined metric never matches, as in `matches`."""
    n = _number
    if category == "echo":
        jaccard = "" if c.echo_jaccard_min is None else f" AND jaccard >= {n(c.echo_jaccard_min)}"
        return f"overlap >= {n(c.echo_overlap_min)} AND novelty < {n(c.echo_novelty_max)}{jaccard}"
    if category == "boilerplate":
        return f"overlap >= {n(c.boilerplate_overlap_min)} AND novelty < {n(c.boilerplate_novelty_max)}"
    if category == "transform":
        return f"novelty < {n(c.transform_novelty_max)} AND length_ratio < {n(c.transform_ratio_max)}"
    if category == "expansion":
        return (
            f"overlap >= {n(c.expansion_overlap_min)} AND novelty >= {n(c.expansion_novelty_min)} "
            f"AND length_ratio > {n(c.expansion_ratio_min)}"
        )
    if category == "retrieval":
        return f"novelty >= {n(c.retrieval_novelty_min)} AND length_ratio > {n(c.retrieval_ratio_min)}"
    if category == "action":
        return (
            f"novelty >= {n(c.action_novelty_min)} AND (coalesce(length_ratio <= {n(c.action_ratio_max)}, false) "
            f"OR observation_chars <= {int(c.short_observation_chars)})"
        )
    if category == "other":
        return "true"
    raise ValueError(f"unknown category {category!r}")


def scores_sql(turns: str, c: ScoreConfig) -> str:
    """SELECT trajectory_id, turn_index, overlap, novelty, jaccard, length_ratio, category, keep_ratio
    for every row of `turns` (a relation with trajectory_id, turn_index, action, observation).

    Word sets are lists of distinct words, MATERIALIZED: otherwise the optimizer may inline them into
    each use and extract every observation's words three times (it did, under the score stage's
    anti-join: 1.6x the CPU). The shared count filters the action's (short) list against the
    observation's with a linear `list_contains`, far cheaper than `list_intersect`'s hash table for
    typical turns; past 20,000 comparisons (a file edit against a long listing) `list_intersect`
    avoids the quadratic cost. Both give the same count."""
    categories = "\n".join(f"            WHEN {_signature_sql(cat, c)} THEN '{cat}'" for cat in c.precedence)
    ratios = "\n".join(f"            WHEN '{cat}' THEN {_number(c.keep_ratios.of(cat))}" for cat in c.precedence)
    return f"""
    WITH words AS MATERIALIZED (
        SELECT trajectory_id, turn_index,
               list_distinct(regexp_extract_all(lower(action), '{WORD_SQL}')) AS a,
               list_distinct(regexp_extract_all(lower(observation), '{WORD_SQL}')) AS o,
               length(action) AS action_chars, length(observation) AS observation_chars
        FROM {turns}
    ), counts AS (
        SELECT trajectory_id, turn_index, action_chars, observation_chars,
               len(a) AS na, len(o) AS no,
               CASE WHEN len(a) * len(o) <= 20000
                    THEN len(list_filter(a, lambda w: list_contains(o, w)))
                    ELSE len(list_intersect(a, o)) END AS shared
        FROM words
    ), metrics AS (
        SELECT trajectory_id, turn_index, observation_chars,
               CASE WHEN na > 0 THEN shared::DOUBLE / na END AS overlap,
               CASE WHEN no > 0 THEN (no - shared)::DOUBLE / no END AS novelty,
               CASE WHEN na + no - shared > 0 THEN shared::DOUBLE / (na + no - shared) END AS jaccard,
               CASE WHEN action_chars > 0 THEN observation_chars::DOUBLE / action_chars END AS length_ratio
        FROM counts
    ), categorized AS (
        SELECT *,
            CASE
{categories}
            END AS category
        FROM metrics
    )
    SELECT trajectory_id, turn_index, overlap, novelty, jaccard, length_ratio, category,
        CASE category
{ratios}
        END AS keep_ratio
    FROM categorized"""
