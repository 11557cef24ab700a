"""The answer cache: table `llm_cache` (migration 4), one row per settled request, written as each
answer arrives.

The key hashes what determines an answer: backend, model, messages, sampling parameters, response
format and sample index. Not the API key (a secret, and it changes nothing), not the base URL (the
same model served on another host or port answers the same; moving a vLLM server must not re-buy
every answer). The flip side: serve different weights under an unchanged model name and the cache
answers for the old ones; give a new checkpoint a new name (vLLM's `--served-model-name`), or a new
path for the transformers backend.

A failed request is recorded with its error (for the record and the stage's report) and retried by
the next run; only answers are served from the cache.
"""

import asyncio
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import duckdb

from pipeline.config.llm import EndpointConfig
from pipeline.llm.chat import ChatRequest, Completion
from pipeline.store.database import Store


def sampling_parameters(endpoint: EndpointConfig) -> dict[str, Any]:
    parameters: dict[str, Any] = {
        "temperature": endpoint.temperature,
        "top_p": endpoint.top_p,
        "max_tokens": endpoint.max_tokens,
        "seed": endpoint.seed,
    }
    # A local model's loop stop shapes its answers; only when on, so answers cached without it keep their keys.
    if endpoint.backend == "transformers" and endpoint.stop_on_repetition is not None:
        parameters["stop_on_repetition"] = endpoint.stop_on_repetition
    # Quantized weights answer otherwise; only when on, so answers of the float model keep their keys.
    if endpoint.backend == "transformers" and endpoint.quantize is not None:
        parameters["quantize"] = endpoint.quantize
    return parameters


def model_key(backend: str, model: str | None) -> str | None:
    """The model as the cache key names it: a served name as is; a local folder of the transformers
    backend by its content (pipeline/training/models.py `model_identity`), not its path, so a moved
    workspace's CPT checkpoint answers from the same entries."""
    if backend != "transformers" or model is None or not Path(model).is_dir():
        return model
    from pipeline.training.models import IDENTITY_FILES, RUN_FINGERPRINT

    files = [Path(model) / name for name in IDENTITY_FILES] + [Path(model).parent / RUN_FINGERPRINT]
    return _folder_key(model, tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.is_file() else None for f in files))


@lru_cache(maxsize=64)
def _folder_key(model: str, stats: tuple) -> str:
    """Once per folder state (`stats`: its identity files' times and sizes): a request record is
    built per request, and a tokenizer file can be megabytes."""
    from pipeline.training.models import model_identity

    return f"local:{model_identity(model)}"


def request_record(endpoint: EndpointConfig, request: ChatRequest) -> dict[str, Any]:
    """Everything that determines the answer (and nothing secret): hashed for the key, stored with it."""
    return {
        "backend": endpoint.backend,
        "model": model_key(endpoint.backend, endpoint.model),
        "messages": [dict(message) for message in request.messages],
        "sampling": sampling_parameters(endpoint),
        "response_format": request.response_format,
        "sample_index": request.sample_index,
        # Only when set, so the keys of every answer cached before the field existed stay valid.
        **({"thinking_budget": request.thinking_budget} if request.thinking_budget is not None else {}),
    }


def cache_key(record: dict[str, Any]) -> str:
    canonical = json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class CachedAnswer:
    text: str
    prompt_tokens: int | None
    completion_tokens: int | None


