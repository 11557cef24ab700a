"""What the filter reads from the store into Python: the observations a rule's patterns could match.

The rules' SQL forms read the store where it is; Python's `re` is the one part they cannot run
(pipeline/filters/patterns.py says why RE2 is not the same). So the observations of the judged
trajectories are screened in DuckDB, in one pass for all rules: one RE2 alternation of every
rule's screen (its patterns, widened to what RE2 can say), about 0.7 s of CPU per million turns
however many patterns. Each rule's own screen and length limit then pick its candidates among the
few that pass, and only those come to Python, where the rule's patterns are searched with `re`.
"""

from collections.abc import Sequence

import duckdb

from pipeline.filters.base import TrajectoryRule, TurnRule
from pipeline.filters.patterns import alternation, compiles_in_re2
from pipeline.filters.sql import JUDGING_PREFIX, judging_table, no_rows, quote

# The observations that pass some rule's screen: few, unless a rule has no screen.
CANDIDATES = f"{JUDGING_PREFIX}candidates"

# The matches relation of a rule that searches nothing.
NO_MATCHES = f"({no_rows(trajectory_id='VARCHAR', turn_index='INTEGER', pattern='VARCHAR')})"


def search_observations(
    con: duckdb.DuckDBPyConnection, judged: str, rules: Sequence[TurnRule | TrajectoryRule]
) -> dict[str, str]:
    """{rule name: table of (trajectory_id, turn_index, pattern)}, for each rule with patterns to
    search: the observations of the trajectories in `judged` that match one (no longer than the
    rule's `searched_max_chars`), with the first that matches. Removed turns are searched too."""
    searching = [rule for rule in rules if rule.searched is not None and rule.searched.patterns]
    if not searching:
        return {}
    screens = [rule.searched.screen for rule in searching]  # type: ignore[union-attr]  # searching: each has patterns
    if None in screens:
        passes = "true"  # a rule without a screen could match any text: every observation comes
    elif compiles_in_re2(combined := alternation(screens)):  # type: ignore[arg-type]  # no None: the branch above
        passes = f"regexp_matches(observation, {quote(combined)})"
    else:
        passes = " OR ".join(f"regexp_matches(observation, {quote(screen)})" for screen in screens)  # type: ignore[arg-type]  # no None
    # Materialised first: else DuckDB pushes the screen into the scan of `turns`, ahead of the
    # join, and a nightly run that judges a few new trajectories screens the whole store.
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE {CANDIDATES} AS
        WITH judged_turns AS MATERIALIZED (
            SELECT trajectory_id, turn_index, observation FROM turns SEMI JOIN {judged} USING (trajectory_id)
        )
        SELECT * FROM judged_turns WHERE {passes}
        """
    )
    return {rule.name: _rule_matches(con, rule) for rule in searching}


def _rule_matches(con: duckdb.DuckDBPyConnection, rule: TurnRule | TrajectoryRule) -> str:
    assert rule.searched is not None  # search_observations passes the rules with patterns only
    conditions = ["true"]
    if rule.searched.screen is not None:
        conditions.append(f"regexp_matches(observation, {quote(rule.searched.screen)})")
    if rule.searched_max_chars is not None:
        conditions.append(f"length(observation) <= {int(rule.searched_max_chars)}")  # code points, as len()
    candidates = con.execute(
        f"SELECT trajectory_id, turn_index, observation FROM {CANDIDATES} WHERE {' AND '.join(conditions)}"
    ).fetchall()
    found = [
        (trajectory_id, turn_index, pattern)
        for trajectory_id, turn_index, observation in candidates
        if (pattern := rule.searched.first_match(observation)) is not None
    ]
    return judging_table(
        con,
        f"matches_{rule.name}",
        {
            "trajectory_id": ("VARCHAR", [trajectory_id for trajectory_id, _, _ in found]),
            "turn_index": ("INTEGER", [turn_index for _, turn_index, _ in found]),
            "pattern": ("VARCHAR", [pattern for _, _, pattern in found]),
        },
    )
