"""Filter: judge trajectories with SPEC.md's rules and record every drop with its rule and reason.

Nothing is deleted from `trajectories` or `turns`: a drop is a `filter_decisions` row (turn_index
NULL for a whole trajectory), a judged trajectory a `filter_state` row, and the `kept_trajectories`
/ `kept_turns` views read through them.

- Set-based: the rules' SQL forms judge every unjudged trajectory at once, inside DuckDB
  (pipeline/filters/judging.py); Python sees only the few observations a pattern could match.
- Incremental: only trajectories without a `filter_state` row are judged, so the nightly refresh
  judges just what ingest added, and a rerun with nothing new adds no row.
- Resumable: a batch's decisions and states are written in one transaction; a killed run leaves
  whole batches, and the rerun judges the rest.
- A changed `filter` section (its hash differs from the one in `filter_state`) invalidates every
  decision: all decisions and states are deleted in one transaction, then everything is judged
  again under the new hash. The views never mix two configurations: between the two they show
  fewer trajectories, never stale ones.
"""

import time
from typing import Any

import duckdb

from pipeline.config import SimulacraConfig
from pipeline.filters import build_rules
from pipeline.filters.judging import TURN_DROPS, VERDICTS, drop_judging_tables, judge_unjudged
from pipeline.orchestration.faults import maybe_fail
from pipeline.progress import progress_bar
from pipeline.stage import StageResult
from pipeline.store.database import Store
from pipeline.store.prerequisites import require_ingested

# Judging is one set-based pass; batches only bound what a killed run loses while the verdicts
# are written, each a transaction of two INSERT ... SELECT.
DEFAULT_BATCH_TRAJECTORIES = 20_000


def run(config: SimulacraConfig, store: Store, batch_trajectories: int = DEFAULT_BATCH_TRAJECTORIES) -> StageResult:
    require_ingested(store)
    config_hash = config.section_hash("filter")
    rules = build_rules(config.filter)
    started = time.perf_counter()
    reset = reset_if_config_changed(store, config_hash)
    con = store.connection
    try:
        with progress_bar("filter: judging", total=None):
            batches = judge_unjudged(con, rules, batch_trajectories)
        tally = _tally(con)
        with progress_bar("filter", total=tally["judged"]) as advance:
            for batch in range(batches):
                write_batch(store, batch, config_hash)
                advance(store.scalar(f"SELECT count(*) FROM {VERDICTS} WHERE batch = ?", [batch]))
                maybe_fail(config, "filter", f"after committing batch {batch + 1} of {batches}")
    finally:
        drop_judging_tables(con)
    seconds = time.perf_counter() - started
    # The store's judgements, this run's and earlier runs' (a resumed or incremental run judges only the rest): what a
    # stage skipped later shows, so its recorded line must not read as if nothing had been kept.
    in_all, kept_in_all = store.execute("SELECT count(*), count(*) FILTER (WHERE kept) FROM filter_state").fetchone()  # type: ignore[misc]  # an aggregate: one row
    metrics: dict[str, Any] = {
        **tally,
        "judged_in_all": in_all,
        "kept_in_all": kept_in_all,
        "rejudged": reset,
        "config_hash": config_hash,
        "seconds": round(seconds, 3),
        "turns_per_s": round(tally["turns"] / seconds) if seconds > 0 else None,
    }
    judged, kept = tally["judged"], tally["kept"]
    summary = (
        f"judged {judged} trajectories ({tally['turns']} turns): kept {kept}, "
        f"dropped {judged - kept}; {tally['dropped_turns']} turns removed by turn rules"
    )
    if in_all != judged:
        summary += f"; in all {in_all} judged, {kept_in_all} kept, {in_all - kept_in_all} dropped"
    if reset:
        summary += f" (filter config changed: {reset} earlier judgements discarded and re-judged)"
    return StageResult("filter", metrics=metrics, summary=summary, tables={"filter-drops": drops_by_rule(store)})


