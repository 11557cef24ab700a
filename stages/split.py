"""`simulacra split`: every kept trajectory in exactly one pool (cpt, sft, rl, val, eval), and its targets.

Placement. Whole groups are placed, not trajectories: runs of one task share most of their
(action, observation) pairs, so a task with runs on both sides of the eval line puts training data
in the eval pool (issue 13: 102 of 212 demo eval targets were verbatim in the cpt pool). A
trajectory's group key is `<field>:<value>` for the first of `split.group_by` that is set and not
blank (`task`, or a path into `metadata`), else `trajectory_id:<id>`; it is recorded in `splits`.
The group's position u in [0, 1) is the first 52 bits of md5(salt:group_key); the pools take
consecutive slices of [0, 1) in the order cpt, sft, rl, val, eval, as wide as their ratios. The val
pool (issue 28) is the training side's held-out part: stages report on it and `export` chooses by it,
so the eval pool only reports. `split.val_sources` holds out whole environments for it: a group with a
trajectory of such an ingest source goes to val unless its u is in eval's slice, so no training pool
holds them and eval is unchanged. u depends on
the key alone, so adding data never moves a trajectory (a new run of a known task joins its pool; under
`val_sources`, one from a held-out source takes its group into val, docs/stages/split.md),
and eval never meets a training pool in a group. md5 rather than DuckDB's `hash()`: its value is
fixed by a standard, not by a library version.

What grouping cannot separate, the environment repeats across tasks (`go to drawer 1` -> `The
drawer 1 is closed.`; one catalogue entry fetched for two customers): `overlap_report` counts, per
domain, the eval target turns whose exact (action, observation) pair is a kept turn of a training
pool, so held-out numbers are read knowing how much of them is recall.

Targets. Which kept turns of a trajectory become prediction targets is decided per pool by a rank:
md5(seed:trajectory_id:turn_index), smallest first. It depends on the seed and the trajectory
alone, not on other data, nor on a random generator whose algorithm a Python release may change.
- `all`: every kept turn (SFT: each turn is a query);
- `one`: the kept turn of smallest rank (RL: one turn per trajectory, SPEC.md's echo trap);
- `first_last_middle`: the first and last kept turns and the `middle` smallest-ranked turns
  between them (val and eval: AgentWorldBench's first, last and 3 middle turns).
The cpt pool has no targets: its whole trajectory trains, masked by keep ratio. A thought turn
(schema.THOUGHT: the agent thinking aloud, answered by the harness) is never a target: the choice
is made among the other kept turns, so "first" and "last" are the first and last turns the
environment answered.

Every run computes what `splits` and `targets` should hold from `kept_turns` and the config
(a hash per kept turn: cheap), then, in one transaction, deletes the rows that differ and inserts
the missing ones. Unchanged rows stay as they are (with their `assigned_at`); a trajectory the
filter dropped leaves both tables; a changed `split` section (ratios, salt, `group_by`, seed,
target selection, `val_sources`) replaces every row at once, in that one transaction, so `splits` never mixes two
configs and the stages after it see the new pools in their fingerprints.
"""

import hashlib
from collections.abc import Sequence
from typing import Any

from pipeline.config import SimulacraConfig
from pipeline.config.split import POOLS, SplitConfig, TargetSelection
from pipeline.errors import UserFixableError
from pipeline.orchestration.faults import maybe_fail
from pipeline.stage import StageResult
from pipeline.store.database import Store
from pipeline.store.prerequisites import require_filtered
from pipeline.store.schema import THOUGHT

STAGE = "split"
# 52 bits: exactly representable in a DOUBLE, so SQL and Python compute the same position.
POSITION_BITS = 52


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _position_sql(salt: str, key: str) -> str:
    """u in [0, 1) of the column `key`; `pool_position` is the same in Python (the tests compare them)."""
    digits = POSITION_BITS // 4
    return (
        f"CAST(('0x' || substr(md5({_quote(salt + ':')} || {key}), 1, {digits}))::UBIGINT AS DOUBLE) "
        f"/ CAST('{2**POSITION_BITS}' AS DOUBLE)"
    )


