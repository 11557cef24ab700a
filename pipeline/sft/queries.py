"""Queries: one target turn of a pool, with its system prompt, its kept history and its action.

The reference is the turn's real observation. The history is the most recent whole kept turns that
fit in `max_history_chars` (actions and observations counted), so a generator and the training
sample see the same context. Which queries a run samples is a seeded choice: ranked by
blake2b(seed:query_id), smallest first, so a budget takes the same queries at every run and a
larger budget takes a superset.

Runs of one task often open alike (three runs of a tool-call task make the same first calls and get
the same answers), so two target turns can be one query: the same system prompt, history, action and
observation. A measuring set (the validation targets, the eval pool) asks each query once
(`distinct_queries`): a repeat would count one answer twice and narrow its interval for nothing.
"""

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import UserFixableError
from pipeline.store.schema import ScoredTurn, SystemPrompt
from pipeline.store.snapshot import read_pool


@dataclass(frozen=True, slots=True)
class Query:
    trajectory_id: str
    turn_index: int
    domain: str
    system: SystemPrompt
    history: tuple[ScoredTurn, ...]
    action: str
    reference: str
    history_left_out: int  # earlier kept turns that did not fit in max_history_chars

    @property
    def query_id(self) -> str:
        return query_id(self.trajectory_id, self.turn_index)


def chat_messages(query: Query, system: str) -> tuple[dict[str, str], ...]:
    """A query as a chat: the system prompt, the kept history as user (action) / assistant (observation)
    turns, then the action: how every model of the project is asked for the next observation."""
    messages = [{"role": "system", "content": system}]
    for turn in query.history:
        messages += [{"role": "user", "content": turn.action}, {"role": "assistant", "content": turn.observation}]
    messages.append({"role": "user", "content": query.action})
    return tuple(messages)


def query_id(trajectory_id: str, turn_index: int) -> str:
    return f"{trajectory_id}:{turn_index}"


def query_rank(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}\x1f{key}".encode(), digest_size=8).digest(), "big")


def choose_targets(targets: Iterable[tuple[str, int]], limit: int | None, seed: int) -> list[tuple[str, int]]:
    """The seeded choice of `limit` targets (all when None), in rank order."""
    ranked = sorted(targets, key=lambda target: (query_rank(seed, query_id(*target)), target))
    return ranked if limit is None else ranked[:limit]


def content_key(query: Query) -> str:
    """What the model is shown and scored against, whatever trajectory the turn came from."""
    shown = (
        query.domain,
        repr(query.system),
        [(turn.action, turn.observation) for turn in query.history],
        query.action,
        query.reference,
    )
    return hashlib.sha256(json.dumps(shown).encode()).hexdigest()


def distinct_queries(
    snapshot_dir: Path, pool: str, ranked: list[tuple[str, int]], limit: int | None, max_history_chars: int
) -> tuple[list[Query], int]:
    """The first `limit` queries of `ranked` (all when None) that repeat no earlier one's content, in rank
    order, and how many repeats were passed over on the way. A repeat's place goes to the next in rank, so
    a budget still asks `limit` queries where the pool has them; only as many are loaded as that takes."""
    chosen: list[Query] = []
    keys: set[str] = set()
    repeats = 0
    start = 0
    wanted = len(ranked) if limit is None else limit
    while len(chosen) < wanted and start < len(ranked):
        batch = ranked[start : start + wanted - len(chosen)]
        start += len(batch)
        for query in load_queries(snapshot_dir, pool, batch, max_history_chars):
            key = content_key(query)
            if key in keys:
                repeats += 1
                continue
            keys.add(key)
            chosen.append(query)
    return chosen, repeats


def kept_history(earlier: list[ScoredTurn], max_chars: int) -> tuple[tuple[ScoredTurn, ...], int]:
    """The most recent whole turns within `max_chars`, and how many earlier ones were left out."""
    kept: list[ScoredTurn] = []
    used = 0
    for turn in reversed(earlier):
        size = len(turn.action) + len(turn.observation)
        if used + size > max_chars:
            break
        kept.append(turn)
        used += size
    kept.reverse()
    return tuple(kept), len(earlier) - len(kept)


def query_at(
    trajectory_id: str,
    domain: str,
    system: SystemPrompt,
    earlier: list[ScoredTurn],
    turn: ScoredTurn,
    max_history_chars: int | None,
) -> Query:
    """`turn` as a query, its history the `earlier` turns kept within `max_history_chars` (None: all of them)."""
    history, left_out = (tuple(earlier), 0) if max_history_chars is None else kept_history(earlier, max_history_chars)
    return Query(trajectory_id, turn.turn_index, domain, system, history, turn.action, turn.observation, left_out)


def load_queries(snapshot_dir: Path, pool: str, chosen: list[tuple[str, int]], max_history_chars: int) -> list[Query]:
    """The chosen targets of `pool` as queries, in the order of `chosen`."""
    wanted: dict[str, set[int]] = {}
    for trajectory_id, turn_index in chosen:
        wanted.setdefault(trajectory_id, set()).add(turn_index)
    found: dict[tuple[str, int], Query] = {}
    for trajectory in read_pool(snapshot_dir, pool):
        indices = wanted.get(trajectory.trajectory_id)
        if not indices:
            continue
        for position, turn in enumerate(trajectory.turns):
            if turn.turn_index not in indices:
                continue
            found[(trajectory.trajectory_id, turn.turn_index)] = query_at(
                trajectory.trajectory_id,
                trajectory.domain,
                trajectory.system,
                trajectory.turns[:position],
                turn,
                max_history_chars,
            )
    missing = [target for target in chosen if target not in found]
    if missing:
        raise UserFixableError(
            f"{len(missing)} target turn(s) of pool '{pool}' are not kept turns of the snapshot (e.g. trajectory "
            f"{missing[0][0]} turn {missing[0][1]}): rerun `simulacra split`"
        )
    return [found[target] for target in chosen]
