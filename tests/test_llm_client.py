"""The LLM client against a real OpenAI-protocol server on 127.0.0.1: answers in order, the answer
cache (what is in its key, what a rerun sends), bounded concurrency, usage and the failure check."""

import asyncio
import json

import pytest
from openai_server import Fault, OpenAIServer

from pipeline.config.llm import EndpointConfig
from pipeline.llm.cache import cache_key, request_record
from pipeline.llm.client import ChatRequest, EndpointFailed, open_client
from pipeline.llm.tally import RequestTally
from pipeline.store.database import Store


def ask(text: str, sample_index: int = 0, response_format: dict | None = None) -> ChatRequest:
    return ChatRequest(({"role": "user", "content": text},), sample_index, response_format)


def endpoint(server: OpenAIServer, **fields) -> EndpointConfig:
    defaults = dict(
        backend="openai",
        base_url=server.base_url,
        model=server.model,
        api_key_env=None,
        timeout_s=2.0,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
    )
    return EndpointConfig(**{**defaults, **fields})


@pytest.fixture
def server():
    with OpenAIServer() as running:
        yield running


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "store.duckdb") as opened:
        yield opened


def test_answers_come_back_in_request_order_and_are_stored(server, store):
    client = open_client(endpoint(server), store, "judge")
    answers = client.complete_sync([ask(f"question {i}") for i in range(10)])
    assert [a.text for a in answers] == [f"echo: question {i}" for i in range(10)]
    assert not any(a.cached or a.error for a in answers)
    rows = store.rows("SELECT key, role, backend, model, answer, error, attempts FROM llm_cache ORDER BY answer")
    assert len(rows) == 10
    assert {(r["role"], r["backend"], r["model"], r["error"], r["attempts"]) for r in rows} == {
        ("judge", "openai", "test-model", None, 1)
    }
    assert {r["key"] for r in rows} == {a.key for a in answers}


def test_a_rerun_sends_no_request_whose_answer_is_stored(server, store):
    requests = [ask(f"question {i}") for i in range(6)]
    open_client(endpoint(server), store, "judge").complete_sync(requests[:4])
    sent = len(server.log)
    rerun = open_client(endpoint(server), store, "judge")
    answers = rerun.complete_sync(requests)
    assert len(server.log) == sent + 2  # only the two new ones
    assert [a.cached for a in answers] == [True] * 4 + [False] * 2
    assert [a.text for a in answers] == [f"echo: question {i}" for i in range(6)]
    assert (rerun.tally.cached, rerun.tally.done, rerun.tally.requests) == (4, 2, 6)


def test_identical_requests_in_one_call_are_sent_once(server, store):
    answers = open_client(endpoint(server), store, "judge").complete_sync([ask("same")] * 3)
    assert len(server.log) == 1
    assert len({a.key for a in answers}) == 1 and all(a.text == "echo: same" for a in answers)


def test_samples_of_one_prompt_are_distinct_requests_with_distinct_seeds(server, store):
    client = open_client(endpoint(server, seed=100), store, "generator")
    answers = client.complete_sync([ask("prompt", k) for k in range(3)])
    assert len({a.key for a in answers}) == 3
    assert sorted(entry.body["seed"] for entry in server.log) == [100, 101, 102]


def test_sampling_parameters_and_response_format_are_sent_as_configured(server, store):
    schema = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": {"type": "object"}}}
    config = endpoint(server, temperature=0.7, top_p=0.9, max_tokens=33)
    open_client(config, store, "judge").complete_sync([ask("q", response_format=schema)])
    body = server.log[0].body
    assert (body["model"], body["temperature"], body["top_p"], body["max_tokens"]) == ("test-model", 0.7, 0.9, 33)
    assert body["response_format"] == schema
    assert "seed" not in body  # seed None: unseeded


BASE = EndpointConfig(backend="openai", base_url="http://a:8000/v1", model="m")


@pytest.mark.parametrize(
    "change, request_change, new_key",
    [
        ({"model": "other"}, {}, True),
        ({"temperature": 0.5}, {}, True),
        ({"top_p": 0.5}, {}, True),
        ({"max_tokens": 7}, {}, True),
        ({"seed": 3}, {}, True),
        ({"backend": "transformers"}, {}, True),
        ({}, {"text": "another question"}, True),
        ({}, {"sample_index": 1}, True),
        ({}, {"response_format": {"type": "json_object"}}, True),
        # The same model served elsewhere answers the same: no new key for where or how we ask.
        ({"base_url": "http://b:9000/v1"}, {}, False),
        ({"api_key_env": "OTHER_KEY"}, {}, False),
        ({"api_key_secret": "a-block"}, {}, False),
        ({"concurrency": 1, "timeout_s": 5, "max_retries": 0}, {}, False),
    ],
)
def test_what_the_cache_key_depends_on(change, request_change, new_key):
    request = {"text": "question", "sample_index": 0, "response_format": None} | request_change
    key = cache_key(request_record(BASE.model_copy(update=change), ask(**request)))
    assert (key != cache_key(request_record(BASE, ask("question")))) is new_key