class AnswerCache:
    def __init__(self, store: Store, role: str, endpoint: EndpointConfig):
        self.store = store
        self.role = role
        self.endpoint = endpoint

    def answers(self, keys: list[str]) -> dict[str, CachedAnswer]:
        """The stored answers among `keys` (failures are not answers: they are retried)."""
        if not keys:
            return {}
        rows = self.store.execute(
            "SELECT key, answer, prompt_tokens, completion_tokens FROM llm_cache "
            "WHERE answer IS NOT NULL AND key IN (SELECT unnest(?::VARCHAR[]))",
            [keys],
        ).fetchall()
        return {key: CachedAnswer(text, prompt, completion) for key, text, prompt, completion in rows}

    def record(self, settled: list["SettledRequest"]) -> None:
        """Persist settled requests in one transaction, as one multi-row statement: DuckDB spends
        milliseconds of CPU per statement, so a row per statement would cap a client near 100
        answers/s. A plain INSERT costs about half of an INSERT OR REPLACE (measured), and a key
        is new in all but one case: a recorded failure being answered by a rerun. Then the insert
        meets the key and the group is written again, replacing."""
        try:
            self._insert(settled, "INSERT")
        except duckdb.ConstraintException:
            self._insert(settled, "INSERT OR REPLACE")

    def _insert(self, settled: list["SettledRequest"], verb: str) -> None:
        rows = [
            [
                item.key,
                self.role,
                self.endpoint.backend,
                self.endpoint.model or "",
                json.dumps(item.request, ensure_ascii=False),
                item.completion.text if item.completion else None,
                item.error,
                item.completion.prompt_tokens if item.completion else None,
                item.completion.completion_tokens if item.completion else None,
                item.attempts,
            ]
            for item in settled
        ]
        placeholders = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now())"] * len(rows))
        with self.store.transaction() as tx:
            tx.execute(f"{verb} INTO llm_cache VALUES {placeholders}", [value for row in rows for value in row])


@dataclass(frozen=True)
class SettledRequest:
    """A request's final outcome: its answer, or the error of its last attempt."""

    key: str
    request: dict[str, Any]
    completion: Completion | None
    error: str | None
    attempts: int


class GroupCommit:
    """Writes settled requests as they arrive, many per transaction; one per `complete` call (its
    futures belong to that call's event loop).

    `write` returns once its rows are committed. While one commit runs (in a thread, so the event
    loop keeps receiving answers), new rows gather for the next: under load a commit carries
    everything that arrived during the previous one, and with one request in flight it carries one.
    """

    def __init__(self, cache: AnswerCache):
        self.cache = cache
        self._waiting: list[tuple[list[SettledRequest], asyncio.Future]] = []
        self._committing: asyncio.Task | None = None

    async def write(self, settled: list[SettledRequest]) -> None:
        committed = asyncio.get_running_loop().create_future()
        self._waiting.append((settled, committed))
        if self._committing is None:
            self._committing = asyncio.create_task(self._commit_all())
        await committed

    async def _commit_all(self) -> None:
        while self._waiting:
            group, self._waiting = self._waiting, []
            try:
                await asyncio.to_thread(self.cache.record, [row for rows, _ in group for row in rows])
            except Exception as exc:  # the store failed: every writer of the group sees it
                for _, committed in group:
                    committed.set_exception(exc)
            else:
                for _, committed in group:
                    committed.set_result(None)
        self._committing = None


def adopt_answers(store: Store, scratch_path: Path) -> int:
    """Copy the answers of a scratch cache (a training process's own DuckDB file: the held-out predictions
    of SFT and RL, made where the store cannot be opened) into the store's cache; returns how many were
    new. A stage's held-out queries are evaluation's first ones (one seeded ranking), asked of the same
    checkpoint in the same format and sampling, so `simulacra evaluate` finds those answers here instead
    of generating them again. Failures are not copied (they are retried where they happened)."""
    if not scratch_path.is_file():
        return 0
    with Store(scratch_path, read_only=True) as scratch:
        rows = scratch.execute(
            "SELECT key, role, backend, model, request::VARCHAR, answer, error, prompt_tokens, completion_tokens, attempts, "
            "created_at FROM llm_cache WHERE answer IS NOT NULL"
        ).fetchall()
    if not rows:
        return 0
    known = {
        key
        for (key,) in store.execute(
            "SELECT key FROM llm_cache WHERE key IN (SELECT unnest(?::VARCHAR[]))", [[row[0] for row in rows]]
        ).fetchall()
    }
    new = [list(row) for row in rows if row[0] not in known]
    if new:
        placeholders = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(new))
        with store.transaction() as tx:
            tx.execute(f"INSERT INTO llm_cache VALUES {placeholders}", [value for row in new for value in row])
    return len(new)
