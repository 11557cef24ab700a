"""Parquet snapshots of what training needs, so a training run never holds the DuckDB file.

DuckDB admits one writer and no reader beside it (STACK.md): a training run that kept the store
open for hours would block nightly ingestion. The stage exports its pools once, in one short
read, into a folder named by the pools' fingerprint, closes the store, and trains from the files.
"""

import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.split import POOLS
from pipeline.errors import UserFixableError
from pipeline.store.schema import ScoredTurn, SystemPrompt, system_prompt_from_row

TRAJECTORIES_FILE = "trajectories.parquet"
TURNS_FILE = "turns.parquet"
# An eval-pool turn needs no score (it is measured with keep ratio 1); it is tallied under this name.
UNSCORED = "unscored"


class MissingScores(UserFixableError):
    """Turns of a training pool without a current keep ratio: `simulacra score` has not run on them
    since they were kept, or since the `score` section or the scorer changed."""


@dataclass(slots=True)
class PoolTrajectory:
    trajectory_id: str
    domain: str
    system: SystemPrompt
    turns: list[ScoredTurn]


def _pool_list(pools: Sequence[str]) -> str:
    unknown = [p for p in pools if p not in POOLS]
    if unknown:
        raise ValueError(f"unknown pool(s) {unknown}; pools are {', '.join(POOLS)}")
    return ", ".join(f"'{p}'" for p in pools)


def pool_turns_sql(pools: Sequence[str]) -> str:
    """Kept turns of the pools' trajectories with their score (NULL where unscored)."""
    return f"""SELECT s.pool, u.trajectory_id, u.turn_index, u.action, u.observation, c.category, c.keep_ratio
        FROM kept_turns u
        JOIN splits s USING (trajectory_id)
        LEFT JOIN turn_scores c USING (trajectory_id, turn_index)
        WHERE s.pool IN ({_pool_list(pools)})"""


def pools_fingerprint(store, pools: Sequence[str]) -> str:
    """Changes when a turn enters or leaves the pools or its score changes (trajectory ids are
    content hashes, so the text itself cannot change under the same id)."""
    relation = f"({pool_turns_sql(pools)}) AS pool_turns"
    return store.table_fingerprint(relation, "pool, trajectory_id, turn_index, category, keep_ratio")


def require_scores(store, pool: str, score_config_hash: str, scorer_version: str) -> None:
    """Every kept turn of `pool` has exactly one row in turn_scores, computed under the current `score`
    section (`score_config_hash`, i.e. `config.section_hash("score")`) and `scorer_version` (the
    informativeness scorer's SCORER_VERSION, passed in: the store knows no scorer); else a
    MissingScores naming a turn that has not and the fix. A row of an older config is stale: its keep
    ratio is not the one configured (issue 13: `--set score.keep_ratios.echo=0.9 cpt` trained on the
    old ratios)."""
    per_turn = """SELECT u.trajectory_id, u.turn_index, count(c.trajectory_id) AS scores,
            count(*) FILTER (WHERE c.config_hash = $config_hash AND c.scorer_version = $scorer_version) AS current,
            any_value(c.config_hash || ', scorer ' || c.scorer_version) AS scored_under
        FROM kept_turns u
        JOIN splits s USING (trajectory_id)
        LEFT JOIN turn_scores c USING (trajectory_id, turn_index)
        WHERE s.pool = $pool
        GROUP BY u.trajectory_id, u.turn_index"""
    found = store.connection.execute(
        f"""SELECT count(*) FILTER (WHERE scores = 0) AS missing,
                   arg_min(trajectory_id || ' turn ' || turn_index, (trajectory_id, turn_index))
                       FILTER (WHERE scores = 0),
                   count(*) FILTER (WHERE scores = 1 AND current = 0) AS stale,
                   arg_min(trajectory_id || ' turn ' || turn_index || ' (config ' || scored_under || ')',
                           (trajectory_id, turn_index)) FILTER (WHERE scores = 1 AND current = 0),
                   count(*) FILTER (WHERE scores > 1) AS doubled,
                   arg_min(trajectory_id || ' turn ' || turn_index || ': ' || scores || ' rows',
                           (trajectory_id, turn_index)) FILTER (WHERE scores > 1)
            FROM ({per_turn})""",
        {"pool": pool, "config_hash": score_config_hash, "scorer_version": scorer_version},
    ).fetchone()
    missing, missing_example, stale, stale_example, doubled, doubled_example = found
    if missing:
        raise MissingScores(
            f"{missing} turn(s) of pool '{pool}' have no row in turn_scores (e.g. trajectory {missing_example}): "
            "run `simulacra score` first"
        )
    if stale:
        raise MissingScores(
            f"{stale} turn(s) of pool '{pool}' were scored under another `score` config or scorer version (e.g. "
            f"trajectory {stale_example}; now config {score_config_hash}, scorer {scorer_version}): "
            "run `simulacra score` to apply the current keep ratios"
        )
    if doubled:
        raise MissingScores(
            f"turn_scores holds more than one row for {doubled} turn(s) of pool '{pool}' (e.g. trajectory "
            f"{doubled_example}); expected one per turn: rerun `simulacra score`"
        )


