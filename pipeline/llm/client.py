"""`ChatClient`: the one way a stage asks a model (issue 10).

`complete(requests)` answers a list of requests in order:
1. each request's cache key (pipeline/llm/cache.py); identical requests in one call are asked once;
2. answers already in the store are returned as they are: no request is sent for them;
3. the rest go to the backend in batches (1 per HTTP request for `openai`, `batch_size` prompts of
   similar length per `generate` for `transformers`), at most `max_in_flight` at once;
4. a failed attempt is retried by the policy of pipeline/llm/retry.py (backoff with jitter,
   Retry-After honoured up to a cap), holding its slot while it waits so a rate-limited server is
   not met by the next request instead;
5. each settled request (answer, or error after the last retry) is committed to the store before
   its slot is given back (group commit: answers arriving during one commit share the next), so at
   most `max_in_flight` batches are answered but uncommitted at any moment. A killed run loses
   only those: the server may have answered them, this process never committed them, and the
   rerun asks them again. Nothing committed is ever asked again.
A failed request never raises: it comes back with `text=None` and its `error`, and counts in the
tally; `check_failures()` turns too many of them into `EndpointFailed`. A failure is recorded but is
not an answer: the next run asks it again. Every answer and error text is redacted
(pipeline/llm/credentials.py) before anything sees it: the store, the log, the acceptor, the stage.
"""

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.config.llm import EndpointConfig
from pipeline.errors import UserFixableError
from pipeline.llm.cache import AnswerCache, GroupCommit, SettledRequest, cache_key, request_record
from pipeline.llm.chat import ChatAnswer, ChatRequest, Completion
from pipeline.llm.credentials import api_key, public_url, redact
from pipeline.llm.retry import EndpointError, RetryPolicy
from pipeline.llm.tally import RequestTally
from pipeline.progress import progress_bar
from pipeline.store.database import Store

__all__ = ["ChatAnswer", "ChatClient", "ChatRequest", "EndpointFailed", "open_client"]

log = logging.getLogger(__name__)

# Judges an answer's text: None to accept it, else the reason it is unusable (e.g. a judge score out
# of range). A rejected answer is retried like a failed attempt, then recorded as failed.
Acceptor = Callable[[str], str | None]


class EndpointFailed(UserFixableError):
    """More than `max_failed_fraction` of a stage's requests failed: the user fixes the endpoint (its
    URL, its key, the server) and reruns; the failed requests are asked again."""


class Backend(Protocol):
    name: str
    batch_size: int
    max_in_flight: int

    def connect(self) -> Any: ...  # async context manager yielding send(list[ChatRequest]) -> list[Completion]


@dataclass
class _Pending:
    key: str
    request: ChatRequest
    record: dict[str, Any]
    attempts: int = 0


