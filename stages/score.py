"""`simulacra score`: the informativeness metrics, category and keep ratio of every kept turn.

`turn_scores` mirrors `kept_turns` under one (scorer version, config hash), in one transaction:
1. rows of another scorer version or score config are deleted (a changed table replaces them all);
2. rows of turns no longer kept are deleted (a trajectory or turn the filter dropped since keeps no
   stale score: the filter's decisions say why it went, and it is rescored if it comes back), and
   rows whose `repeat` no longer holds or newly holds, a turn before them dropped or restored;
3. kept turns without a row are scored by polars (`score_frame`, pipeline/informativeness.py), a
   chunk of `CHUNK_TURNS` at a time, and each chunk's scores are inserted before the next is read:
   memory holds one chunk's word lists, whatever the size of the store.
A rerun with nothing new computes nothing; a killed run leaves the table as it was.

DuckDB runs no other statement on a connection while a result is being read from it, so the turns
are read through a second connection (`cursor()`) while this one inserts. That connection sees the
store as last committed, where the rows step 1 deleted are still present: "unscored" is therefore
"without a score of this scorer version and config", the same set with or without those rows.
"""

from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from pipeline.config import SimulacraConfig
from pipeline.config.score import CATEGORIES, REPEAT
from pipeline.informativeness import SCORER_VERSION, score_frame
from pipeline.orchestration.faults import maybe_fail
from pipeline.plots import share_bars
from pipeline.stage import StageResult
from pipeline.store.database import Store
from pipeline.store.prerequisites import require_filtered
from pipeline.store.schema import THOUGHT

STAGE = "score"

# Turns per chunk, at most. A chunk's text and word lists are what the stage holds: scoring
# bench/score.py's 1M turns of 500 characters peaks at 1.5 GB resident with 50,000-turn chunks and
# 1.7 GB with these, most of it DuckDB's cache of the store; the time is the same.
CHUNK_TURNS = 200_000

# Kept turns with the observation of the kept turn before each (a dropped retry is not in the context the
# model trains on), read before any filter on turns so that a first unscored turn still has it.
KEPT_WITH_PREVIOUS = """SELECT trajectory_id, turn_index, action, observation,
        json_extract_string(metadata, '$.kind') AS kind,
        lag(observation) OVER (PARTITION BY trajectory_id ORDER BY turn_index) AS previous_observation
    FROM kept_turns"""

# Whether stored score `s` of kept turn `k` still says rightly whether `k` repeats the turn before it.
REPEAT_CURRENT = """(k.kind IS NOT DISTINCT FROM $thought
    OR (s.category = $repeat) = coalesce(k.observation = k.previous_observation, false))"""

# A stale repeat counts as unscored: the reading connection still sees the row STALE_REPEATS deleted.
UNSCORED = f"""SELECT k.* FROM ({KEPT_WITH_PREVIOUS}) k
    WHERE NOT EXISTS (SELECT 1 FROM turn_scores s
                      WHERE s.trajectory_id = k.trajectory_id AND s.turn_index = k.turn_index
                        AND s.scorer_version = $scorer_version AND s.config_hash = $config_hash
                        AND {REPEAT_CURRENT})"""


STALE_REPEATS = f"""DELETE FROM turn_scores s WHERE EXISTS (SELECT 1 FROM ({KEPT_WITH_PREVIOUS}) k
    WHERE k.trajectory_id = s.trajectory_id AND k.turn_index = s.turn_index AND NOT {REPEAT_CURRENT})"""
# The categories REPEAT_CURRENT names, as the query parameters $thought and $repeat.
CATEGORY_NAMES = {"thought": THOUGHT, "repeat": REPEAT}


def _count(cursor: Any) -> int:
    """The row count a DELETE or INSERT returns, read to the end: DuckDB 2 refuses some statements on
    a connection whose last result is unfinished."""
    rows = cursor.fetchall()
    return int(rows[0][0]) if rows else 0


def _score_unscored(tx: duckdb.DuckDBPyConnection, config: SimulacraConfig, config_hash: str) -> int:
    """Scores every unscored kept turn, a chunk at a time, into `turn_scores`; returns how many."""
    scored = 0
    with tx.cursor() as reader:
        unscored = reader.sql(
            UNSCORED, params={"scorer_version": SCORER_VERSION, "config_hash": config_hash, **CATEGORY_NAMES}
        )
        for turns in unscored.to_arrow_reader(CHUNK_TURNS):
            scores = score_frame(pl.from_arrow(turns), config.score)  # type: ignore[arg-type]  # a batch makes a DataFrame
            tx.register("chunk_scores", scores)
            scored += _count(
                tx.execute(
                    """INSERT INTO turn_scores (trajectory_id, turn_index, overlap, novelty, jaccard, length_ratio,
                                                 category, keep_ratio, scorer_version, config_hash)
                       SELECT *, ?, ? FROM chunk_scores""",
                    [SCORER_VERSION, config_hash],
                )
            )
            tx.unregister("chunk_scores")
    return scored


