"""Trajectory-level rules (SPEC.md, "Filtering", trajectory level): keep or drop a whole trajectory.

They run after the turn rules and see the indices of the turns those kept.
"""

from collections.abc import Sequence

from pipeline.filters.base import CheckResult, TrajectoryRule
from pipeline.filters.patterns import PatternSet
from pipeline.schema import Trajectory


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
                return False, f"turn {index} calls {tool!r}, not one of the {len(declared)} declared tools"
        return True


class EnvironmentFailure(TrajectoryRule):
    """SPEC: "drop trajectories hit by an environment failure (environment crash, missing state,
    CAPTCHA, HTTP error page, harness timeout)". Every turn is searched, removed ones too: a crash
    taints the run whichever turn shows it. Only observations up to `max_chars` are searched,
    because a failure is a short message while a long page that mentions '503' is content."""

    name = "environment_failure"

    def __init__(self, patterns: Sequence[str], max_chars: int):
        self.failures = PatternSet(patterns)
        self.max_chars = max_chars

    def check_batch(self, trajectories: Sequence[Trajectory], kept: Sequence[Sequence[int]]) -> list[CheckResult]:
        failures = self.failures.search_observations(trajectories, self.max_chars)
        first: dict[int, tuple[int, str]] = {}
        for (position, index), pattern in sorted(failures.items()):
            first.setdefault(position, (index, pattern))
        results: list[CheckResult] = [True] * len(trajectories)
        for position, (index, pattern) in first.items():
            results[position] = (False, f"turn {index}: observation matches environment failure pattern `{pattern}`")
        return results
