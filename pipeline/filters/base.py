"""What a filter rule is, and how trajectories are judged by a list of them.

Two kinds of rule (SPEC.md, "Filtering"). A turn rule names the turns to remove, each with its
reason; a trajectory rule keeps or drops the whole trajectory: `True` or `(False, reason)`, as a
datatrove filter does. Turn rules run first, in order, each seeing only the turns the earlier ones
kept; then the trajectory rules judge what is left, and the first that fails gives the reason.
Rules only decide: the filter stage records the decisions and deletes nothing.

As in datatrove, a rule decides one item (`drop` / `check`) and the judge calls its batch form
(`drop_batch` / `check_batch`), which by default loops; a rule that is cheaper over many
trajectories at once (a regular-expression screen) overrides the batch form instead, and its
one-item form then calls the batch form with one trajectory. A rule must override one of the two.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.schema import Trajectory

CheckResult = bool | tuple[bool, str]
TurnDrops = list[tuple[int, str]]


class TurnRule:
    """Subclasses set `name` and implement `drop` or `drop_batch`."""

    name: ClassVar[str]

    def drop(self, trajectory: Trajectory, kept: Sequence[int]) -> TurnDrops:
        """(turn index, reason) for each turn of `kept` (indices still kept, in order) to remove."""
        return self.drop_batch([trajectory], [kept])[0]

    def drop_batch(self, trajectories: Sequence[Trajectory], kept: Sequence[Sequence[int]]) -> list[TurnDrops]:
        return [self.drop(trajectory, indices) for trajectory, indices in zip(trajectories, kept)]


class TrajectoryRule:
    """Subclasses set `name` and implement `check` or `check_batch`."""

    name: ClassVar[str]

    def check(self, trajectory: Trajectory, kept: Sequence[int]) -> CheckResult:
        """True to keep the trajectory, (False, reason) to drop it; `kept` are the indices of the
        turns the turn rules left."""
        return self.check_batch([trajectory], [kept])[0]

    def check_batch(self, trajectories: Sequence[Trajectory], kept: Sequence[Sequence[int]]) -> list[CheckResult]:
        return [self.check(trajectory, indices) for trajectory, indices in zip(trajectories, kept)]


@dataclass(slots=True)
class Verdict:
    kept: bool
    kept_turns: list[int]
    # (turn index, rule, reason) for every removed turn, also in a dropped trajectory: the record
    # says what each rule found, whatever a later rule decided.
    turn_drops: list[tuple[int, str, str]] = field(default_factory=list)
    # (rule, reason) of the trajectory rule that dropped it; None when kept.
    trajectory_drop: tuple[str, str] | None = None


@dataclass
class FilterRules:
    turn_rules: list[TurnRule]
    trajectory_rules: list[TrajectoryRule]

    def judge(self, trajectory: Trajectory) -> Verdict:
        return self.judge_batch([trajectory])[0]

    def judge_batch(self, trajectories: Sequence[Trajectory]) -> list[Verdict]:
        verdicts = [Verdict(True, list(range(len(t.turns)))) for t in trajectories]
        for rule in self.turn_rules:
            all_drops = rule.drop_batch(trajectories, [v.kept_turns for v in verdicts])
            for verdict, drops in zip(verdicts, all_drops):
                if drops:
                    removed = {index for index, _ in drops}
                    verdict.kept_turns = [index for index in verdict.kept_turns if index not in removed]
                    verdict.turn_drops.extend((index, rule.name, reason) for index, reason in drops)
        undecided = list(range(len(trajectories)))
        for rule in self.trajectory_rules:
            results = rule.check_batch(
                [trajectories[i] for i in undecided], [verdicts[i].kept_turns for i in undecided]
            )
            still = []
            for position, result in zip(undecided, results):
                if result is True:
                    still.append(position)
                else:
                    reason = result[1] if isinstance(result, tuple) else rule.name
                    verdicts[position].kept = False
                    verdicts[position].trajectory_drop = (rule.name, reason)
            undecided = still
        return verdicts
