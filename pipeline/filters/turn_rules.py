"""Turn-level rules (SPEC.md, "Filtering", turn level): which turns of a trajectory to remove.

A removed turn leaves the trajectory, not the store: the turns around it keep their indices, and
the history of a later turn is the kept turns before it.
"""

from collections.abc import Sequence

import duckdb

from pipeline.filters.base import Relations, TurnDrops, TurnRule
from pipeline.filters.patterns import PatternSet
from pipeline.filters.sql import NO_TURNS, is_blank, is_one_of, newlines_as_spaces, words
from pipeline.store.schema import Trajectory


class EmptyAction(TurnRule):
    """SPEC: "remove empty-action turns": an observation that answers nothing teaches nothing."""

    name = "empty_action"

    def drop(self, trajectory: Trajectory, kept: Sequence[int]) -> TurnDrops:
        turns = trajectory.turns
        return [(index, "empty action") for index in kept if not turns[index].action.strip()]

    def drop_sql(self, con: duckdb.DuckDBPyConnection, relations: Relations) -> str:
        return (
            f"SELECT trajectory_id, turn_index, 'empty action' AS reason FROM {relations.turns} "
            f"WHERE {is_blank('action')}"
        )


class RetryCycle(TurnRule):
    """SPEC: "skip retry cycles (a malformed action, the error it caused, and the retry: drop the
    failed pair, keep the state so the next valid turn has the right history)".

    A turn is a failed pair when the adapter flagged it as a format error (`is_error` with
    metadata `kind: format_error`), or else when its observation matches a malformed-action
    pattern. It is dropped only when a kept turn follows it (the retry): the last kept turn is
    the harness's genuine answer to the trajectory's last action, not a cycle. Dropping only the
    pair keeps everything before it, so the retry's history is the state the environment was
    really in.
    """

    name = "retry_cycle"
    searched: PatternSet  # set in __init__: never None here

    def __init__(self, malformed_action_patterns: Sequence[str]):
        self.searched = PatternSet(malformed_action_patterns)

    def drop(self, trajectory: Trajectory, kept: Sequence[int]) -> TurnDrops:
        turns = trajectory.turns
        drops = []
        for index, retry in zip(kept, kept[1:]):
            turn = turns[index]
            if turn.is_error and turn.metadata.get("kind") == "format_error":
                drops.append((index, f"format error retried at turn {retry}"))
            elif (pattern := self.searched.first_match(turn.observation)) is not None:
                drops.append((index, f"malformed action (observation matches `{pattern}`) retried at turn {retry}"))
        return drops

    def drop_sql(self, con: duckdb.DuckDBPyConnection, relations: Relations) -> str:
        # Failed pairs are few: only their trajectories' kept turns are put in order to find
        # each one's retry.
        return f"""
            WITH flagged AS (
                SELECT trajectory_id, turn_index, NULL AS pattern FROM {relations.turns}
                WHERE is_error AND json_extract_string(metadata, '$.kind') = 'format_error'
                UNION ALL
                SELECT trajectory_id, turn_index, pattern FROM {relations.matches}
            ),
            failed AS (
                SELECT trajectory_id, turn_index, bool_or(pattern IS NULL) AS format_error, max(pattern) AS pattern
                FROM flagged GROUP BY trajectory_id, turn_index
            ),
            followed AS (
                SELECT trajectory_id, turn_index,
                       lead(turn_index) OVER (PARTITION BY trajectory_id ORDER BY turn_index) AS retry
                FROM {relations.turns} SEMI JOIN failed USING (trajectory_id)
            )
            SELECT trajectory_id, turn_index,
                   CASE WHEN format_error THEN 'format error retried at turn ' || retry
                        ELSE 'malformed action (observation matches `' || pattern || '`) retried at turn ' || retry
                   END AS reason
            FROM followed JOIN failed USING (trajectory_id, turn_index)
            WHERE retry IS NOT NULL
        """


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

    def drop_sql(self, con: duckdb.DuckDBPyConnection, relations: Relations) -> str:
        if not self.gui_domains:
            return NO_TURNS
        # A dropped turn shows the same words as the turn before it, so "the previous kept
        # observation" is the previous turn's, and the turn it is unchanged from is the last turn
        # before it that changed something.
        return f"""
            WITH screens AS (
                SELECT trajectory_id, turn_index, {words(newlines_as_spaces("observation"))} AS screen
                FROM {relations.turns} SEMI JOIN (
                    SELECT trajectory_id FROM {relations.trajectories}
                    WHERE {is_one_of("domain", sorted(self.gui_domains))}
                ) USING (trajectory_id)
            ),
            changes AS (
                SELECT trajectory_id, turn_index,
                       screen IS DISTINCT FROM lag(screen) OVER (PARTITION BY trajectory_id ORDER BY turn_index)
                           AS changed
                FROM screens
            ),
            shown AS (
                SELECT trajectory_id, turn_index, changed,
                       max(CASE WHEN changed THEN turn_index END)
                           OVER (PARTITION BY trajectory_id ORDER BY turn_index ROWS UNBOUNDED PRECEDING) AS shown_at
                FROM changes
            )
            SELECT trajectory_id, turn_index, 'observation unchanged from turn ' || shown_at AS reason
            FROM shown WHERE NOT changed
        """