def test_no_more_requests_in_flight_than_the_concurrency(store):
    with OpenAIServer(latency_s=0.2) as server:  # long enough for all 4 to be sent on a loaded machine
        open_client(endpoint(server, concurrency=4), store, "judge").complete_sync([ask(str(i)) for i in range(24)])
        spans = [(e.started, e.finished) for e in server.log]
    most = max(sum(1 for s, f in spans if s <= t < f) for t, _ in spans)
    assert most == 4


def test_usage_is_tallied_when_the_endpoint_reports_it(server, store):
    client = open_client(endpoint(server), store, "judge")
    answers = client.complete_sync([ask("one two three"), ask("four")])
    # The test server counts words: prompt 3 and 1, answers "echo: one two three" (4) and "echo: four" (2).
    assert [(a.prompt_tokens, a.completion_tokens) for a in answers] == [(3, 4), (1, 2)]
    assert (client.tally.prompt_tokens, client.tally.completion_tokens) == (4, 6)
    assert client.tally.line() == "2 done, 0 cached, 0 failed, 4 tokens in, 6 out"


def test_a_recorded_failure_is_retried_by_the_next_run(server, store):
    server.faults.append(Fault("server_error"))
    first = open_client(endpoint(server, max_retries=0), store, "judge").complete_sync([ask("q")])
    assert first[0].text is None and first[0].error.startswith("http 500: ")
    assert store.scalar("SELECT error FROM llm_cache") == first[0].error
    second = open_client(endpoint(server, max_retries=0), store, "judge").complete_sync([ask("q")])
    assert (second[0].text, second[0].cached) == ("echo: q", False)
    assert store.rows("SELECT answer, error FROM llm_cache") == [{"answer": "echo: q", "error": None}]


@pytest.mark.parametrize(
    "failures, limit, raises",
    [(0, 0.0, False), (1, 0.25, False), (3, 0.5, True), (4, 0.99, True), (4, 1.0, False)],
)
def test_the_stage_fails_past_the_failed_fraction_naming_endpoint_and_commonest_error(
    server, store, failures, limit, raises
):
    server.faults.extend([Fault("server_error")] + [Fault("unavailable")] * (failures - 1) if failures else [])
    client = open_client(endpoint(server, max_retries=0, max_failed_fraction=limit), store, "sft.judge")
    client.complete_sync([ask(str(i)) for i in range(4)])
    assert client.tally.failed == failures
    if not raises:
        client.check_failures()
        return
    with pytest.raises(EndpointFailed) as failed:
        client.check_failures()
    message = str(failed.value)
    assert f"{failures} of 4 requests" in message and server.base_url in message
    assert f"commonest error: http 503 ({failures - 1} times)" in message


def test_complete_runs_in_an_event_loop_of_the_caller(server, store):
    client = open_client(endpoint(server), store, "judge")

    async def twice():
        first = await client.complete([ask("a")])
        second = await client.complete([ask("a"), ask("b")])
        return first + second

    answers = asyncio.run(twice())
    assert [(a.text, a.cached) for a in answers] == [("echo: a", False), ("echo: a", True), ("echo: b", False)]
    assert json.loads(store.scalar("SELECT request FROM llm_cache LIMIT 1"))["model"] == "test-model"


@pytest.mark.parametrize(
    "tally, line",
    [
        (RequestTally(done=2, cached=1, failed=1), "2 done, 1 cached, 1 failed"),
        (
            RequestTally(done=2, prompt_tokens=10, completion_tokens=4),
            "2 done, 0 cached, 0 failed, 10 tokens in, 4 out",
        ),
    ],
)
def test_the_progress_line_shows_tokens_once_usage_is_reported(tally, line):
    assert tally.line() == line


def test_a_base_url_without_v1_is_named_in_the_404(server, store):
    """Found by probing: `http://host:8000` for an OpenAI-compatible server failed every request with "http 404: no
    route /chat/completions", naming no setting."""
    client = open_client(endpoint(server, base_url=server.base_url.removesuffix("/v1"), max_retries=0), store, "judge")
    [answer] = client.complete_sync([ask("ls")])
    assert answer.text is None and "http 404" in answer.error
    assert f"base_url {server.base_url.removesuffix('/v1')} has no /v1" in answer.error
    with pytest.raises(EndpointFailed, match="has no /v1"):
        client.check_failures()
