"""Read the trajectories the filter has not judged yet, as `Trajectory` objects, batch by batch.

`turns` has no index on trajectory_id (ingest's bulk inserts skip one), so a query per batch would
scan the whole table every time, and sorting a million turns by trajectory costs more than
judging them. Instead the turns of every unjudged trajectory are read in one streaming pass, in
storage order (ingest writes a trajectory's turns together), through Arrow; a trajectory is
complete once its `num_turns` turns have arrived, and complete trajectories are handed out in
batches with their header columns (one set-based query per batch). Turn positions are the stored
`turn_index` (ingest writes 0..n-1).

The stream runs on its own cursor, a snapshot taken before the caller writes anything, so the
caller may commit judgements for one batch while the next is still being read.
"""

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import orjson
import pyarrow as pa

from pipeline.schema import SystemPrompt, Trajectory, Turn
from pipeline.store import Store

TURN_ROWS_PER_READ = 65_536

_UNJUDGED = "ANTI JOIN filter_state USING (trajectory_id)"
_HEADER_COLUMNS = (
    "trajectory_id", "source", "format", "domain", "task", "task_description", "action_space", "tools",
    "initial_state", "demonstrations", "simulation_instructions", "outcome_reward", "metadata", "location",
)


def count_unjudged(store: Store) -> int:
    return store.scalar(f"SELECT count(*) FROM trajectories {_UNJUDGED}")


def unjudged_batches(store: Store, batch_trajectories: int) -> Iterator[list[tuple[str, Trajectory]]]:
    """(trajectory id, trajectory) for every trajectory without a `filter_state` row, in batches
    of `batch_trajectories` (the last one smaller)."""
    con = store.connection
    expected = dict(con.execute(f"SELECT trajectory_id, num_turns FROM trajectories {_UNJUDGED}").fetchall())
    if not expected:
        return
    reading = con.cursor()
    try:
        stream = reading.sql(
            "SELECT trajectory_id, turn_index, action, observation, tool_name, is_error, metadata FROM turns "
            f"SEMI JOIN (SELECT trajectory_id FROM trajectories {_UNJUDGED}) USING (trajectory_id)"
        ).to_arrow_reader(TURN_ROWS_PER_READ)
        arriving: dict[str, list[tuple[int, Turn]]] = {}
        complete: list[str] = []
        handed_out: set[str] = set()
        for chunk in stream:
            columns = [chunk.column(i).to_pylist() for i in range(chunk.num_columns)]
            for owner, index, action, observation, tool_name, is_error, metadata in zip(*columns):
                turns = arriving.get(owner)
                if turns is None:
                    if owner in handed_out:
                        continue  # more turns than num_turns says (a hand-edited store): judged already
                    turns = arriving[owner] = []
                metadata = orjson.loads(metadata) if metadata else {}
                turns.append((index, Turn(action, observation, tool_name, is_error, metadata)))
                if len(turns) == expected[owner]:
                    complete.append(owner)
            while len(complete) >= batch_trajectories:
                batch, complete = complete[:batch_trajectories], complete[batch_trajectories:]
                handed_out.update(batch)
                yield _assemble(store, batch, arriving)
    finally:
        reading.close()
    # Whatever did not complete (turns missing from a hand-edited store) is judged as it stands.
    rest = [owner for owner in expected if owner not in handed_out]
    for start in range(0, len(rest), batch_trajectories):
        yield _assemble(store, rest[start : start + batch_trajectories], arriving)


def _assemble(
    store: Store, ids: list[str], arriving: dict[str, list[tuple[int, Turn]]]
) -> list[tuple[str, Trajectory]]:
    """The trajectories of `ids`, in that order, their turns taken out of `arriving`."""
    con = store.connection
    con.register("assembling_ids", pa.table({"trajectory_id": pa.array(ids, pa.string())}))
    try:
        header = con.sql(
            f"SELECT {', '.join(_HEADER_COLUMNS)} FROM trajectories SEMI JOIN assembling_ids USING (trajectory_id)"
        ).to_arrow_table()
    finally:
        con.unregister("assembling_ids")
    built: dict[str, Trajectory] = {}
    for row in zip(*(header.column(name).to_pylist() for name in _HEADER_COLUMNS)):
        (trajectory_id, source, format_name, domain, task, task_description, action_space, tools, initial_state,
         demonstrations, simulation_instructions, outcome_reward, metadata, location) = row
        numbered = arriving.pop(trajectory_id, [])
        numbered.sort(key=_turn_index)
        built[trajectory_id] = Trajectory(
            source=source,
            domain=domain,
            turns=[turn for _, turn in numbered],
            system=SystemPrompt(
                task_description=task_description,
                action_space=action_space,
                tools=list(_tools(tools)),
                initial_state=initial_state,
                demonstrations=demonstrations,
                simulation_instructions=simulation_instructions,
            ),
            task=task,
            outcome_reward=outcome_reward,
            metadata=orjson.loads(metadata) if metadata else {},
            format=format_name,
            location=location,
        )
    return [(trajectory_id, built[trajectory_id]) for trajectory_id in ids]


def _turn_index(numbered: tuple[int, Turn]) -> int:
    return numbered[0]


@lru_cache(maxsize=256)
def _tools(text: str | None) -> tuple[dict[str, Any], ...]:
    """Decoded once per distinct tools list: a source's trajectories usually share one, so they
    also share its dicts (read them only)."""
    return tuple(orjson.loads(text)) if text else ()
