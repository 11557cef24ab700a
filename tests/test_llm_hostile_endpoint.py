"""An endpoint that answers, but badly: token counts that are not counts, a body that trickles in for
minutes, a Retry-After of a day or of infinity. Each is a real response of tests/openai_server.py's
server on 127.0.0.1; each must end in an answer or a recorded failure within the configured bounds,
never in a crash that loses the group commit or in a client that waits silently for hours."""

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from openai_server import Fault, OpenAIServer

import pipeline.llm.retry
from pipeline.config.llm import EndpointConfig
from pipeline.llm.client import ChatRequest, open_client
from pipeline.store.database import Store

QUESTION = ChatRequest(({"role": "user", "content": "what happens next?"},))

# Without the bounds under test the client would wait for hours; a stuck test fails here instead.
WATCHDOG_S = 30


def endpoint(server: OpenAIServer, **overrides: Any) -> EndpointConfig:
    settings: dict[str, Any] = {
        "backend": "openai",
        "base_url": server.base_url,
        "model": server.model,
        "api_key_env": None,
        "timeout_s": 2.0,
        "max_retries": 1,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
    }
    return EndpointConfig(**(settings | overrides))


def ask(config: EndpointConfig, store: Store, request: ChatRequest = QUESTION):
    """One request through a fresh client, as a stage (or its rerun) asks it; the answer, its
    cache row's attempts, the tally and the seconds it took."""
    client = open_client(config, store, "judge")
    started = time.monotonic()
    [answer] = asyncio.run(asyncio.wait_for(client.complete([request]), WATCHDOG_S))
    elapsed = time.monotonic() - started
    attempts = store.scalar("SELECT attempts FROM llm_cache WHERE key = ?", [answer.key])
    return answer, attempts, client.tally, elapsed


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "store.duckdb") as opened:
        yield opened


# --- usage that is not a token count ---------------------------------------------------------------


class MiscountingServer(OpenAIServer):
    """Answers with `usage.prompt_tokens` set to `prompt_tokens`, whatever JSON value that is."""

    prompt_tokens: Any = None

    def _completion(self, request: dict[str, Any], text: str) -> dict[str, Any]:
        body = super()._completion(request, text)
        body["usage"]["prompt_tokens"] = self.prompt_tokens
        return body


@pytest.mark.parametrize(
    "prompt_tokens",
    ["many", 10**30, 2**31, -5, 1.5, True, [3], {"n": 3}],
    ids=["text", "10^30", "past-int32", "negative", "float", "bool", "list", "object"],
)
def test_a_usage_that_is_no_token_count_is_absent_and_the_answer_kept(store, prompt_tokens):
    with MiscountingServer() as server:
        server.prompt_tokens = prompt_tokens
        answer, attempts, tally, _ = ask(endpoint(server), store)
        assert (answer.text, answer.error, answer.prompt_tokens, attempts) == (
            "echo: what happens next?",
            None,
            None,
            1,
        )
        assert answer.completion_tokens == 4  # the counts that are counts stay (words stand for tokens)
        assert (tally.done, tally.prompt_tokens, tally.completion_tokens) == (1, 0, 4)
        # Committed: the rerun reads it from the store and asks nothing.
        again, _, _, _ = ask(endpoint(server), store)
        assert (again.text, again.cached, again.prompt_tokens) == (answer.text, True, None)
        assert len(server.log) == 1


def test_a_usage_within_int32_is_kept(store):
    with MiscountingServer() as server:
        server.prompt_tokens = 2**31 - 1
        answer, _, _, _ = ask(endpoint(server), store)
        assert answer.prompt_tokens == 2**31 - 1


# --- a body that trickles in -----------------------------------------------------------------------


