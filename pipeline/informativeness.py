"""Turn informativeness (SPEC.md, Qwen-AgentWorld): word sets, four metrics, a category, a keep ratio.

Two renderings of one definition live here side by side, so that a change to one is made to the
other in the same edit (and `SCORER_VERSION` bumped):
- the per-turn Python functions (`word_set`, `turn_metrics`, `categorize`, `score_turn`): the
  readable specification, used by the tests and as the baseline of bench/score.py;
- `score_frame`: the same computation as polars expressions over a frame of turns, which
  `stages/score.py` runs on every kept turn, a chunk at a time. tests/test_informativeness.py
  checks the two agree on thousands of random turns, and their words on every code point.

Tokenisation. A word is a maximal run of Unicode letters, numbers and underscores, after
lower-casing; everything else (whitespace, punctuation, symbols, combining marks) separates words.
So `{"user_id": 42}` has the words {user_id, 42}; `src/app/main.py` has {src, app, main, py};
`2024-05-15` has {2024, 05, 15}; `don't` has {don, t}; a punctuation-only text has none. Splitting
paths and dotted names lets `cat src/app/main.py` overlap an observation that cites `main.py:12`,
and keeps a sentence's final period off its last word. Lower-casing is per character (Unicode's
simple case mapping): `str.lower()` and Rust's `to_lowercase()` (polars) differ from it on two
characters only, a word-final `Σ` and `İ`, mapped before either is called (see `fold_case`).
Python 3.11's `\\w` (Unicode 14) and the regex crate's `[\\p{L}\\p{N}_]` (Unicode 16 in polars
2.1) agree on every code point Python knows; 9,394 code points first assigned after Unicode 14
(CJK extension H, Kawi, Garay, ...) are letters or numbers in the bulk path and separators in
`word_set`.

Thoughts. A turn whose adapter marked it as the agent thinking aloud (metadata kind `thought`,
schema.THOUGHT: ReAct's `think:`, answered "OK." by the harness) gets the category `thought`,
whatever its metrics, and that category's keep ratio (0 by default): the metrics are still stored.

Repeats. A turn whose observation equals the previous kept turn's of its trajectory, character for
character (the empty output of a second silent command included), gets the category `repeat` and its
keep ratio, after `thought` and before any signature: the metrics are still stored. The previous
observation is the caller's to give (`previous_observation`; the score stage reads it with the turn).

Edge cases. A metric whose denominator is empty is undefined and stored as NULL (None):
overlap when the action has no words, novelty when the observation has none, Jaccard when neither
has any, the length ratio when the action has no characters. A threshold test on an undefined
metric never matches, so an observation without words ("", "{}", "---") is `other` (keep ratio 1:
it has next to no tokens to mask), and an action without words is judged on novelty and length.
"""

import re
from dataclasses import dataclass

import polars as pl

from pipeline.config.score import REPEAT, ScoreConfig
from pipeline.store.schema import THOUGHT

# Bump when the tokenisation, a metric, a signature or a category changes: every stored score is
# recomputed. 2: the `thought` category; 3: the `repeat` category.
SCORER_VERSION = "3"
# The columns of a scored turn, in `turn_scores` order (before the version and config tags).
SCORE_COLUMNS = [
    "trajectory_id",
    "turn_index",
    "overlap",
    "novelty",
    "jaccard",
    "length_ratio",
    "category",
    "keep_ratio",
]

WORD = re.compile(r"\w+")
WORD_RUST = r"[\p{L}\p{N}_]+"  # the same class in the syntax of the regex crate (polars)


def fold_case(text: str) -> str:
    """Lower-case character by character. `str.lower()` maps a word-final capital sigma to `ς` and
    `İ` to `i` + a combining dot; Unicode's simple mapping gives `σ` and `i`, whatever the context,
    so that a word's lower case does not depend on its neighbours. `word_lists` does the same."""
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


def score_turn(
    action: str, observation: str, c: ScoreConfig, kind: str | None = None, previous_observation: str | None = None
) -> TurnScore:
    """`kind` is the turn's metadata kind: a thought is `thought` whatever its metrics.
    `previous_observation` is the one before it in its trajectory (None for the first turn): an equal
    observation is `repeat`."""
    metrics = turn_metrics(action, observation)
    if kind == THOUGHT:
        category = THOUGHT
    elif observation == previous_observation:
        category = REPEAT
    else:
        category = categorize(metrics, c)
    return TurnScore(metrics, category, c.keep_ratios.of(category))


# --- The same definition as polars expressions over a frame of turns ----------------------------


def word_lists(text: pl.Expr) -> pl.Expr:
    """Each text's words in order, repeats included: `word_set` as a polars expression. Rust's
    `to_lowercase()` maps `Σ` and `İ` as `str.lower()` does: `fold_case`'s replacements come first."""
    return text.str.replace_many(["Σ", "İ"], ["σ", "i"]).str.to_lowercase().str.extract_all(WORD_RUST)