def run(config: SimulacraConfig, store: Store) -> StageResult:
    require_filtered(store)
    config_hash = config.section_hash(STAGE)
    with store.transaction() as tx:
        replaced = _count(
            tx.execute(
                "DELETE FROM turn_scores WHERE scorer_version <> ? OR config_hash <> ?", [SCORER_VERSION, config_hash]
            )
        )
        dropped = _count(
            tx.execute(
                """DELETE FROM turn_scores s WHERE NOT EXISTS (SELECT 1 FROM kept_turns k
                   WHERE k.trajectory_id = s.trajectory_id AND k.turn_index = s.turn_index)"""
            )
        )
        # A turn's repeat depends on the kept turn before it: one dropped or restored since changes it.
        neighbours = _count(tx.execute(STALE_REPEATS, CATEGORY_NAMES))
        scored = _score_unscored(tx, config, config_hash)
    # One transaction holds the stage's work: the drill fails right after it, so a retry must score nothing again.
    maybe_fail(config, STAGE, f"after committing {scored} turn score(s)")
    counts = dict(store.connection.execute("SELECT category, count(*) FROM turn_scores GROUP BY category").fetchall())
    total = sum(counts.values())
    metrics: dict[str, Any] = {
        "turns_scored": scored,
        "scores_replaced": replaced,
        "scores_of_dropped_turns_removed": dropped,
        "scores_of_changed_repeats_removed": neighbours,
        "turns_with_score": total,
        "mean_keep_ratio": store.scalar("SELECT avg(keep_ratio) FROM turn_scores"),
        **{f"category_{name}": counts.get(name, 0) for name in CATEGORIES},
    }
    shares = ", ".join(f"{name} {counts[name] / total:.1%}" for name in CATEGORIES if counts.get(name))
    summary = f"scored {scored} turn(s) ({replaced} old score(s) replaced, {dropped} of dropped turns removed); " + (
        f"{total} scored in all: {shares}" if total else "no kept turn to score"
    )
    report = category_report(store)
    images = (
        {"categories": _plot_categories(report, config.workspace.runs_dir / STAGE / "categories.png")} if total else {}
    )
    return StageResult(stage=STAGE, metrics=metrics, summary=summary, tables={"categories": report}, images=images)


def _plot_categories(report: list[dict[str, Any]], path: Path) -> Path:
    """Share of turns per category, one bar per domain: what the keep ratios will thin."""
    turns: dict[str, dict[str, float]] = {}
    for row in report:
        if row["category"] != "all":
            per_domain = turns.setdefault(row["domain"], {})
            per_domain[row["category"]] = per_domain.get(row["category"], 0) + row["turns"]
    shares = {
        domain: {name: counts[name] / sum(counts.values()) for name in CATEGORIES if name in counts}
        for domain, counts in sorted(turns.items())
    }
    return share_bars(path, "Turn categories per domain", shares, "share of scored turns")


def category_report(store: Store) -> list[dict[str, Any]]:
    """Per domain and source, a row per category and one for all categories (`category` = 'all'):
    turns, their share of the group's turns, observation characters and their share (what the
    category weighs in the CPT corpus), and the mean keep ratio of the row's turns. The 'all' row's
    `kept_char_share` is the fraction of the group's observation characters that count in the loss."""
    return store.rows(
        """
        WITH scored AS (
            SELECT t.domain, t.source, s.category, s.keep_ratio, length(u.observation) AS chars
            FROM turn_scores s
            JOIN turns u USING (trajectory_id, turn_index)
            JOIN trajectories t USING (trajectory_id)
        ), grouped AS (
            SELECT domain, source, coalesce(category, 'all') AS category, count(*) AS turns,
                   sum(chars) AS observation_chars, avg(keep_ratio) AS mean_keep_ratio,
                   sum(chars * keep_ratio) AS kept_chars
            FROM scored GROUP BY GROUPING SETS ((domain, source, category), (domain, source))
        )
        SELECT g.domain, g.source, g.category, g.turns,
               g.turns / a.turns AS turn_share,
               g.observation_chars,
               CASE WHEN a.observation_chars > 0 THEN g.observation_chars / a.observation_chars END AS char_share,
               g.mean_keep_ratio,
               CASE WHEN g.observation_chars > 0 THEN g.kept_chars / g.observation_chars END AS kept_char_share
        FROM grouped g JOIN grouped a ON a.domain = g.domain AND a.source = g.source AND a.category = 'all'
        ORDER BY g.domain, g.source, g.category = 'all', g.turns DESC, g.category
        """
    )
