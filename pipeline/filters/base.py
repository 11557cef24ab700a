"""What a filter rule is, and how trajectories are judged by a list of them.

Two kinds of rule (SPEC.md, "Filtering"). A turn rule names the turns to remove, each with its
reason; a trajectory rule keeps or drops the whole trajectory: `True` or `(False, reason)`, as a
datatrove filter does. Turn rules run first, in order, each seeing only the turns the earlier ones
kept; then the trajectory rules judge what is left, and the first that fails gives the reason.
Rules only decide: the filter stage records the decisions and deletes nothing.

Every rule states its decision twice. `drop` / `check` judge one trajectory in Python: the
readable specification, which `FilterRules.judge` runs. `drop_sql` / `check_sql` judge every
trajectory of a run at once, as a DuckDB query over the store (pipeline/filters/judging.py): the
form the filter stage runs, because building a million turns as Python objects costs ten times
more than deciding in SQL. tests/test_filter_rules.py holds the two forms to the same decisions,
reason text included. Where SQL cannot say exactly what Python does (`re`, `repr`), the query
narrows the work to the few rows that need Python, and Python finishes it.
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import duckdb

from pipeline.filters.patterns import PatternSet
from pipeline.store.schema import Trajectory

CheckResult = bool | tuple[bool, str]
TurnDrops = list[tuple[int, str]]


@dataclass(frozen=True)
class Relations:
    """What a rule's SQL form reads: relations of one judging run, each limited to the
    trajectories being judged."""

    # trajectory_id, domain, turns (how many the store holds) and, for trajectory rules,
    # kept_turns (how many the turn rules left).
    trajectories: str
    # The turns still kept (for a turn rule, by the rules before it; for a trajectory rule, by
    # all turn rules): trajectory_id, turn_index, action, observation, tool_name, is_error, metadata.
    turns: str
    # trajectory_id, turn_index, pattern: the observations that match the rule's `searched`
    # patterns, with the first pattern that matches; removed turns included.
    matches: str


class TurnRule(ABC):
    """Subclasses set `name` and implement `drop` and `drop_sql`."""

    name: ClassVar[str]
    # Patterns the judge searches every observation for (one shared pass), and the length above
    # which an observation is not searched.
    searched: PatternSet | None = None
    searched_max_chars: int | None = None

    @abstractmethod
    def drop(self, trajectory: Trajectory, kept: Sequence[int]) -> TurnDrops:
        """(turn index, reason) for each turn of `kept` (indices still kept, in order) to remove."""
        raise NotImplementedError

    @abstractmethod
    def drop_sql(self, con: duckdb.DuckDBPyConnection, relations: Relations) -> str:
        """A query of (trajectory_id, turn_index, reason): the turns of `relations.turns` to remove."""
        raise NotImplementedError


class TrajectoryRule(ABC):
    """Subclasses set `name` and implement `check` and `check_sql`."""

    name: ClassVar[str]
    searched: PatternSet | None = None
    searched_max_chars: int | None = None

    @abstractmethod
    def check(self, trajectory: Trajectory, kept: Sequence[int]) -> CheckResult:
        """True to keep the trajectory, (False, reason) to drop it; `kept` are the indices of the
        turns the turn rules left."""
        raise NotImplementedError

    @abstractmethod
    def check_sql(self, con: duckdb.DuckDBPyConnection, relations: Relations) -> str:
        """A query of (trajectory_id, reason): the trajectories of `relations.trajectories` to drop."""
        raise NotImplementedError


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

    @property
    def all(self) -> list[TurnRule | TrajectoryRule]:
        return [*self.turn_rules, *self.trajectory_rules]

    def judge(self, trajectory: Trajectory) -> Verdict:
        verdict = Verdict(True, list(range(len(trajectory.turns))))
        for rule in self.turn_rules:
            drops = rule.drop(trajectory, verdict.kept_turns)
            if drops:
                removed = {index for index, _ in drops}
                verdict.kept_turns = [index for index in verdict.kept_turns if index not in removed]
                verdict.turn_drops.extend((index, rule.name, reason) for index, reason in drops)
        for trajectory_rule in self.trajectory_rules:
            result = trajectory_rule.check(trajectory, verdict.kept_turns)
            if result is not True:
                verdict.kept = False
                verdict.trajectory_drop = (
                    trajectory_rule.name,
                    result[1] if isinstance(result, tuple) else trajectory_rule.name,
                )
                break
        return verdict