def pool_position(salt: str, group_key: str) -> float:
    digest = hashlib.md5(f"{salt}:{group_key}".encode()).hexdigest()
    return int(digest[: POSITION_BITS // 4], 16) / 2**POSITION_BITS


def group_key_sql(fields: Sequence[str]) -> str:
    """`<field>:<value>` of the first field that is set and not blank (outer whitespace stripped, and spaces
    at a line's end: SWE-agent's configurations wrap one issue in instructions that differ by a trailing
    space inside the text, and put runs of one instance in two groups, on both sides of the eval line; a
    metadata value that is not a string is its JSON text), else `trajectory_id:<id>`; over the columns
    of `trajectories`. Fields are validated by SplitConfig: `task` or `metadata.<path>`."""
    keys = []
    for name in fields:
        if name == "task":
            value = "task"
        else:
            path = "$" + "".join(f'."{key}"' for key in name.split(".")[1:])
            value = f"json_extract_string(metadata, {_quote(path)})"
        lines_ended = f"regexp_replace({value}, '[ \\t\\r]+\\n', chr(10), 'g')"
        keys.append(f"{_quote(name + ':')} || nullif(regexp_replace({lines_ended}, '^\\s+|\\s+$', '', 'g'), '')")
    return f"coalesce({', '.join(keys)}, 'trajectory_id:' || trajectory_id)"


def _pool_sql(config: SplitConfig) -> str:
    """CASE over the position: each pool a slice [previous bound, bound) of [0, 1); eval takes the rest.
    A held-out group (`split.val_sources`) below eval's slice goes to val, whichever slice it is in."""
    bound = 0.0
    cases = []
    for pool in POOLS[:-1]:
        bound += getattr(config.ratios, pool)
        cases.append(f"WHEN position < CAST('{bound!r}' AS DOUBLE) THEN '{pool}'")
    # `bound` is now where eval's slice starts, computed as the CASE below computes it.
    held_out = f"WHEN held_out AND position < CAST('{bound!r}' AS DOUBLE) THEN 'val' " if config.val_sources else ""
    return f"CASE {held_out}{' '.join(cases)} ELSE '{POOLS[-1]}' END"


def _selection_sql(selection: TargetSelection) -> str:
    """Condition on a ranked kept turn: `nth` (its place among the kept turns), `kept` (how many),
    `rank` (by hash among all kept turns) and `middle_rank` (by hash among the middle ones)."""
    if selection.strategy == "all":
        return "true"
    if selection.strategy == "one":
        return "rank = 1"
    # first_last_middle: middle turns are ranked among themselves (first and last excluded).
    return f"(nth = 1 OR nth = kept OR middle_rank <= {int(selection.middle)})"


def _desired_sql(config: SplitConfig, config_hash: str) -> tuple[str, str]:
    """The rows `splits` and `targets` should hold, as two SELECTs; the second reads the first's
    result from the temporary table `desired_splits`."""
    grouped = f"SELECT trajectory_id, source, {group_key_sql(config.group_by)} AS group_key FROM kept_trajectories"
    # A group is held out when any of its trajectories comes from a held-out source: runs of one task in two
    # sources must not sit in val and in a training pool at once.
    sources = ", ".join(_quote(name) for name in config.val_sources)
    held_out = f"bool_or(source IN ({sources})) OVER (PARTITION BY group_key)" if sources else "false"
    splits = f"""SELECT trajectory_id, group_key, {_pool_sql(config)} AS pool
        FROM (SELECT *, {_position_sql(config.salt, "group_key")} AS position, {held_out} AS held_out
              FROM ({grouped}))"""
    seed = _quote(f"{config.seed}:")
    ranked = f"""SELECT p.pool, k.trajectory_id, k.turn_index,
            row_number() OVER (PARTITION BY k.trajectory_id ORDER BY k.turn_index) AS nth,
            count(*) OVER (PARTITION BY k.trajectory_id) AS kept,
            md5({seed} || k.trajectory_id || ':' || k.turn_index) AS turn_rank
        FROM kept_turns k JOIN desired_splits p USING (trajectory_id)
        WHERE json_extract_string(k.metadata, '$.kind') IS DISTINCT FROM {_quote(THOUGHT)}"""
    ranked = f"""SELECT *,
            row_number() OVER (PARTITION BY trajectory_id ORDER BY turn_rank) AS rank,
            row_number() OVER (PARTITION BY trajectory_id, (nth = 1 OR nth = kept) ORDER BY turn_rank) AS middle_rank
        FROM ({ranked})"""
    selections = {
        "sft": config.sft_targets,
        "rl": config.rl_targets,
        "val": config.val_targets,
        "eval": config.eval_targets,
    }
    per_pool = " OR ".join(f"(pool = '{pool}' AND {_selection_sql(s)})" for pool, s in selections.items())
    strategy = "CASE pool " + " ".join(f"WHEN '{pool}' THEN '{s.strategy}'" for pool, s in selections.items()) + " END"
    targets = f"""SELECT trajectory_id, turn_index, pool, {strategy} AS strategy,
            {int(config.seed)} AS seed, {_quote(config_hash)} AS config_hash
        FROM ({ranked}) WHERE {per_pool}"""
    return splits, targets


def _require_sources(store: Store, names: Sequence[str]) -> None:
    """Every held-out source names kept trajectories: a misspelt name would otherwise hold out nothing."""
    if not names:
        return
    present = [row[0] for row in store.execute("SELECT DISTINCT source FROM kept_trajectories ORDER BY 1").fetchall()]
    unknown = [name for name in names if name not in present]
    if unknown:
        raise UserFixableError(
            f"split.val_sources: no kept trajectory comes from {', '.join(map(repr, unknown))}; the sources with kept "
            f"trajectories are {', '.join(map(repr, present)) or 'none'}: correct the name or ingest that source first"
        )


def run(config: SimulacraConfig, store: Store) -> StageResult:
    require_filtered(store)
    _require_sources(store, config.split.val_sources)
    config_hash = config.section_hash(STAGE)
    splits_sql, targets_sql = _desired_sql(config.split, config_hash)
    with store.transaction() as tx:
        tx.execute(f"CREATE OR REPLACE TEMP TABLE desired_splits AS {splits_sql}")
        tx.execute(f"CREATE OR REPLACE TEMP TABLE desired_targets AS {targets_sql}")
        removed = _count(
            tx.execute(
                """DELETE FROM splits s WHERE s.config_hash <> ? OR NOT EXISTS (SELECT 1 FROM desired_splits d
                   WHERE d.trajectory_id = s.trajectory_id AND d.pool = s.pool AND d.group_key = s.group_key)""",
                [config_hash],
            )
        )
        added = _count(
            tx.execute(
                """INSERT INTO splits (trajectory_id, pool, group_key, config_hash, assigned_at)
                   SELECT trajectory_id, pool, group_key, ?, now() FROM desired_splits d
                   WHERE NOT EXISTS (SELECT 1 FROM splits s WHERE s.trajectory_id = d.trajectory_id)""",
                [config_hash],
            )
        )
        targets_removed = _count(
            tx.execute(
                """DELETE FROM targets t WHERE NOT EXISTS (SELECT 1 FROM desired_targets d
                   WHERE d.trajectory_id = t.trajectory_id AND d.turn_index = t.turn_index AND d.pool = t.pool
                     AND d.strategy = t.strategy AND d.seed = t.seed AND d.config_hash = t.config_hash)"""
            )
        )
        targets_added = _count(
            tx.execute("INSERT INTO targets SELECT * FROM desired_targets EXCEPT SELECT * FROM targets")
        )
        tx.execute("DROP TABLE desired_splits")
        tx.execute("DROP TABLE desired_targets")
    # One transaction holds the stage's work: the drill fails right after it, so a retry must move nothing.
    maybe_fail(config, STAGE, f"after committing {added} assignment(s)")
    report = pool_report(store)
    overlap = overlap_report(store)
    metrics: dict[str, Any] = {
        "trajectories_assigned": added,
        "assignments_removed": removed,
        "targets_added": targets_added,
        "targets_removed": targets_removed,
    }
    for pool in POOLS:
        rows = [r for r in report if r["pool"] == pool]
        metrics[f"{pool}_trajectories"] = sum(r["trajectories"] for r in rows)
        metrics[f"{pool}_groups"] = sum(r["groups"] for r in rows)
        metrics[f"{pool}_targets"] = sum(r["targets"] for r in rows)
    metrics["eval_targets"] = sum(r["eval_targets"] for r in overlap)
    metrics["eval_targets_in_training"] = sum(r["in_training"] for r in overlap)
    metrics.update({f"eval_overlap.{r['domain']}": round(r["share_in_training"], 4) for r in overlap})
    pools = ", ".join(f"{p} {metrics[f'{p}_trajectories']}" for p in POOLS)
    summary = f"{added} trajectory(ies) assigned, {removed} removed or moved; pools: {pools}"
    if config.split.val_sources:
        # Which environment the validation score speaks for: one no training pool holds.
        metrics["val_sources"] = ", ".join(config.split.val_sources)
        summary += f"; held out for val (no training pool holds them): {metrics['val_sources']}"
    if overlap:
        shares = ", ".join(f"{r['domain']} {r['share_in_training']:.1%}" for r in overlap)
        summary += (
            f"; eval targets verbatim in a training pool: {metrics['eval_targets_in_training']} of "
            f"{metrics['eval_targets']} ({shares})"
        )
    return StageResult(stage=STAGE, metrics=metrics, summary=summary, tables={"pools": report, "eval overlap": overlap})


def _count(cursor: Any) -> int:
    row = cursor.fetchone()
    return int(row[0]) if row else 0


def pool_report(store: Store) -> list[dict[str, Any]]:
    """Per pool and domain: trajectories, their groups, their kept turns, and target turns."""
    return store.rows(
        """
        WITH turns AS (SELECT trajectory_id, count(*) AS turns FROM kept_turns GROUP BY trajectory_id),
             chosen AS (SELECT trajectory_id, count(*) AS targets FROM targets GROUP BY trajectory_id)
        SELECT s.pool, t.domain, count(*) AS trajectories, count(DISTINCT s.group_key) AS groups,
               coalesce(sum(u.turns), 0) AS turns, coalesce(sum(c.targets), 0) AS targets
        FROM splits s
        JOIN trajectories t USING (trajectory_id)
        LEFT JOIN turns u USING (trajectory_id)
        LEFT JOIN chosen c USING (trajectory_id)
        GROUP BY s.pool, t.domain
        ORDER BY list_position(['cpt', 'sft', 'rl', 'val', 'eval'], s.pool), t.domain
        """
    )


def overlap_report(store: Store) -> list[dict[str, Any]]:
    """Per domain: the eval pool's target turns, and how many have their exact (action, observation)
    pair in a kept turn of a training pool (any, then cpt, sft, rl). The training side is every kept
    turn, not only targets: an SFT or RL query shows its whole history to the model. Only pairs that
    occur among the eval targets are looked up, so the join is as small as the eval pool."""
    return store.rows(
        """
        WITH eval_targets AS (
            SELECT t.domain, k.action, k.observation
            FROM targets g
            JOIN kept_turns k USING (trajectory_id, turn_index)
            JOIN trajectories t USING (trajectory_id)
            WHERE g.pool = 'eval'
        ), pairs AS (
            SELECT DISTINCT action, observation FROM eval_targets
        ), trained AS (
            SELECT p.action, p.observation, bool_or(s.pool = 'cpt') AS in_cpt, bool_or(s.pool = 'sft') AS in_sft,
                   bool_or(s.pool = 'rl') AS in_rl
            FROM pairs p
            JOIN kept_turns k ON k.action = p.action AND k.observation = p.observation
            JOIN splits s USING (trajectory_id)
            WHERE s.pool IN ('cpt', 'sft', 'rl')
            GROUP BY p.action, p.observation
        )
        SELECT e.domain, count(*) AS eval_targets, count(r.action) AS in_training,
               count(r.action) / count(*) AS share_in_training,
               count(*) FILTER (WHERE r.in_cpt) AS in_cpt, count(*) FILTER (WHERE r.in_sft) AS in_sft,
               count(*) FILTER (WHERE r.in_rl) AS in_rl
        FROM eval_targets e
        LEFT JOIN trained r ON r.action = e.action AND r.observation = e.observation
        GROUP BY e.domain
        ORDER BY e.domain
        """
    )