def _tally(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    judged, kept, turns, kept_turns = con.execute(  # type: ignore[misc]  # an aggregate: one row
        "SELECT count(*), count(*) FILTER (WHERE kept), coalesce(sum(turns), 0), coalesce(sum(kept_turns), 0) "
        f"FROM {VERDICTS}"
    ).fetchone()
    by_rule = con.execute(
        f"""
        SELECT rule, count(*) FROM (
            SELECT rule FROM {TURN_DROPS} UNION ALL SELECT rule FROM {VERDICTS} WHERE NOT kept
        ) GROUP BY rule ORDER BY rule
        """
    ).fetchall()
    return {
        "judged": judged,
        "kept": kept,
        "dropped": judged - kept,
        "turns": int(turns),
        "kept_turns": int(kept_turns),
        "dropped_turns": con.execute(f"SELECT count(*) FROM {TURN_DROPS}").fetchone()[0],  # type: ignore[index]  # one row
        "by_rule": dict(by_rule),
    }


def reset_if_config_changed(store: Store, config_hash: str) -> int:
    """Delete every decision and state when any was made under another config; returns how many
    trajectories had been judged under it (0 when nothing changed)."""
    stale = store.scalar("SELECT count(*) FROM filter_state WHERE config_hash <> ?", [config_hash])
    stale_decisions = store.scalar(
        "SELECT EXISTS (SELECT 1 FROM filter_decisions WHERE config_hash <> ?)", [config_hash]
    )
    if not stale and not stale_decisions:
        return 0
    with store.transaction() as con:
        con.execute("DELETE FROM filter_decisions")
        con.execute("DELETE FROM filter_state")
    return stale


def write_batch(store: Store, batch: int, config_hash: str) -> None:
    """One batch's decisions and states, all or nothing."""
    with store.transaction() as tx:
        insert_decisions(tx, batch, config_hash)
        insert_states(tx, batch, config_hash)


def insert_decisions(tx: duckdb.DuckDBPyConnection, batch: int, config_hash: str) -> None:
    tx.execute(
        f"""
        INSERT INTO filter_decisions
        SELECT trajectory_id, turn_index, rule, reason, $hash, now() FROM {TURN_DROPS}
        SEMI JOIN (SELECT trajectory_id FROM {VERDICTS} WHERE batch = $batch) USING (trajectory_id)
        UNION ALL
        SELECT trajectory_id, NULL, rule, reason, $hash, now() FROM {VERDICTS} WHERE batch = $batch AND NOT kept
        """,
        {"hash": config_hash, "batch": batch},
    )


def insert_states(tx: duckdb.DuckDBPyConnection, batch: int, config_hash: str) -> None:
    # kept_turns: the turns the kept_turns view shows for it, none when the trajectory is dropped.
    tx.execute(
        f"INSERT INTO filter_state SELECT trajectory_id, ?, kept, kept_turns FROM {VERDICTS} WHERE batch = ?",
        [config_hash, batch],
    )


def drops_by_rule(store: Store) -> list[dict[str, Any]]:
    """Drops per rule, source and domain. Each turn is counted once: under the turn rule that
    removed it, or else under the trajectory rule that dropped the rest of its trajectory.
    `trajectories` counts trajectories that rule touched."""
    return store.rows(
        """
        WITH removed AS (
            SELECT trajectory_id, count(*) AS turns FROM filter_decisions
            WHERE turn_index IS NOT NULL GROUP BY trajectory_id
        )
        SELECT d.rule, t.source, t.domain,
               count(DISTINCT d.trajectory_id) AS trajectories,
               sum(CASE WHEN d.turn_index IS NULL THEN t.num_turns - coalesce(r.turns, 0) ELSE 1 END) AS turns
        FROM filter_decisions d
        JOIN trajectories t USING (trajectory_id)
        LEFT JOIN removed r USING (trajectory_id)
        GROUP BY d.rule, t.source, t.domain
        ORDER BY d.rule, t.source, t.domain
        """
    )