class ChatClient:
    def __init__(self, endpoint: EndpointConfig, store: Store, role: str, backend: Backend, rng: random.Random):
        self.endpoint = endpoint
        self.role = role
        self.backend = backend
        self.cache = AnswerCache(store, role, endpoint)
        self.policy = RetryPolicy(endpoint.max_retries, endpoint.backoff_initial_s, endpoint.backoff_max_s)
        self.tally = RequestTally()
        self._rng = rng

    def __repr__(self) -> str:
        return f"ChatClient({self.role!r}, {self.describe()})"

    def describe(self) -> str:
        """The endpoint as messages name it: no key, no credentials in the URL."""
        if self.endpoint.backend == "openai":
            url = public_url(self.endpoint.base_url or "https://api.openai.com/v1")
            return f"openai endpoint {url} model {self.endpoint.model}"
        return f"transformers model {self.endpoint.model}"

    def complete_sync(self, requests: Sequence[ChatRequest], accept: Acceptor | None = None) -> list[ChatAnswer]:
        return asyncio.run(self.complete(requests, accept))

    async def complete(self, requests: Sequence[ChatRequest], accept: Acceptor | None = None) -> list[ChatAnswer]:
        records = [request_record(self.endpoint, request) for request in requests]
        keys = [cache_key(record) for record in records]
        settled: dict[str, ChatAnswer] = {}
        for key, answer in self.cache.answers(sorted(set(keys))).items():
            if accept is not None and accept(answer.text) is not None:
                # Stored before its caller checked answers (a judge's garbage, found by probing: it was reused by
                # every rerun, the stage poisoned for good): asked again, as a failed request is.
                continue
            settled[key] = ChatAnswer(key, answer.text, None, True, answer.prompt_tokens, answer.completion_tokens)
        pending: dict[str, _Pending] = {}
        for key, request, record in zip(keys, requests, records):
            if key not in settled and key not in pending:
                pending[key] = _Pending(key, request, record)
        self.tally.requests += len(settled) + len(pending)
        self.tally.cached += len(settled)

        with progress_bar(self.role, total=len(settled) + len(pending), done=len(settled)) as advance:
            advance(0, status=self.tally.line())
            if pending:
                queue = list(pending.values())
                size = self.backend.batch_size
                if size > 1:  # prompts of similar length share a batch: less padding to compute
                    queue.sort(key=lambda item: sum(len(m["content"]) for m in item.request.messages))
                batches = iter([queue[i : i + size] for i in range(0, len(queue), size)])
                writer = GroupCommit(self.cache)  # of this call's event loop
                async with self.backend.connect() as send:

                    async def slot() -> None:
                        # `max_in_flight` of these share one iterator: each batch is taken once,
                        # and a million requests are never a million waiting tasks.
                        for batch in batches:
                            answered = await self._settle(batch, send, writer, accept)
                            for item, answer in answered:
                                settled[item.key] = answer
                            # A batch's answers arrive together: advanced one by one, the log's line came at the
                            # second of 24, "2/24 ... eta 6:23 (24 done ...)", as the bar was about to end.
                            advance(len(answered), status=self.tally.line())

                    await asyncio.gather(*(slot() for _ in range(self.backend.max_in_flight)))
        return [settled[key] for key in keys]

    async def _settle(
        self, batch: list[_Pending], send: Callable, writer: GroupCommit, accept: Acceptor | None
    ) -> list[tuple[_Pending, ChatAnswer]]:
        """Attempts `batch` until each item has an answer or has spent its retries, then commits
        the outcomes before giving back its slot (at most `max_in_flight` batches are ever
        answered but uncommitted)."""
        outcomes: list[tuple[_Pending, Completion | EndpointError]] = []
        remaining = batch
        retry = 0
        while remaining:
            attempts = await self._attempt(remaining, send, accept)
            again: list[tuple[_Pending, EndpointError]] = []
            for item, outcome in zip(remaining, attempts):
                item.attempts += 1
                if isinstance(outcome, EndpointError) and outcome.retryable and retry < self.policy.max_retries:
                    again.append((item, outcome))
                else:
                    outcomes.append((item, outcome))
            if again:
                error = again[0][1]
                wait = self.policy.wait_s(retry, error.retry_after_s, self._rng)
                # A wait shorter than the server asked is the client's choice: said in the retry's line,
                # so the refusal that may follow does not read as the client ignoring the server.
                cut = (
                    f" (the server asked for {error.retry_after_s:g} s, cut to the {self.policy.retry_after_cap_s:g} s cap)"
                    if self.policy.cuts(error.retry_after_s)
                    else ""
                )
                # A warning: at info no handler showed it under `simulacra <stage>`, and five capped waits of a
                # minute read as a hang (found by probing).
                log.warning(
                    "%s: %d request(s) failed with %s; retry %d of %d in %.2f s%s",
                    self.role,
                    len(again),
                    error.kind,
                    retry + 1,
                    self.policy.max_retries,
                    wait,
                    cut,
                )
                self.tally.retries += len(again)
                await asyncio.sleep(wait)
                retry += 1
            remaining = [item for item, _ in again]
        await writer.write([self._settled(item, outcome) for item, outcome in outcomes])
        return [(item, self._answer(item, outcome)) for item, outcome in outcomes]

    async def _attempt(
        self, items: list[_Pending], send: Callable, accept: Acceptor | None
    ) -> list[Completion | EndpointError]:
        try:
            completions = await send([item.request for item in items])
        except EndpointError as error:
            return [EndpointError(error.kind, redact(error.detail), error.retryable, error.retry_after_s)] * len(items)
        outcomes: list[Completion | EndpointError] = []
        for completion in completions:
            # An echoed Authorization header (a debugging proxy) must not reach the store or a judge.
            completion = Completion(redact(completion.text), completion.prompt_tokens, completion.completion_tokens)
            reason = accept(completion.text) if accept else None
            outcomes.append(completion if reason is None else EndpointError("rejected answer", reason, retryable=True))
        return outcomes

    @staticmethod
    def _settled(item: _Pending, outcome: Completion | EndpointError) -> SettledRequest:
        if isinstance(outcome, Completion):
            return SettledRequest(item.key, item.record, outcome, None, item.attempts)
        return SettledRequest(item.key, item.record, None, str(outcome), item.attempts)

    def _answer(self, item: _Pending, outcome: Completion | EndpointError) -> ChatAnswer:
        """The answer as returned, counted in the tally (once committed)."""
        if isinstance(outcome, Completion):
            self.tally.done += 1
            self.tally.prompt_tokens += outcome.prompt_tokens or 0
            self.tally.completion_tokens += outcome.completion_tokens or 0
            return ChatAnswer(item.key, outcome.text, None, False, outcome.prompt_tokens, outcome.completion_tokens)
        self.tally.failed += 1
        self.tally.errors[outcome.kind] += 1
        self.tally.examples.setdefault(outcome.kind, outcome.detail)
        log.warning("%s: request failed after %d attempt(s): %s", self.role, item.attempts, outcome)
        return ChatAnswer(item.key, None, str(outcome), False, None, None)

    def check_failures(self) -> None:
        """Raise `EndpointFailed` when more than `max_failed_fraction` of the requests failed."""
        if self.tally.failed_fraction <= self.endpoint.max_failed_fraction:
            return
        kind, count = self.tally.commonest_error() or ("unknown", 0)
        example = self.tally.examples.get(kind, "")
        raise EndpointFailed(
            f"{self.role}: {self.tally.failed} of {self.tally.requests} requests to {self.describe()} failed "
            f"({self.tally.failed_fraction:.0%}, more than max_failed_fraction {self.endpoint.max_failed_fraction:.0%}); "
            f"commonest error: {kind} ({count} times): {' '.join(example.split())[:300]}; "
            f"fix the endpoint{self._key_hint()} and rerun: failed requests are asked again"
        )

    def _key_hint(self) -> str:
        if self.endpoint.backend != "openai":
            return ""
        if self.endpoint.api_key_secret:
            return f" or the key in Prefect Secret block {self.endpoint.api_key_secret!r}"
        return f" or the key in ${self.endpoint.api_key_env}" if self.endpoint.api_key_env else ""


def open_client(endpoint: EndpointConfig, store: Store, role: str, seed: int = 0) -> ChatClient:
    """A client for `endpoint` writing its cache to `store` under `role` (e.g. "sft.judge").

    For `transformers`, `endpoint.model` must already be resolved (the stage puts the CPT
    checkpoint there when the config leaves it None). `seed` drives the retry jitter only.
    """
    if endpoint.backend == "openai":
        from pipeline.llm.openai_backend import OpenAIBackend

        backend: Backend = OpenAIBackend(endpoint, api_key(endpoint))
    else:
        if not endpoint.model:
            raise ValueError(
                f"{role}: the transformers backend needs `model` (the stage resolves None to the CPT checkpoint)"
            )
        from pipeline.llm.transformers_backend import TransformersBackend

        backend = TransformersBackend(endpoint)
    return ChatClient(endpoint, store, role, backend, random.Random(seed))
