"""Trajectory-level rules (SPEC.md, "Filtering", trajectory level): keep or drop a whole trajectory.

They run after the turn rules and see the indices of the turns those kept.
"""

from collections.abc import Sequence

import duckdb
import orjson

from pipeline.filters.base import CheckResult, Relations, TrajectoryRule
from pipeline.filters.patterns import PatternSet
from pipeline.filters.sql import judging_table
from pipeline.store.schema import SystemPrompt, Trajectory


class MinTurns(TrajectoryRule):
    """SPEC: "drop trajectories with fewer than 2 turns". Counted after turn-level removals: a
    trajectory whose only other turn was a retry cycle gives no history to condition on either."""

    name = "min_turns"

    def __init__(self, min_turns: int):
        self.min_turns = min_turns

    def check(self, trajectory: Trajectory, kept: Sequence[int]) -> CheckResult:
        count = len(kept)
        if count >= self.min_turns:
            return True
        noun = "turn" if count == 1 else "turns"
        if count < len(trajectory.turns):
            return False, f"{count} {noun} after turn-level filtering (< {self.min_turns})"
        return False, f"{count} {noun} (< {self.min_turns})"

    def check_sql(self, con: duckdb.DuckDBPyConnection, relations: Relations) -> str:
        return f"""
            SELECT trajectory_id,
                   kept_turns || CASE WHEN kept_turns = 1 THEN ' turn' ELSE ' turns' END
                   || CASE WHEN kept_turns < turns THEN ' after turn-level filtering' ELSE '' END
                   || ' (< {self.min_turns})' AS reason
            FROM {relations.trajectories} WHERE kept_turns < {self.min_turns}
        """


class DeclaredActionSpace(TrajectoryRule):
    """SPEC: "drop tool-call trajectories that call a tool not in their declared action space".
    Only trajectories that declare tools are checked, and only kept turns with a tool name: a call
    to an unknown tool that the harness rejected was removed as a retry cycle already, and the
    rest of the trajectory is consistent with its action space."""

    name = "action_space"

    def check(self, trajectory: Trajectory, kept: Sequence[int]) -> CheckResult:
        declared = trajectory.system.tool_names()
        if not declared:
            return True
        turns = trajectory.turns
        for index in kept:
            tool = turns[index].tool_name
            if tool is not None and tool not in declared:
                return False, self._reason(index, tool, len(declared))
        return True

    def check_sql(self, con: duckdb.DuckDBPyConnection, relations: Relations) -> str:
        # The declared names come from `SystemPrompt.tool_names` (its reading of a tools list is
        # the specification), decoded once per distinct list: a source's trajectories share one.
        # The reason quotes the tool as Python's repr does, so the few offenders are worded in
        # Python too.
        tool_lists = con.sql(
            "SELECT DISTINCT tools::VARCHAR FROM trajectories "
            f"SEMI JOIN {relations.trajectories} USING (trajectory_id) WHERE tools IS NOT NULL"
        ).fetchall()
        declared = {}
        for (text,) in tool_lists:
            tools = orjson.loads(text)
            names = SystemPrompt(tools=tools if isinstance(tools, list) else []).tool_names()
            if names:
                declared[text] = sorted(names)
        offenders = []
        if declared:
            tool_sets = judging_table(
                con,
                "declared_tool_sets",
                {"tools": ("VARCHAR", list(declared)), "names": ("VARCHAR[]", list(declared.values()))},
            )
            offenders = con.sql(
                f"""
                WITH checked AS (
                    SELECT trajectory_id, names
                    FROM (SELECT trajectory_id, tools::VARCHAR AS tools FROM trajectories
                          SEMI JOIN {relations.trajectories} USING (trajectory_id) WHERE tools IS NOT NULL)
                    JOIN {tool_sets} USING (tools)
                )
                SELECT trajectory_id, min(turn_index), arg_min(tool_name, turn_index), any_value(len(names))
                FROM {relations.turns} JOIN checked USING (trajectory_id)
                WHERE tool_name IS NOT NULL AND NOT list_contains(names, tool_name)
                GROUP BY trajectory_id
                """
            ).fetchall()
        failures = judging_table(
            con,
            "undeclared_calls",
            {
                "trajectory_id": ("VARCHAR", [trajectory_id for trajectory_id, *_ in offenders]),
                "reason": ("VARCHAR", [self._reason(index, tool, count) for _, index, tool, count in offenders]),
            },
        )
        return f"SELECT trajectory_id, reason FROM {failures}"

    @staticmethod
    def _reason(index: int, tool: str, declared: int) -> str:
        return f"turn {index} calls {tool!r}, not one of the {declared} declared tools"


class EnvironmentFailure(TrajectoryRule):
    """SPEC: "drop trajectories hit by an environment failure (environment crash, missing state,
    CAPTCHA, HTTP error page, harness timeout)". Every turn is searched, removed ones too: a crash
    taints the run whichever turn shows it. Only observations up to `max_chars` are searched,
    because a failure is a short message while a long page that mentions '503' is content."""

    name = "environment_failure"
    searched: PatternSet  # set in __init__: never None here
    # What a match is, in the reason.
    failure = "environment failure"

    def __init__(self, patterns: Sequence[str], max_chars: int | None):
        self.searched = PatternSet(patterns)
        self.searched_max_chars = max_chars

    def check(self, trajectory: Trajectory, kept: Sequence[int]) -> CheckResult:
        for index, turn in enumerate(trajectory.turns):
            if self.searched_max_chars is None or len(turn.observation) <= self.searched_max_chars:
                pattern = self.searched.first_match(turn.observation)
                if pattern is not None:
                    return False, f"turn {index}: observation matches {self.failure} pattern `{pattern}`"
        return True

    def check_sql(self, con: duckdb.DuckDBPyConnection, relations: Relations) -> str:
        return f"""
            SELECT trajectory_id,
                   arg_min('turn ' || turn_index || ': observation matches {self.failure} pattern `'
                           || pattern || '`', turn_index) AS reason
            FROM {relations.matches} GROUP BY trajectory_id
        """


class HarnessTimeout(EnvironmentFailure):
    """SPEC's harness timeout, the environment failure whose message is not short: the harness
    stopped waiting for a command and wrote so before or after the command's partial output
    (SWE-agent's `EXECUTION TIMED OUT` follows 3,380 characters of output in the public
    BabyTimeCapsule.traj). So every observation is searched whatever its length, for the exact
    words of the harnesses' own messages (pipeline/config/filter.py lists them with their source)."""

    name = "harness_timeout"
    failure = "harness timeout"

    def __init__(self, patterns: Sequence[str]):
        super().__init__(patterns, max_chars=None)
