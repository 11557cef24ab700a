"""Judge every trajectory the filter has not judged yet, all at once, in DuckDB.

Building each trajectory as Python objects to judge it cost about 10 s per million turns
(bench/ingest.py's synthetic corpus, this 2-core machine); the same decisions as set-based
queries over the store take about one. The rules' SQL forms (pipeline/filters/base.py) run in
their order and fill temporary tables:

- judging_trajectories: the trajectories without a `filter_state` row, how many turns the store
  holds for each, and the batch (of `batch_trajectories`) the stage writes them in;
- judging_matches_<rule>: the observations that match a rule's patterns (loading.py);
- judging_turn_drops: every turn rule's drops, each rule reading the turns the earlier ones kept
  (the view judging_kept_turns);
- judging_verdicts: per trajectory, kept or the first trajectory rule that failed and its
  reason, and how many turns it keeps.

The stage copies them into `filter_decisions` and `filter_state` batch by batch;
`drop_judging_tables` removes them. Turn positions are the stored `turn_index`.
"""

import duckdb

from pipeline.filters.base import FilterRules, Relations
from pipeline.filters.loading import NO_MATCHES, search_observations
from pipeline.filters.sql import JUDGING_PREFIX, no_rows, quote

TRAJECTORIES = "judging_trajectories"
KEPT_TURNS = "judging_kept_turns"
TURN_DROPS = "judging_turn_drops"
COUNTS = "judging_counts"
VERDICTS = "judging_verdicts"


def judge_unjudged(con: duckdb.DuckDBPyConnection, rules: FilterRules, batch_trajectories: int) -> int:
    """Fill the judging tables for every trajectory without a `filter_state` row; returns how
    many batches they make."""
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE {TRAJECTORIES} AS
        WITH unjudged AS (SELECT trajectory_id, domain FROM trajectories ANTI JOIN filter_state USING (trajectory_id)),
        stored AS (
            SELECT trajectory_id, count(*) AS turns FROM turns SEMI JOIN unjudged USING (trajectory_id)
            GROUP BY trajectory_id
        )
        SELECT trajectory_id, domain, coalesce(stored.turns, 0) AS turns,
               (row_number() OVER (ORDER BY trajectory_id) - 1) // {int(batch_trajectories)} AS batch
        FROM unjudged LEFT JOIN stored USING (trajectory_id)
        """
    )
    matches = search_observations(con, TRAJECTORIES, rules.all)
    _judge_turns(con, rules, matches)
    _judge_trajectories(con, rules, matches)
    return con.execute(f"SELECT coalesce(max(batch) + 1, 0) FROM {TRAJECTORIES}").fetchone()[0]  # type: ignore[index]  # an aggregate: one row


def _judge_turns(con: duckdb.DuckDBPyConnection, rules: FilterRules, matches: dict[str, str]) -> None:
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {TURN_DROPS} "
        "(trajectory_id VARCHAR, turn_index INTEGER, rule VARCHAR, reason VARCHAR)"
    )
    con.execute(
        f"""
        CREATE OR REPLACE TEMP VIEW {KEPT_TURNS} AS
        SELECT trajectory_id, turn_index, action, observation, tool_name, is_error, metadata
        FROM turns SEMI JOIN {TRAJECTORIES} USING (trajectory_id)
        ANTI JOIN {TURN_DROPS} USING (trajectory_id, turn_index)
        """
    )
    for rule in rules.turn_rules:
        query = rule.drop_sql(con, Relations(TRAJECTORIES, KEPT_TURNS, matches.get(rule.name, NO_MATCHES)))
        # Materialised before it joins the drops its own query reads through the view.
        con.execute(f"CREATE OR REPLACE TEMP TABLE judging_rule_drops AS {query}")
        con.execute(
            f"INSERT INTO {TURN_DROPS} "
            f"SELECT trajectory_id, turn_index, {quote(rule.name)}, reason FROM judging_rule_drops"
        )


def _judge_trajectories(con: duckdb.DuckDBPyConnection, rules: FilterRules, matches: dict[str, str]) -> None:
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE {COUNTS} AS
        SELECT trajectory_id, domain, batch, turns, turns - coalesce(dropped, 0) AS kept_turns
        FROM {TRAJECTORIES}
        LEFT JOIN (SELECT trajectory_id, count(*) AS dropped FROM {TURN_DROPS} GROUP BY trajectory_id)
        USING (trajectory_id)
        """
    )
    failures = [no_rows(trajectory_id="VARCHAR", position="INTEGER", rule="VARCHAR", reason="VARCHAR")]
    for position, rule in enumerate(rules.trajectory_rules):
        query = rule.check_sql(con, Relations(COUNTS, KEPT_TURNS, matches.get(rule.name, NO_MATCHES)))
        table = f"{JUDGING_PREFIX}failures_{position}"
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {query}")
        failures.append(
            f"SELECT trajectory_id, {position} AS position, {quote(rule.name)} AS rule, reason FROM {table}"
        )
    # The first failing rule, in the rules' order, gives the trajectory's one drop reason.
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE {VERDICTS} AS
        WITH failures AS ({" UNION ALL ".join(failures)}),
        first_failure AS (
            SELECT trajectory_id, arg_min(rule, position) AS rule, arg_min(reason, position) AS reason
            FROM failures GROUP BY trajectory_id
        )
        SELECT trajectory_id, batch, turns, rule IS NULL AS kept,
               CASE WHEN rule IS NULL THEN kept_turns ELSE 0 END AS kept_turns, rule, reason
        FROM {COUNTS} LEFT JOIN first_failure USING (trajectory_id)
        """
    )


def drop_judging_tables(con: duckdb.DuckDBPyConnection) -> None:
    views = con.execute(
        "SELECT view_name FROM duckdb_views() WHERE temporary AND starts_with(view_name, ?)", [JUDGING_PREFIX]
    ).fetchall()
    for (name,) in views:
        con.execute(f"DROP VIEW IF EXISTS temp.{name}")
    tables = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE temporary AND starts_with(table_name, ?)", [JUDGING_PREFIX]
    ).fetchall()
    for (name,) in tables:
        con.execute(f"DROP TABLE IF EXISTS temp.{name}")