def pool_size(store, pool: str) -> int:
    return store.scalar(f"SELECT count(DISTINCT trajectory_id) FROM ({pool_turns_sql([pool])}) AS p")


def target_turns(store, pool: str) -> list[tuple[str, int]]:
    """(trajectory, turn) of the pool's target turns whose trajectory is still in that pool."""
    rows = store.execute(
        "SELECT t.trajectory_id, t.turn_index FROM targets t JOIN splits s USING (trajectory_id) "
        "WHERE t.pool = ? AND s.pool = ? ORDER BY 1, 2",
        [pool, pool],
    ).fetchall()
    return [(trajectory_id, turn_index) for trajectory_id, turn_index in rows]


def export_snapshot(store, out_dir: Path, pools: Sequence[str]) -> Path:
    """Write the pools' trajectories and turns to `out_dir` (created whole, or not at all)."""
    if (out_dir / TURNS_FILE).is_file():
        return out_dir
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    trajectories = f"""SELECT s.pool, t.trajectory_id, t.domain, t.task_description, t.action_space,
            CAST(t.tools AS VARCHAR) AS tools, t.initial_state, t.demonstrations, t.simulation_instructions
        FROM kept_trajectories t JOIN splits s USING (trajectory_id)
        WHERE s.pool IN ({_pool_list(pools)}) ORDER BY t.trajectory_id"""
    turns = f"SELECT * FROM ({pool_turns_sql(pools)}) AS p ORDER BY trajectory_id, turn_index"
    for query, name in ((trajectories, TRAJECTORIES_FILE), (turns, TURNS_FILE)):
        target = str(partial / name).replace("'", "''")
        store.execute(f"COPY ({query}) TO '{target}' (FORMAT parquet)")
    partial.rename(out_dir)
    return out_dir


def _rows(path: Path, pool: str) -> Iterator[dict]:
    """The rows of one pool from a snapshot file, in file order, a batch in memory at a time."""
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=2048):
        for row in batch.to_pylist():
            if row["pool"] == pool:
                yield row


def read_pool(snapshot_dir: Path, pool: str) -> Iterator[PoolTrajectory]:
    """The pool's trajectories from a snapshot, turns in order; a turn without a score (eval pool)
    gets category `unscored` and keep ratio 1. Both files are sorted by trajectory id, so this is a
    streaming merge: memory holds one trajectory, not the pool."""
    turns = _rows(snapshot_dir / TURNS_FILE, pool)
    pending = next(turns, None)
    for row in _rows(snapshot_dir / TRAJECTORIES_FILE, pool):
        scored = []
        while pending is not None and pending["trajectory_id"] < row["trajectory_id"]:
            pending = next(turns, None)  # a turn whose trajectory is not in the file: nothing to join
        while pending is not None and pending["trajectory_id"] == row["trajectory_id"]:
            scored.append(
                ScoredTurn(
                    turn_index=pending["turn_index"],
                    action=pending["action"],
                    observation=pending["observation"],
                    category=pending["category"] or UNSCORED,
                    keep_ratio=1.0 if pending["keep_ratio"] is None else float(pending["keep_ratio"]),
                )
            )
            pending = next(turns, None)
        if scored:
            yield PoolTrajectory(row["trajectory_id"], row["domain"], system_prompt_from_row(row), scored)
