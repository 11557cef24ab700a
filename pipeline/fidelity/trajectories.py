"""Held-out trajectories to roll out: the eval pool's, or the trajectories of benchmark files (`--data`).

Both sources give one `HeldOutSet` of `HeldOutTrajectory`s, so a rollout does not know where they came from.

- The eval pool (`pool_trajectories`): the trajectories of a split snapshot's pool, never trained on. A seeded
  choice of at most `limit`, ranked as SFT's queries are (pipeline/sft/queries.py `query_rank`, here of the
  trajectory id), so a budget takes the same trajectories at every run and a larger budget a superset.
- Benchmark files (`benchmark_trajectories`): every trajectory the format adapters read from the files
  (pipeline/evaluation/benchmark.py), with the row's own system prompt and response marker where the data
  carries them. AgentWorldBench stores a trajectory as one row per scored turn, each stopping at its turn: a
  trajectory whose turns begin a longer one's (same domain and system prompt) is that longer one read again,
  and is read once, as the longest. The same seeded choice under `limit`.

Steps. A trajectory is cut after its first `max_steps` environment turns: a thought turn (schema.THOUGHT, the
agent thinking aloud, answered by the harness) is never a step, as the split never makes it a target, but it
stays in the trajectory, so the history of a later step holds it as the agent saw it. The pool's thought turns
are read from the store's turn metadata, as the split reads them (the snapshot holds the text, not the kind).
"""

import hashlib
import heapq
import json
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.evaluation.benchmark import BenchmarkRead, file_trajectories
from pipeline.sft.queries import query_rank
from pipeline.store.schema import THOUGHT, RecordError, ScoredTurn, SystemPrompt
from pipeline.store.snapshot import read_pool


@dataclass(frozen=True, slots=True)
class HeldOutTrajectory:
    """A held-out trajectory cut for rollout: `steps` are the positions in `turns` of the environment turns
    a simulator is asked, in order; `turns` runs up to the last of them, thought turns included."""

    trajectory_id: str
    domain: str
    system: SystemPrompt
    turns: tuple[ScoredTurn, ...]
    steps: tuple[int, ...]
    environment_turns: int  # before the cut: more than len(steps) where `max_steps` cut the trajectory
    own_system_prompt: str | None = None  # a benchmark row's own system prompt, sent verbatim
    response_marker: str | None = None  # a benchmark's marker, stripped before scoring (as evaluation does)


@dataclass(frozen=True, slots=True)
class HeldOutSet:
    name: str  # what was read, for a report
    trajectories: tuple[HeldOutTrajectory, ...]  # in rank order of the seeded choice
    counts: dict[str, int]  # what reading found


def cut(
    trajectory_id: str,
    domain: str,
    system: SystemPrompt,
    turns: Sequence[ScoredTurn],
    thoughts: Container[int],
    max_steps: int | None,
    own_system_prompt: str | None = None,
    response_marker: str | None = None,
) -> HeldOutTrajectory | None:
    """The trajectory up to its `max_steps`-th environment turn (`thoughts`: positions of thought turns);
    None when it has no environment turn to roll out."""
    environment = [position for position in range(len(turns)) if position not in thoughts]
    steps = environment if max_steps is None else environment[:max_steps]
    if not steps:
        return None
    return HeldOutTrajectory(
        trajectory_id,
        domain,
        system,
        tuple(turns[: steps[-1] + 1]),
        tuple(steps),
        len(environment),
        own_system_prompt,
        response_marker,
    )


def _chosen(trajectories: Iterable[HeldOutTrajectory], limit: int | None, seed: int) -> list[HeldOutTrajectory]:
    """The seeded choice of `limit` (all when None), in rank order; `nsmallest` holds `limit` at a time."""

    def rank(trajectory: HeldOutTrajectory) -> tuple[int, str]:
        return query_rank(seed, trajectory.trajectory_id), trajectory.trajectory_id

    return sorted(trajectories, key=rank) if limit is None else heapq.nsmallest(limit, trajectories, key=rank)


def _steps_words(max_steps: int | None) -> str:
    return "every environment turn" if max_steps is None else f"at most {max_steps} environment turns each"


def thought_turns(store, pool: str) -> set[tuple[str, int]]:
    """(trajectory, turn index) of the pool's kept thought turns, by their metadata as the split reads it."""
    rows = store.execute(
        "SELECT k.trajectory_id, k.turn_index FROM kept_turns k JOIN splits s USING (trajectory_id) "
        "WHERE s.pool = ? AND json_extract_string(k.metadata, '$.kind') = ?",
        [pool, THOUGHT],
    ).fetchall()
    return {(trajectory_id, turn_index) for trajectory_id, turn_index in rows}