class TricklingServer(OpenAIServer):
    """The test server with one more fault: the body of its first `trickled` answers comes one byte
    every `byte_interval_s` after prompt headers (a ~300-byte answer takes minutes). Every read of
    the client's gets its byte well within any per-read timeout: only a bound on the whole attempt
    ends it."""

    trickled: int = 1
    byte_interval_s: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._httpd.RequestHandlerClass = _trickling(self._httpd.RequestHandlerClass, self)

    def take_trickle(self) -> bool:
        with self._lock:
            if self.trickled <= 0:
                return False
            self.trickled -= 1
            return True


def _trickling(handler: type, server: TricklingServer) -> type:
    class TricklingHandler(handler):
        def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            if status != 200 or not server.take_trickle():
                super()._send_json(status, payload, headers)
                return
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.flush()
            for byte in body:
                if server._closing.wait(server.byte_interval_s):  # the test is over
                    return
                self.wfile.write(bytes([byte]))  # a client that gave up: BrokenPipeError, quietly dropped
                self.wfile.flush()

    return TricklingHandler


def test_a_body_that_trickles_in_past_timeout_s_is_a_timeout_and_the_retry_answers(store):
    with TricklingServer() as server:
        answer, attempts, tally, elapsed = ask(endpoint(server, timeout_s=2.0, max_retries=1), store)
        assert len(server.log) == 2
    assert (answer.text, answer.error, attempts, tally.retries) == ("echo: what happens next?", None, 2, 1)
    # The trickled body takes minutes (one byte per 0.5 s); a 2 s attempt ends long before.
    assert elapsed < WATCHDOG_S


def test_a_body_that_trickles_in_with_no_retries_left_is_recorded_as_a_timeout(store):
    with TricklingServer() as server:
        answer, attempts, tally, elapsed = ask(endpoint(server, timeout_s=2.0, max_retries=0), store)
    assert answer.text is None and answer.error == "timeout: no answer within 2 s"
    assert (attempts, tally.errors) == (1, {"timeout": 1})
    assert elapsed < WATCHDOG_S


# --- Retry-After beyond reason ---------------------------------------------------------------------


def test_a_retry_after_past_the_cap_waits_the_cap_and_says_so(store, monkeypatch, caplog):
    # The cap (60 s unless backoff_max_s is longer) shortened for the test: the server asks 100,000 s.
    monkeypatch.setattr(pipeline.llm.retry, "RETRY_AFTER_CAP_S", 0.3)
    caplog.set_level(logging.INFO, logger="pipeline.llm.client")
    with OpenAIServer() as server:
        server.faults.append(Fault("rate_limit", retry_after=100000))
        answer, attempts, _, elapsed = ask(endpoint(server), store)
        refused, answered = server.log
    assert (answer.text, attempts) == ("echo: what happens next?", 2)
    assert 0.3 <= answered.started - refused.started < WATCHDOG_S
    [line] = [r.getMessage() for r in caplog.records if "retry 1 of 1" in r.getMessage()]
    assert line.endswith("(the server asked for 100000 s, cut to the 0.3 s cap)")


def test_a_retry_after_up_to_backoff_max_s_is_honoured_whole(store, monkeypatch):
    """`backoff_max_s` longer than the cap raises it: a user who allows long waits gets the server's."""
    monkeypatch.setattr(pipeline.llm.retry, "RETRY_AFTER_CAP_S", 0.05)
    with OpenAIServer() as server:
        server.faults.append(Fault("rate_limit", retry_after=0.6))
        ask(endpoint(server, backoff_max_s=1.0), store)
        refused, answered = server.log
    assert answered.started - refused.started >= 0.6


@pytest.mark.parametrize("retry_after", [float("inf"), float("nan"), -30.0])
def test_a_retry_after_that_is_no_wait_falls_back_to_the_backoff(store, retry_after):
    with OpenAIServer() as server:
        server.faults.append(Fault("rate_limit", retry_after=retry_after))  # sent as `Retry-After: inf`, ...
        answer, attempts, _, elapsed = ask(endpoint(server), store)
        refused, answered = server.log
    assert (answer.text, attempts) == ("echo: what happens next?", 2)
    assert answered.started - refused.started < WATCHDOG_S