def _ratio_expr(numerator: pl.Expr, denominator: pl.Expr) -> pl.Expr:
    """`_ratio` in polars: null where the denominator is 0."""
    return pl.when(denominator > 0).then(numerator / denominator)


def _signature(category: str, c: ScoreConfig) -> pl.Expr:
    """Polars condition of one signature, as `matches` says. A comparison with an undefined (null)
    metric is null, and `fill_null(False)` makes it no match, as `_at_least` & co. do."""
    overlap, novelty, jaccard, ratio = (pl.col(name) for name in ("overlap", "novelty", "jaccard", "length_ratio"))

    def holds(condition: pl.Expr) -> pl.Expr:
        return condition.fill_null(False)

    if category == "echo":
        echo = holds(overlap >= c.echo_overlap_min) & holds(novelty < c.echo_novelty_max)
        return echo if c.echo_jaccard_min is None else echo & holds(jaccard >= c.echo_jaccard_min)
    if category == "boilerplate":
        return holds(overlap >= c.boilerplate_overlap_min) & holds(novelty < c.boilerplate_novelty_max)
    if category == "transform":
        return holds(novelty < c.transform_novelty_max) & holds(ratio < c.transform_ratio_max)
    if category == "expansion":
        return (
            holds(overlap >= c.expansion_overlap_min)
            & holds(novelty >= c.expansion_novelty_min)
            & holds(ratio > c.expansion_ratio_min)
        )
    if category == "retrieval":
        return holds(novelty >= c.retrieval_novelty_min) & holds(ratio > c.retrieval_ratio_min)
    if category == "action":
        short = pl.col("observation_chars") <= c.short_observation_chars
        return holds(novelty >= c.action_novelty_min) & (holds(ratio <= c.action_ratio_max) | short)
    if category == "other":
        return pl.lit(True)
    raise ValueError(f"unknown category {category!r}")


def _scores(turns: pl.LazyFrame, c: ScoreConfig) -> pl.LazyFrame:
    """Word lists are one step and the counts the next, so that each text is tokenised once."""
    words = turns.select(
        "trajectory_id",
        "turn_index",
        thought=(pl.col("kind") == THOUGHT).fill_null(False),
        repeat=(pl.col("observation") == pl.col("previous_observation")).fill_null(False),
        action=word_lists(pl.col("action")),
        observation=word_lists(pl.col("observation")),
        action_chars=pl.col("action").str.len_chars(),
        observation_chars=pl.col("observation").str.len_chars(),
    )
    counts = words.select(
        "trajectory_id",
        "turn_index",
        "thought",
        "repeat",
        "action_chars",
        "observation_chars",
        action_words=pl.col("action").list.n_unique(),
        observation_words=pl.col("observation").list.n_unique(),
        shared=pl.col("action").list.set_intersection(pl.col("observation")).list.len(),
    )
    a, o, shared = pl.col("action_words"), pl.col("observation_words"), pl.col("shared")
    metrics = counts.select(
        "trajectory_id",
        "turn_index",
        "thought",
        "repeat",
        "observation_chars",
        overlap=_ratio_expr(shared, a),
        novelty=_ratio_expr(o - shared, o),
        jaccard=_ratio_expr(shared, a + o - shared),
        length_ratio=_ratio_expr(pl.col("observation_chars"), pl.col("action_chars")),
    )
    category = pl.when(pl.col("thought")).then(pl.lit(THOUGHT)).when(pl.col("repeat")).then(pl.lit(REPEAT))
    for name in c.precedence:
        category = category.when(_signature(name, c)).then(pl.lit(name))
    keep_ratios = {name: c.keep_ratios.of(name) for name in (*c.precedence, THOUGHT, REPEAT)}
    return (
        metrics.with_columns(category=category)
        .with_columns(keep_ratio=pl.col("category").replace_strict(keep_ratios, return_dtype=pl.Float64))
        .select(SCORE_COLUMNS)
    )


def score_frame(turns: pl.DataFrame, c: ScoreConfig) -> pl.DataFrame:
    """trajectory_id, turn_index, overlap, novelty, jaccard, length_ratio, category, keep_ratio for
    every row of `turns` (trajectory_id, turn_index, action, observation, kind: the turn's metadata
    kind or null, and previous_observation: the observation before it in its trajectory, null for a
    first turn; a frame without that column has no repeats), as `score_turn` computes them. Polars
    runs a string expression over one column on one core: the frame is cut into a slice per polars
    thread, and the slices are scored together."""
    if "previous_observation" not in turns.columns:
        turns = turns.with_columns(previous_observation=pl.lit(None, dtype=pl.String))
    size = max(1, -(-turns.height // pl.thread_pool_size()))
    slices = list(turns.iter_slices(size)) or [turns]
    return pl.concat(pl.collect_all([_scores(part.lazy(), c) for part in slices]))
