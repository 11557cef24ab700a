"""Turn-level rules (SPEC.md, "Filtering", turn level): which turns of a trajectory to remove.

A removed turn leaves the trajectory, not the store: the turns around it keep their indices, and
the history of a later turn is the kept turns before it.
"""

from collections.abc import Sequence

from pipeline.filters.base import TurnDrops, TurnRule
from pipeline.filters.patterns import PatternSet
from pipeline.schema import Trajectory


class EmptyAction(TurnRule):
    """SPEC: "remove empty-action turns": an observation that answers nothing teaches nothing."""

    name = "empty_action"

    def drop(self, trajectory: Trajectory, kept: Sequence[int]) -> TurnDrops:
        turns = trajectory.turns
        return [(index, "empty action") for index in kept if not turns[index].action.strip()]


class RetryCycle(TurnRule):
    """SPEC: "skip retry cycles (a malformed action, the error it caused, and the retry: drop the
    failed pair, keep the state so the next valid turn has the right history)".

    A turn is a failed pair when its observation matches a malformed-action pattern, or when the
    adapter flagged it as a format error (`is_error` with metadata `kind: format_error`). It is
    dropped only when a kept turn follows it (the retry): the last kept turn is the harness's
    genuine answer to the trajectory's last action, not a cycle. Dropping only the pair keeps
    everything before it, so the retry's history is the state the environment was really in.
    """

    name = "retry_cycle"

    def __init__(self, malformed_action_patterns: Sequence[str]):
        self.malformed = PatternSet(malformed_action_patterns)

    def drop_batch(self, trajectories: Sequence[Trajectory], kept: Sequence[Sequence[int]]) -> list[TurnDrops]:
        malformed = self.malformed.search_observations(trajectories)
        all_drops = []
        for position, (trajectory, indices) in enumerate(zip(trajectories, kept)):
            turns = trajectory.turns
            drops = []
            for index, retry in zip(indices, indices[1:]):
                turn = turns[index]
                if turn.is_error and turn.metadata.get("kind") == "format_error":
                    drops.append((index, f"format error retried at turn {retry}"))
                elif (position, index) in malformed:
                    pattern = malformed[position, index]
                    drops.append((index, f"malformed action (observation matches `{pattern}`) retried at turn {retry}"))
            all_drops.append(drops)
        return all_drops


class GuiNoChange(TurnRule):
    """SPEC: "in GUI domains remove turns whose observation shows no change from the previous
    one". Compared with the previous *kept* observation, whitespace-normalised, so re-rendered
    indentation of the same screen counts as no change and a dropped retry does not hide one."""

    name = "gui_no_change"

    def __init__(self, gui_domains: Sequence[str]):
        self.gui_domains = frozenset(gui_domains)

    def drop(self, trajectory: Trajectory, kept: Sequence[int]) -> TurnDrops:
        if trajectory.domain not in self.gui_domains:
            return []
        turns = trajectory.turns
        drops = []
        previous_words: list[str] | None = None
        previous_index = -1
        for index in kept:
            words = turns[index].observation.split()
            if words == previous_words:
                drops.append((index, f"observation unchanged from turn {previous_index}"))
            else:
                previous_words, previous_index = words, index
        return drops
