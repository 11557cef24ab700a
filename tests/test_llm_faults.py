"""Every fault the issue lists ends in a retry or a recorded failure, against a real server on
127.0.0.1; and the retry policy's waits (backoff with jitter, Retry-After)."""

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from openai_server import Fault, OpenAIServer

from pipeline.config.llm import EndpointConfig
from pipeline.llm.chat import Completion
from pipeline.llm.client import ChatRequest, open_client
from pipeline.llm.openai_backend import completion_of, retry_after_s
from pipeline.llm.retry import RETRY_AFTER_CAP_S, EndpointError, RetryPolicy
from pipeline.store.database import Store

QUESTION = ChatRequest(({"role": "user", "content": "rate this"},))


def judge_score(request: dict) -> str:
    return "score: 7"


def in_range(text: str) -> str | None:
    """A judge's acceptor: scores run from 1 to 10."""
    score = int(text.removeprefix("score: "))
    return None if 1 <= score <= 10 else f"score {score} outside 1..10"


@pytest.fixture
def server():
    # hang_s well past the client's timeout: a hung request must end by the client's clock.
    with OpenAIServer(answer=judge_score, hang_s=10) as running:
        yield running


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "store.duckdb") as opened:
        yield opened


def run(server, store, fault: Fault, max_retries: int):
    server.faults.append(fault)
    config = EndpointConfig(
        backend="openai",
        base_url=server.base_url,
        model=server.model,
        api_key_env=None,
        timeout_s=0.5,
        max_retries=max_retries,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
    )
    client = open_client(config, store, "judge")
    [answer] = client.complete_sync([QUESTION], accept=in_range)
    attempts = store.scalar("SELECT attempts FROM llm_cache WHERE key = ?", [answer.key])
    return answer, attempts, client.tally


FAULTS = [
    # fault,                                  kind the failure is recorded under
    (Fault("rate_limit", retry_after=0.2), "http 429"),
    (Fault("server_error"), "http 500"),
    (Fault("unavailable"), "http 503"),
    (Fault("hang"), "timeout"),
    (Fault("reset"), "connection"),
    (Fault("truncated"), "malformed response"),
    (Fault("empty_choices"), "empty choices"),
    (Fault("answer", text="score: 11"), "rejected answer"),
]


@pytest.mark.parametrize("fault, kind", FAULTS, ids=[f.kind for f, _ in FAULTS])
def test_a_transient_fault_is_retried_and_the_retry_answers(server, store, fault, kind):
    answer, attempts, tally = run(server, store, fault, max_retries=2)
    assert (answer.text, answer.error, attempts) == ("score: 7", None, 2)
    assert (tally.done, tally.failed, tally.retries) == (1, 0, 1)
    assert [entry.outcome for entry in server.log] == [fault.kind, "answered"]


@pytest.mark.parametrize("fault, kind", FAULTS, ids=[f.kind for f, _ in FAULTS])
def test_a_fault_with_no_retries_left_is_recorded_as_failed_and_the_stage_goes_on(server, store, fault, kind):
    answer, attempts, tally = run(server, store, fault, max_retries=0)
    assert answer.text is None and answer.error.startswith(f"{kind}: ")
    assert attempts == 1 and tally.errors == {kind: 1}
    assert store.scalar("SELECT error FROM llm_cache WHERE key = ?", [answer.key]) == answer.error


def test_a_request_that_keeps_failing_stops_after_max_retries(server, store):
    server.faults.extend([Fault("unavailable")] * 3)
    answer, attempts, tally = run(server, store, Fault("unavailable"), max_retries=3)
    assert (answer.error, attempts, tally.retries) == ("http 503: Error code: 503 - injected unavailable", 4, 3)
    assert len(server.log) == 4


def test_a_client_error_is_not_retried(server, store):
    answer, attempts, _ = run(server, store, Fault("unauthorized"), max_retries=3)
    assert answer.error.startswith("http 401: ") and attempts == 1
    assert len(server.log) == 1


def test_retry_after_is_honoured(server, store):
    run(server, store, Fault("rate_limit", retry_after=0.4), max_retries=1)
    refused, answered = server.log
    assert answered.started - refused.started >= 0.4  # `started`: before the 429 left the server


