"""Filter: judge trajectories with SPEC.md's rules and record every drop with its rule and reason.

Nothing is deleted from `trajectories` or `turns`: a drop is a `filter_decisions` row (turn_index
NULL for a whole trajectory), a judged trajectory a `filter_state` row, and the `kept_trajectories`
/ `kept_turns` views read through them.

- Incremental: only trajectories without a `filter_state` row are judged, so the nightly refresh
  judges just what ingest added, and a rerun with nothing new adds no row.
- Resumable: a batch's decisions and states are written in one transaction; a killed run leaves
  whole batches, and the rerun judges the rest.
- A changed `filter` section (its hash differs from the one in `filter_state`) invalidates every
  decision: all decisions and states are deleted in one transaction, then everything is judged
  again under the new hash. The views never mix two configurations: between the two they show
  fewer trajectories, never stale ones.
"""

import gc
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pipeline.config import SimulacraConfig
from pipeline.filters import Verdict, build_rules
from pipeline.filters.loading import count_unjudged, unjudged_batches
from pipeline.progress import progress_bar
from pipeline.stage import StageResult
from pipeline.store import Store

# About 50k turns at 10 turns per trajectory: large enough that a batch's header query, its
# pattern screens and its transaction are cheap next to judging it, small enough that a killed
# run loses seconds.
DEFAULT_BATCH_TRAJECTORIES = 5_000


@dataclass
class Tally:
    judged: int = 0
    kept: int = 0
    turns: int = 0
    kept_turns: int = 0
    dropped_turns: int = 0
    by_rule: Counter = field(default_factory=Counter)

    def add(self, verdict: Verdict, turns: int) -> None:
        self.judged += 1
        self.turns += turns
        self.dropped_turns += len(verdict.turn_drops)
        self.by_rule.update(rule for _, rule, _ in verdict.turn_drops)
        if verdict.kept:
            self.kept += 1
            self.kept_turns += len(verdict.kept_turns)
        else:
            self.by_rule[verdict.trajectory_drop[0]] += 1


def run(config: SimulacraConfig, store: Store, batch_trajectories: int = DEFAULT_BATCH_TRAJECTORIES) -> StageResult:
    config_hash = config.section_hash("filter")
    rules = build_rules(config.filter)
    started = time.perf_counter()
    reset = reset_if_config_changed(store, config_hash)
    tally = Tally()
    with progress_bar("filter", total=count_unjudged(store)) as advance, _collector_paused():
        for batch in unjudged_batches(store, batch_trajectories):
            verdicts = rules.judge_batch([trajectory for _, trajectory in batch])
            judged = [
                (trajectory_id, verdict, len(trajectory.turns))
                for (trajectory_id, trajectory), verdict in zip(batch, verdicts)
            ]
            write_verdicts(store, judged, config_hash)
            for _, verdict, turns in judged:
                tally.add(verdict, turns)
            advance(len(judged))
    seconds = time.perf_counter() - started
    metrics: dict[str, Any] = {
        "judged": tally.judged,
        "kept": tally.kept,
        "dropped": tally.judged - tally.kept,
        "turns": tally.turns,
        "kept_turns": tally.kept_turns,
        "dropped_turns": tally.dropped_turns,
        "by_rule": dict(sorted(tally.by_rule.items())),
        "rejudged": reset,
        "config_hash": config_hash,
        "seconds": round(seconds, 3),
        "turns_per_s": round(tally.turns / seconds) if seconds > 0 else None,
    }
    summary = (
        f"judged {tally.judged} trajectories ({tally.turns} turns): kept {tally.kept}, "
        f"dropped {tally.judged - tally.kept}; {tally.dropped_turns} turns removed by turn rules"
    )
    if reset:
        summary += f" (filter config changed: {reset} earlier judgements discarded and re-judged)"
    return StageResult("filter", metrics=metrics, summary=summary, tables={"filter-drops": drops_by_rule(store)})


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Loading makes a few objects per turn (the turn, its texts, its metadata) that live until
    their batch is judged. The collector's passes over them find nothing to free (no reference
    cycles are made), yet on 1M turns they doubled the loading time (8.9 s against 4.2 s of CPU);
    so it waits for the stage to end."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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


def write_verdicts(store: Store, judged: list[tuple[str, Verdict, int]], config_hash: str) -> None:
    """One batch's decisions and states, all or nothing."""
    decision_ids: list[str] = []
    turn_indices: list[int | None] = []
    rules: list[str] = []
    reasons: list[str] = []
    for trajectory_id, verdict, _ in judged:
        for turn_index, rule, reason in verdict.turn_drops:
            decision_ids.append(trajectory_id)
            turn_indices.append(turn_index)
            rules.append(rule)
            reasons.append(reason)
        if verdict.trajectory_drop is not None:
            decision_ids.append(trajectory_id)
            turn_indices.append(None)
            rules.append(verdict.trajectory_drop[0])
            reasons.append(verdict.trajectory_drop[1])
    decisions = pa.table(
        {
            "trajectory_id": pa.array(decision_ids, pa.string()),
            "turn_index": pa.array(turn_indices, pa.int32()),
            "rule": pa.array(rules, pa.string()),
            "reason": pa.array(reasons, pa.string()),
        }
    )
    states = pa.table(
        {
            "trajectory_id": pa.array([trajectory_id for trajectory_id, _, _ in judged], pa.string()),
            "kept": pa.array([verdict.kept for _, verdict, _ in judged], pa.bool_()),
            # Turns the kept_turns view shows for it: none when the trajectory is dropped.
            "kept_turns": pa.array([len(v.kept_turns) if v.kept else 0 for _, v, _ in judged], pa.int32()),
        }
    )
    # Registered outside the transaction: unregistering inside an aborted one would raise and hide
    # the error that aborted it.
    con = store.connection
    con.register("verdict_decisions", decisions)
    con.register("verdict_states", states)
    try:
        with store.transaction() as tx:
            tx.execute(
                "INSERT INTO filter_decisions SELECT trajectory_id, turn_index, rule, reason, ?, now() "
                "FROM verdict_decisions",
                [config_hash],
            )
            tx.execute(
                "INSERT INTO filter_state SELECT trajectory_id, ?, kept, kept_turns FROM verdict_states", [config_hash]
            )
    finally:
        con.unregister("verdict_decisions")
        con.unregister("verdict_states")


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