def pool_trajectories(
    store, snapshot_dir: Path, limit: int | None, seed: int, max_steps: int | None, pool: str = "eval"
) -> HeldOutSet:
    """The seeded choice of at most `limit` trajectories of the snapshot's `pool`, each cut to `max_steps`."""
    thoughts = thought_turns(store, pool)
    read = 0

    def cut_pool():
        nonlocal read
        for trajectory in read_pool(snapshot_dir, pool):
            read += 1
            positions = {
                position
                for position, turn in enumerate(trajectory.turns)
                if (trajectory.trajectory_id, turn.turn_index) in thoughts
            }
            held_out = cut(
                trajectory.trajectory_id, trajectory.domain, trajectory.system, trajectory.turns, positions, max_steps
            )
            if held_out is not None:
                yield held_out

    chosen = _chosen(cut_pool(), limit, seed)
    return HeldOutSet(
        f"{pool} pool, {len(chosen)} of {read} trajectories (seed {seed}), {_steps_words(max_steps)}",
        tuple(chosen),
        {"trajectories_read": read, "trajectories": len(chosen), "steps": sum(len(t.steps) for t in chosen)},
    )


def _prefix_digests(header: str, turns: Sequence[ScoredTurn]) -> list[str]:
    """The digest of the header and each prefix of the turns, length-prefixed so no two texts share one."""
    running = hashlib.sha256(header.encode())
    digests = []
    for turn in turns:
        for text in (turn.action, turn.observation):
            encoded = text.encode()
            running.update(len(encoded).to_bytes(8, "little") + encoded)
        digests.append(running.hexdigest())
    return digests


def benchmark_trajectories(paths: Sequence[str], limit: int | None, seed: int, max_steps: int | None) -> HeldOutSet:
    """The trajectories of benchmark files, a row that another begins read once (as the longest), a seeded
    choice of at most `limit`, each cut to `max_steps`."""
    read = BenchmarkRead()
    parsed: list[tuple[list[str], HeldOutTrajectory | None]] = []
    for trajectory in file_trajectories(paths, read):
        try:
            trajectory_id = trajectory.content_id()
        except RecordError as exc:
            read.fail(trajectory.location, str(exc))
            continue
        turns = [ScoredTurn(i, t.action, t.observation, "", 1.0) for i, t in enumerate(trajectory.turns)]
        thoughts = {i for i, turn in enumerate(trajectory.turns) if turn.metadata.get("kind") == THOUGHT}
        system_prompt = trajectory.metadata.get("system_prompt")
        own = system_prompt if isinstance(system_prompt, str) else None
        marker = trajectory.metadata.get("response_marker")
        header = json.dumps([trajectory.domain, own, repr(trajectory.system)])
        held_out = cut(
            trajectory_id,
            trajectory.domain,
            trajectory.system,
            turns,
            thoughts,
            max_steps,
            own,
            marker if isinstance(marker, str) else None,
        )
        parsed.append((_prefix_digests(header, turns), held_out))
    begun = {digest for digests, _ in parsed for digest in digests[:-1]}
    kept: dict[str, HeldOutTrajectory | None] = {}
    for digests, held_out in parsed:
        if digests and digests[-1] not in begun:
            kept.setdefault(digests[-1], held_out)
    unique = [held_out for held_out in kept.values() if held_out is not None]
    chosen = _chosen(unique, limit, seed)
    counts = {
        "records_read": read.records_read,
        "records_failed": read.records_failed,
        "trajectories_read": len(parsed),
        "repeated": len(parsed) - len(kept),  # the same trajectory again, or a row a longer one begins
        "without_steps": len(kept) - len(unique),  # thought turns only: nothing to roll out
        "trajectories": len(chosen),
        "steps": sum(len(t.steps) for t in chosen),
    }
    failures = f"; e.g. {read.failures[0]}" if read.failures else ""
    name = (
        f"{', '.join(paths)} ({read.records_read} records, {read.records_failed} failed to parse{failures}), "
        f"{len(chosen)} of {len(unique)} trajectories (seed {seed}), {_steps_words(max_steps)}"
    )
    return HeldOutSet(name, tuple(chosen), counts)