@pytest.mark.parametrize(
    "retry, bound",
    [(0, 1.0), (1, 2.0), (2, 4.0), (5, 30.0), (20, 30.0)],  # doubling, capped at backoff_max_s
)
def test_backoff_is_jittered_below_a_doubling_capped_bound(retry, bound):
    policy = RetryPolicy(max_retries=30, backoff_initial_s=1.0, backoff_max_s=30.0)
    rng = random.Random(0)
    waits = [policy.wait_s(retry, None, rng) for _ in range(500)]
    assert all(0 <= w <= bound for w in waits)
    assert max(waits) > 0.9 * bound and min(waits) < 0.1 * bound  # spread over the whole range


def test_a_retry_after_sets_the_wait_plus_at_most_a_tenth():
    policy = RetryPolicy(max_retries=3, backoff_initial_s=1.0, backoff_max_s=2.0)
    waits = [policy.wait_s(0, 5.0, random.Random(seed)) for seed in range(50)]
    assert all(5.0 <= w <= 5.5 for w in waits)


@pytest.mark.parametrize(
    "headers, expected",
    [
        ({}, None),
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "250", "retry-after": "3"}, 0.25),  # OpenAI's finer header wins
        ({"retry-after": "-4"}, None),  # no wait: the backoff decides
        ({"retry-after": "soon"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "1e400"}, None),  # inf once parsed
        ({"retry-after-ms": "inf"}, None),
        ({"retry-after-ms": "-1", "retry-after": "3"}, 3.0),  # a broken finer header leaves the other
        ({"retry-after": "100000"}, 100000.0),  # parsed as sent: the policy caps it
    ],
)
def test_retry_after_headers(headers, expected):
    assert retry_after_s(headers) == expected


def test_a_retry_after_date_in_the_past_means_now():
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0


def test_a_retry_after_date_years_ahead_is_parsed_and_the_wait_capped():
    far = retry_after_s({"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"})
    assert far is not None and far > 1e9
    policy = RetryPolicy(max_retries=3, backoff_initial_s=1.0, backoff_max_s=2.0)
    assert policy.cuts(far) and RETRY_AFTER_CAP_S <= policy.wait_s(0, far, random.Random(0)) <= 1.1 * RETRY_AFTER_CAP_S


@pytest.mark.parametrize("asked", [1e5, 1e12])
def test_a_retry_after_past_the_cap_waits_the_cap_plus_at_most_a_tenth(asked):
    policy = RetryPolicy(max_retries=3, backoff_initial_s=1.0, backoff_max_s=2.0)
    waits = [policy.wait_s(0, asked, random.Random(seed)) for seed in range(50)]
    assert all(RETRY_AFTER_CAP_S <= w <= 1.1 * RETRY_AFTER_CAP_S for w in waits)


def test_a_backoff_max_s_past_the_cap_raises_it():
    policy = RetryPolicy(max_retries=3, backoff_initial_s=1.0, backoff_max_s=600.0)
    assert policy.retry_after_cap_s == 600.0 and not policy.cuts(300.0) and policy.cuts(601.0)
    assert 300.0 <= policy.wait_s(0, 300.0, random.Random(0)) <= 330.0


@pytest.mark.parametrize("asked", [float("inf"), float("nan"), -1.0])
def test_a_retry_after_that_is_no_wait_leaves_the_backoff(asked):
    policy = RetryPolicy(max_retries=3, backoff_initial_s=1.0, backoff_max_s=2.0)
    waits = [policy.wait_s(0, asked, random.Random(seed)) for seed in range(50)]
    assert all(0 <= w <= 1.0 for w in waits) and not policy.cuts(asked)


def test_retry_after_as_an_http_date():
    in_ten_seconds = format_datetime(datetime.now(UTC) + timedelta(seconds=10), usegmt=True)
    assert retry_after_s({"retry-after": in_ten_seconds}) == pytest.approx(10, abs=2)


@pytest.mark.parametrize(
    "body, kind",
    [
        ({"choices": []}, "empty choices"),
        ({"choices": [{"message": {"role": "assistant", "content": None}}]}, "empty choices"),
        ({"choices": [{"finish_reason": "length"}]}, "empty choices"),
        ({"error": {"message": "overloaded"}}, "malformed response"),  # a 200 carrying an error
        ([1, 2], "malformed response"),
    ],
)
def test_a_response_without_text_is_a_retryable_fault(body, kind):
    with pytest.raises(EndpointError) as fault:
        completion_of(body)
    assert (fault.value.kind, fault.value.retryable) == (kind, True)


def test_a_response_without_usage_has_no_token_counts():
    body = {"choices": [{"message": {"role": "assistant", "content": "fine"}}]}
    assert completion_of(body) == Completion("fine", None, None)
