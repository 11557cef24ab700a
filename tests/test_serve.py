"""`simulacra serve` (issue 12, "Serving it"): a real server process on 127.0.0.1 over an exported
tiny checkpoint, driven by the `openai` client, by raw HTTP for bad requests, and by the environment class.

- /v1/models, /v1/models/{id} and /health describe the model (context length, prompt format).
- A chat-messages request and the same query as structured fields get the same (greedy) observation.
- Bad requests are 4xx naming what is wrong, never a 500 (a table of cases), a body over the limit
  refused before it is read.
- A thinking answer (the tiny model is taught one) reaches the client as the observation alone, its
  thinking in `reasoning_content`, unless `include_thinking` asks for it; streamed, the same.
- Issue 19's protocol: every standard field accepted, content parts and every role, n, stop, seed
  (2**63 too), temperature 1 when omitted, logprobs, logit bias; concurrent requests decoded in one
  batch with the answers each gets alone; a client that goes away cancels its generation.
- WorldModelEnvironment: reset, a few steps, the history it keeps, against the real server.
- Issue 28, hybrid thinking: a model trained direct, served, answers in `content` with no reasoning
  (the gymnasium environment steps over it); `chat_template_kwargs.enable_thinking` asking for a
  format the model was not trained in is a 400 naming the trained one, both ways.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from pipeline.config.model import TinyModelConfig
from pipeline.serving.environment import WorldModelEnvironment
from pipeline.serving.export_folder import write_export
from pipeline.serving.prompt_formats import prompt_format, world_model_messages
from pipeline.serving.thinking import split_thinking
from pipeline.store.schema import SystemPrompt
from pipeline.training.tiny_model import build_tiny_model
from tests.served_world_model import (
    SYSTEM,
    THINKING_ANSWER,
    THINKING_QUERY,
    TURNS,
    serve_folder,
    taught_export,
    teach,
)

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The tiny model, taught one thinking answer, exported in the thinking (sft) format."""
    return taught_export(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def server(folder):
    """The exported model served by `simulacra serve` in a subprocess."""
    yield from serve_folder(folder)


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server, api_key="unused", max_retries=0)


def test_models_lists_the_checkpoint(server, client):
    (entry,) = client.models.list().data
    assert entry.id == "world-model-test"
    assert entry.model_extra["max_model_len"] == 512
    assert entry.model_extra["simulacra"] == {
        "prompt_format": "sft",
        "thinking": True,
        "answer_formats": ["thinking"],
        "max_history_chars": 24_000,
    }
    assert client.models.retrieve("world-model-test").id == "world-model-test"
    missing = httpx.get(f"{server}/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    health = httpx.get(server.removesuffix("/v1") + "/health").json()
    assert health["status"] == "ok" and health["model"] == "world-model-test"


def test_messages_and_structured_fields_simulate_the_same_step(client):
    messages = world_model_messages(prompt_format("sft"), "terminal", SYSTEM, TURNS, "wc -l notes.txt")
    by_messages = client.chat.completions.create(
        model="world-model-test", messages=messages, max_tokens=12, temperature=0
    )
    structured = client.chat.completions.create(
        model="world-model-test",
        messages=[],
        max_tokens=12,
        temperature=0,
        extra_body={
            "messages": None,
            "domain": "terminal",
            "system": {
                "task_description": SYSTEM.task_description,
                "action_space": SYSTEM.action_space,
                "initial_state": SYSTEM.initial_state,
            },
            "turns": [{"action": a, "observation": o} for a, o in TURNS],
            "action": "wc -l notes.txt",
        },
    )
    assert by_messages.choices[0].message.content == structured.choices[0].message.content
    assert by_messages.usage.prompt_tokens == structured.usage.prompt_tokens > 50
    assert by_messages.choices[0].finish_reason in ("stop", "length")
    assert by_messages.usage.completion_tokens <= 12


def test_system_prompt_parts_as_named_messages_are_the_rendered_prompt(client):
    """The card's way (issue 19, deliver 2): the parts as named system messages and `tools` give the prompt
    the rendered system message gives."""
    from pipeline.serving.prompt_formats import part_messages

    tools = [{"type": "function", "function": {"name": "wc", "description": "count lines"}}]
    system = SystemPrompt(SYSTEM.task_description, SYSTEM.action_space, tools, SYSTEM.initial_state)
    rendered = world_model_messages(prompt_format("sft"), "terminal", system, TURNS, "wc -l notes.txt")
    parts = part_messages("terminal", system) + rendered[1:]
    by_rendered = client.chat.completions.create(
        model="world-model-test", messages=rendered, max_tokens=8, temperature=0
    )
    by_parts = client.chat.completions.create(
        model="world-model-test", messages=parts, tools=tools, max_tokens=8, temperature=0
    )
    assert by_parts.usage.prompt_tokens == by_rendered.usage.prompt_tokens
    assert by_parts.choices[0].message.content == by_rendered.choices[0].message.content

    # A system message sent before the parts follows the rendered prompt, as the exported chat template lays it out
    # (vLLM's prompt): the server put the rendered prompt where the first part was, after it.
    note = {"role": "system", "content": "Extra note."}
    first = client.chat.completions.create(
        model="world-model-test", messages=[note, *parts], tools=tools, max_tokens=8, temperature=0, logprobs=True
    )
    template_order = client.chat.completions.create(
        model="world-model-test",
        messages=[rendered[0], note, *rendered[1:]],
        max_tokens=8,
        temperature=0,
        logprobs=True,
    )
    assert first.usage.prompt_tokens == template_order.usage.prompt_tokens
    assert [t.logprob for t in first.choices[0].logprobs.content] == [
        t.logprob for t in template_order.choices[0].logprobs.content
    ]


def test_control_instructions_reach_the_prompt(client):
    plain = dict(domain="terminal", system={"task_description": "t"}, action="ls")
    base = client.chat.completions.create(
        model="world-model-test", messages=[], max_tokens=1, extra_body={"messages": None, **plain}
    )
    controlled = client.chat.completions.create(
        model="world-model-test",
        messages=[],
        max_tokens=1,
        extra_body={"messages": None, **plain, "control_instructions": ["Inject an intermittent API error."]},
    )
    assert controlled.usage.prompt_tokens > base.usage.prompt_tokens


def test_thinking_stays_out_of_the_content_unless_asked(client):
    served = client.chat.completions.create(
        model="world-model-test", messages=THINKING_QUERY, max_tokens=40, temperature=0
    )
    assert served.choices[0].finish_reason == "stop"
    assert (served.choices[0].message.content, served.choices[0].message.model_extra["reasoning_content"]) == (
        "3 notes.txt",
        "Three lines.",
    )
    raw = (
        client.chat.completions.create(
            model="world-model-test",
            messages=THINKING_QUERY,
            max_tokens=40,
            temperature=0,
            extra_body={"include_thinking": True},
        )
        .choices[0]
        .message
    )
    assert raw.content == THINKING_ANSWER


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>\nit counts lines\n</think>\n\n3 notes.txt", ("it counts lines", "3 notes.txt")),
        ("<think>a</think>\n  3 notes.txt\n", ("a", "  3 notes.txt\n")),  # leading spaces are output
        ("<think>\ncut at the token limit", ("cut at the token limit", "")),  # never thinking as observation
        ("3 notes.txt", (None, "3 notes.txt")),
        ("<think></think>\n\n", ("", "")),
        ("3 notes</think>\n\nx", (None, "3 notes</think>\n\nx")),  # never opened: all observation
        ("\n<think>\na\n</think>\nb\n\n", ("a", "b\n\n")),
    ],
)
def test_split_thinking(text, expected):
    assert split_thinking(text) == expected


STREAMED = [
    "<think>\nit counts lines\n</think>\n\n3 notes.txt",
    "<think>a</think>\n  3 notes.txt\n",
    "<think>\ncut at the token limit",
    "3 notes.txt",
    "<think></think>\n\n",
    "3 notes</think>\n\nx",
    "<thin",
    "<think>x </thi",
    " \n<think> a \n\n</think>\n\n\nb",
    "",
    "<",
]


@pytest.mark.parametrize("include_thinking", [False, True])
@pytest.mark.parametrize("text", STREAMED)
def test_streamed_deltas_add_up_to_the_whole_answer(text, include_thinking):
    """Fed character by character, the stream's deltas never take anything back and add up to what the
    whole answer gets (split_thinking, or the raw text with include_thinking)."""
    from pipeline.serving.streaming import AnswerStream

    stream = AnswerStream(thinking_format=True, include_thinking=include_thinking)
    reasoning, content = "", ""
    for end in range(len(text) + 1):
        r, c = stream.deltas(text[:end], final=end == len(text))
        reasoning, content = reasoning + r, content + c
    thinking, observation = split_thinking(text)
    assert (reasoning, content) == (thinking or "", text if include_thinking else observation)


LONG_HISTORY = [
    {"role": "user", "content": "cat big.log"},
    {"role": "assistant", "content": "error line " * 400},
    {"role": "user", "content": "wc -l big.log"},
]
ACTION = [{"role": "user", "content": "ls"}]


@pytest.mark.parametrize(
    "body, status, named",
    [
        ("not json", 400, "not valid JSON"),
        ([1, 2], 400, "JSON object"),
        ({"messages": ACTION, "temprature": 0.5}, 400, "unknown field `temprature`"),
        (
            {"messages": [{"role": "user", "content": "ls"}, {"role": "assistant", "content": "a"}]},
            400,
            "missing action",
        ),
        ({"messages": []}, 400, "missing action"),
        ({"domain": "terminal", "system": {"task_description": "t"}}, 400, "missing action"),
        ({"action": "ls"}, 400, "without `domain`"),
        ({"action": "ls", "domain": "spaceship"}, 400, "field `domain`"),
        ({"messages": ACTION, "action": "ls", "domain": "terminal"}, 400, "not both"),
        ({"messages": [{"role": "narrator", "content": "x"}]}, 400, "field `messages.0.role`"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "text parts only",
        ),
        ({"messages": ACTION, "n": 0}, 400, "field `n`"),
        ({"messages": ACTION, "n": 17}, 400, "field `n`"),
        ({"messages": ACTION, "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4 stop sequences"),
        ({"messages": ACTION, "logit_bias": {"5": 200}}, 400, "outside [-100, 100]"),
        # Found by probing: a bias on a token id the model has not was silently no bias at all; a tool that is not
        # an object was rendered into the prompt.
        ({"messages": ACTION, "logit_bias": {"999999": 100}}, 400, "outside the vocabulary"),
        ({"messages": ACTION, "logit_bias": {"-1": 100}}, 400, "outside the vocabulary"),
        (
            {"messages": [{"role": "system", "name": "domain", "content": "terminal"}, *ACTION], "tools": ["x"]},
            400,
            'tools[0] is "x": each tool is an object',
        ),
        ({"messages": ACTION, "temperature": 3}, 400, "field `temperature`"),
        ('{"messages": [{"role": "user", "content": "ls \\ud800"}]}', 400, "lone surrogate"),
        ('{"messages": [{"role": "user", "content": "ls"}], "temperature": NaN}', 400, "finite number"),
        (b'{"messages": [{"role": "user", "content": "\xff"}]}', 400, "not valid JSON"),
        ({"messages": ACTION, "max_tokens": 0}, 400, "field `max_tokens`"),
        ({"messages": ACTION, "model": "gpt-4"}, 404, "not served here"),
        # With no max_tokens the answer's budget is the room left; none left is said as such, not "-3500 more".
        ({"messages": LONG_HISTORY}, 400, "leaves no room for an answer in the model's context length of 512 tokens"),
        ({"messages": ACTION, "max_tokens": 600}, 400, "may take 600 more, past the model's context length of 512"),
        (
            {"messages": ACTION, "chat_template_kwargs": {"enable_thinking": False}},
            400,
            "enable_thinking=false asks for the direct answer format, which this model was not trained in (answer "
            "formats: thinking)",
        ),
        (
            {"messages": ACTION, "chat_template_kwargs": {"enable_thinking": "no"}},
            400,
            'field `chat_template_kwargs`: enable_thinking must be true or false, not "no"',
        ),
        ({"messages": ACTION, "chat_template_kwargs": []}, 400, "field `chat_template_kwargs`"),
        ({"messages": ACTION, "top_logprobs": 3}, 400, "set `logprobs` to true"),
        (
            {"messages": [{"role": "system", "name": "domain", "content": "termnal"}, *ACTION]},
            400,
            "unknown domain 'termnal' in the `domain` part: one of terminal, swe,",
        ),
    ],
)
def test_bad_requests_are_4xx_naming_the_problem(server, body, status, named):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    response = httpx.post(f"{server}/chat/completions", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert named in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"logit_bias": {"5": 200}}, "logit_bias"),
        ({"logit_bias": {"999999": 1}}, "logit_bias"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"temperature": 3}, "temperature"),
    ],
)
def test_a_bad_fields_400_names_it_as_param(server, fields, param):
    """OpenAI's and vLLM's errors name the field at fault in `param`; checks that span the request named none."""
    response = httpx.post(f"{server}/chat/completions", json={"messages": ACTION, **fields})
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_every_standard_field_role_and_content_shape_is_accepted(client):
    """Issue 19's list of 400s, all in one request; `developer` is the system role, a `tool` message an
    observation, content parts join as text: the prompt is that of the plain request."""
    plain = [
        {"role": "system", "content": "You simulate a shell."},
        {"role": "user", "content": "ls"},
        {"role": "assistant", "content": "a.txt"},
        {"role": "user", "content": "cat a.txt"},
    ]
    dressed = [
        {"role": "developer", "content": [{"type": "text", "text": "You simulate a shell."}]},
        {"role": "user", "content": "ls", "name": "agent"},
        {"role": "tool", "content": [{"type": "text", "text": "a.txt"}], "tool_call_id": "call_1"},
        {"role": "user", "content": [{"type": "text", "text": "cat a.txt"}], "name": "agent"},
    ]
    fields = dict(
        tools=[{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
        tool_choice="auto",
        parallel_tool_calls=False,
        response_format={"type": "text"},
        user="agent-7",
        metadata={"run": "1"},
        store=False,
        service_tier="auto",
        reasoning_effort="low",
        logprobs=True,
        top_logprobs=2,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        stream_options=None,
    )
    base = client.chat.completions.create(model="world-model-test", messages=plain, max_tokens=6, temperature=0)
    answer = client.chat.completions.create(
        model="world-model-test", messages=dressed, max_tokens=6, temperature=0, **fields
    )
    assert answer.usage.prompt_tokens == base.usage.prompt_tokens
    assert answer.choices[0].message.content == base.choices[0].message.content
    tokens = answer.choices[0].logprobs.content
    assert len(tokens) == answer.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in tokens)
    assert all(t.logprob <= 0 for t in tokens)


OTHER_QUERY = [{"role": "system", "content": "You simulate a shell."}, {"role": "user", "content": "cat big.log"}]


def test_temperature_defaults_to_sampling_and_a_seed_reproduces_it(client):
    """OpenAI's default temperature is 1: two unseeded answers differ; a seed (2**63 and past too) gives the
    same answer every time, and n choices of one seeded request are different samples."""

    # The whole answer, thinking included: the tiny model is taught to open a thinking block, so 24 sampled
    # tokens may all be thinking, and two such answers have the same (empty) observation.
    def sample(**extra):
        return client.chat.completions.create(
            model="world-model-test",
            messages=OTHER_QUERY,
            max_tokens=24,
            extra_body={"ignore_eos": True, "include_thinking": True},
            **extra,
        )

    unseeded = {sample().choices[0].message.content for _ in range(2)}
    assert len(unseeded) == 2
    for seed in (7, 2**63, 2**70 + 3, -5):
        assert sample(seed=seed).choices[0].message.content == sample(seed=seed).choices[0].message.content
    many = sample(seed=11, n=3)
    assert [c.index for c in many.choices] == [0, 1, 2] and len({c.message.content for c in many.choices}) == 3
    assert many.usage.completion_tokens == 3 * 24


def test_stop_strings_cut_the_answer_before_them(client):
    greedy = dict(
        model="world-model-test", messages=OTHER_QUERY, max_tokens=30, temperature=0, extra_body={"ignore_eos": True}
    )
    whole = client.chat.completions.create(**greedy).choices[0].message.content
    stop = whole[10:13]
    cut = client.chat.completions.create(**greedy, stop=["never-there", stop]).choices[0]
    assert (cut.message.content, cut.finish_reason) == (whole[: whole.find(stop)], "stop")


def test_logit_bias_steers_every_token(client, folder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    token = tokenizer.convert_tokens_to_ids("a")
    answer = client.chat.completions.create(
        model="world-model-test", messages=OTHER_QUERY, max_tokens=5, temperature=0, logit_bias={str(token): 100}
    )
    assert answer.choices[0].message.content == "aaaaa"


def test_streaming_answers_what_the_whole_answer_is(client):
    for include_thinking in (False, True):
        whole = client.chat.completions.create(
            model="world-model-test",
            messages=THINKING_QUERY,
            max_tokens=40,
            temperature=0,
            extra_body={"include_thinking": include_thinking},
        )
        chunks = list(
            client.chat.completions.create(
                model="world-model-test",
                messages=THINKING_QUERY,
                max_tokens=40,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"include_thinking": include_thinking},
            )
        )
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reasoning = "".join(
            (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
        )
        assert (content, reasoning) == (
            whole.choices[0].message.content,
            whole.choices[0].message.model_extra["reasoning_content"],
        )
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_concurrent_requests_are_decoded_together_with_their_own_answers(server, client):
    """Eight clients at once: the decoder ran them in one batch (/health's largest batch), and each got
    the greedy answer it gets alone (rows join and leave a batch with their cache intact)."""
    prompts = [OTHER_QUERY[:1] + [{"role": "user", "content": "x" * (3 * i + 1)}] for i in range(8)]
    ask = dict(model="world-model-test", max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    alone = [client.chat.completions.create(messages=p, **ask).choices[0].message.content for p in prompts]
    together: list[str | None] = [None] * len(prompts)

    def one(i):
        together[i] = client.chat.completions.create(messages=prompts[i], **ask).choices[0].message.content

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
    assert httpx.get(server.removesuffix("/v1") + "/health").json()["largest_batch"] >= 2


def _wait_for_cancellations(server, at_least: int) -> dict:
    deadline = time.monotonic() + 60
    while True:
        health = httpx.get(server.removesuffix("/v1") + "/health").json()
        if (health["cancelled"] >= at_least and health["running"] == 0) or time.monotonic() > deadline:
            return health
        time.sleep(0.2)


def test_a_client_that_goes_away_cancels_its_generation(server):
    long = {"messages": OTHER_QUERY, "max_tokens": 450, "ignore_eos": True, "temperature": 0}
    before = httpx.get(server.removesuffix("/v1") + "/health").json()["cancelled"]
    with httpx.stream("POST", f"{server}/chat/completions", json={**long, "stream": True}) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # generation started; the client closes the stream here
    health = _wait_for_cancellations(server, before + 1)
    assert health["cancelled"] >= before + 1 and health["running"] == 0
    with pytest.raises(httpx.TimeoutException):  # a client that times out on a non-streamed answer
        httpx.post(f"{server}/chat/completions", json={**long, "n": 16}, timeout=0.3)
    health = _wait_for_cancellations(server, before + 17)
    assert health["cancelled"] >= before + 17 and health["running"] == 0


def test_an_oversized_body_is_refused_before_it_is_read(server):
    """Refused from its Content-Length, and a chunked body (no length) as soon as it passes the limit."""
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 400_000}]}).encode()
    response = httpx.post(f"{server}/chat/completions", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

    def chunked():
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    response = httpx.post(f"{server}/chat/completions", content=chunked())
    assert response.status_code == 413
    unknown = httpx.get(server.removesuffix("/v1") + "/v2/nothing")
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "invalid_request_error"


def test_environment_class_steps_against_the_server(server, client):
    env = WorldModelEnvironment(server, model="world-model-test", domain="terminal", max_tokens=12, temperature=0)
    assert env.format.name == "sft"  # read from the server's model list
    assert (
        env.reset(SYSTEM.task_description, {"action_space": SYSTEM.action_space, "initial_state": SYSTEM.initial_state})
        == SYSTEM.initial_state
    )
    observations = [env.step(action) for action in ("ls", "cat notes.txt", "wc -l notes.txt")]
    assert [action for action, _ in env.history] == ["ls", "cat notes.txt", "wc -l notes.txt"]
    assert [observation for _, observation in env.history] == observations
    # The third step sent exactly the trajectory so far: the same request by hand gets the same answer.
    messages = world_model_messages(prompt_format("sft"), "terminal", env.system, env.history[:2], "wc -l notes.txt")
    again = client.chat.completions.create(model="world-model-test", messages=messages, max_tokens=12, temperature=0)
    assert again.choices[0].message.content == observations[2]
    env.reset("another task")
    assert env.history == [] and env.system.action_space is None


def test_environment_class_returns_the_observation_and_keeps_the_thinking_aside(server):
    env = WorldModelEnvironment(server, model="world-model-test", domain="terminal", max_tokens=40, temperature=0)
    env.reset(SYSTEM.task_description, {"action_space": SYSTEM.action_space, "initial_state": SYSTEM.initial_state})
    env.history = list(TURNS)  # the trajectory the model was taught to answer
    assert env.step("wc -l notes.txt") == "3 notes.txt"
    assert env.last_thinking == "Three lines."
    assert env.history[-1] == ("wc -l notes.txt", "3 notes.txt")


def test_history_is_shortened_as_training_shortened_it(server, folder):
    """A long episode no longer dies with context_length_exceeded: the character budget first (sft's
    kept_history), then the oldest turns dropped one at a time until the prompt and its budget fit, and
    exactly as many as that: one more turn would not have fit."""
    from transformers import AutoTokenizer

    from pipeline.serving.chatml import PromptTokens

    env = WorldModelEnvironment(server, model="world-model-test", domain="terminal", max_tokens=8, temperature=0)
    assert env.max_history_chars == 24_000  # read from the server, as the export recorded it
    env.reset(SYSTEM.task_description, {"action_space": SYSTEM.action_space})
    env.history = [(f"cat part{i}.txt", f"line {i} of the log, " * 4) for i in range(40)]
    env.step("wc -l notes.txt")
    kept = env.last_history_sent
    assert 0 < kept < 40 and len(env.history) == 41
    tokens = PromptTokens(AutoTokenizer.from_pretrained(folder), thinking=True)

    def prompt_length(turns):
        return len(tokens.ids(world_model_messages(env.format, "terminal", env.system, turns, "wc -l notes.txt")))

    assert prompt_length(env.history[40 - kept : 40]) + 8 <= 512 < prompt_length(env.history[39 - kept : 40]) + 8

    budgeted = WorldModelEnvironment(
        server, model="world-model-test", domain="terminal", max_tokens=8, max_history_chars=200
    )
    budgeted.history = list(env.history[:40])
    assert budgeted.kept_history() == env.history[40 - len(budgeted.kept_history()) : 40]
    assert (
        sum(len(a) + len(o) for a, o in budgeted.kept_history())
        <= 200
        < sum(len(a) + len(o) for a, o in env.history[39 - len(budgeted.kept_history()) : 40])
    )


# Every kind of episode a user can give (EpisodeSpec.from_mapping reads a dataset row or reset's options).
EPISODES = [
    (
        "a task and an initial state",
        {
            "task": SYSTEM.task_description,
            "action_space": SYSTEM.action_space,
            "initial_state": SYSTEM.initial_state,
            "max_steps": 3,
        },
    ),
    ("no initial state", {"task": SYSTEM.task_description, "action_space": SYSTEM.action_space, "max_steps": 3}),
    ("an empty initial state", {"task": SYSTEM.task_description, "initial_state": ""}),
    ("a task alone", {"task": SYSTEM.task_description}),
    ("nothing", {}),
    ("a success pattern", {"task": SYSTEM.task_description, "success_pattern": r"^3", "max_steps": 2}),
]


@pytest.mark.parametrize("given", [case[1] for case in EPISODES], ids=[case[0] for case in EPISODES])
def test_gymnasium_check_env_passes_for_every_kind_of_episode(server, given):
    """Issue 29.7: without an initial state `reset()` returns "", which gymnasium's Text (one character at
    least) did not admit, and check_env failed."""
    from gymnasium.utils.env_checker import check_env

    from pipeline.serving.episode import EpisodeSpec
    from pipeline.serving.gym_env import WorldModelEnv

    env = WorldModelEnv(
        server, "world-model-test", "terminal", EpisodeSpec.from_mapping(given), max_tokens=8, max_action_chars=24
    )
    check_env(env, skip_render_check=True)
    assert env.reset(seed=0)[0] == given.get("initial_state", "")


def test_gymnasium_env_passes_check_env_and_seeds_reproduce_an_episode(server):
    from gymnasium.utils.env_checker import check_env

    from pipeline.serving.episode import EpisodeSpec
    from pipeline.serving.gym_env import WorldModelEnv

    spec = EpisodeSpec(
        SYSTEM.task_description,
        SystemPrompt(action_space=SYSTEM.action_space, initial_state=SYSTEM.initial_state),
        max_steps=3,
    )
    env = WorldModelEnv(server, "world-model-test", "terminal", spec, max_tokens=8, max_action_chars=24)
    check_env(env, skip_render_check=True)

    def episode(seed):
        observation, info = env.reset(seed=seed)
        assert observation == SYSTEM.initial_state and info["task"] == SYSTEM.task_description
        return [env.step(action) for action in ("ls", "cat notes.txt", "wc -l notes.txt")]

    first = episode(3)
    assert [step[0] for step in episode(3)] == [step[0] for step in first]  # sampled at temperature 1, reproduced
    assert [step[0] for step in episode(4)] != [step[0] for step in first]
    assert [(reward, terminated, truncated) for _, reward, terminated, truncated, _ in first] == [
        (0.0, False, False),
        (0.0, False, False),
        (0.0, False, True),
    ]  # the step limit truncates


@pytest.mark.parametrize(
    "ends, expected",
    [
        ({"success_pattern": r"^3 notes"}, (1.0, True, False)),
        ({"verifier": "def verify(observation):\n    return observation.split()[0] == '3'\n"}, (1.0, True, False)),
        (
            {"verifier": "def verify(observation):\n    return observation == 'nothing'\n", "max_steps": 1},
            (0.0, False, True),
        ),
        ({"success_pattern": r"^4 notes"}, (0.0, False, False)),
    ],
)
def test_reward_and_termination_come_from_what_the_user_gives(server, ends, expected):
    """The taught step ("3 notes.txt") against a success pattern, a sandboxed verifier, a step limit."""
    from pipeline.serving.episode import EpisodeSpec
    from pipeline.serving.gym_env import WorldModelEnv

    options = {
        "task": SYSTEM.task_description,
        "action_space": SYSTEM.action_space,
        "initial_state": SYSTEM.initial_state,
        **ends,
    }
    env = WorldModelEnv(server, "world-model-test", "terminal", EpisodeSpec(""), max_tokens=40, temperature=0)
    env.reset(seed=0, options=options)
    env.simulator.history = list(TURNS)  # the trajectory the model was taught to answer
    observation, reward, terminated, truncated, info = env.step("wc -l notes.txt")
    assert observation == "3 notes.txt" and info["thinking"] == "Three lines."
    assert (reward, terminated, truncated) == expected, info["reason"]


def test_gymnasium_env_refuses_what_it_cannot_carry_out_and_a_failed_request_is_no_step(server, monkeypatch):
    """Found by using it: a step before any reset was sent, with no episode; `reset(options={"tsak": ...})` became an
    episode with no task; a non-text action came back as the server's 400 about `messages.3.content.str`; a request
    that failed still counted as a step, so the episode was truncated one step early; a misspelt domain was put into
    the prompt as a domain the model never saw."""
    import gymnasium
    from openai import APIConnectionError

    from pipeline.serving.episode import EpisodeError, EpisodeSpec
    from pipeline.serving.gym_env import WorldModelEnv

    spec = EpisodeSpec(SYSTEM.task_description, SystemPrompt(initial_state=SYSTEM.initial_state), max_steps=2)
    env = WorldModelEnv(server, "world-model-test", "terminal", spec, max_tokens=4)
    with pytest.raises(gymnasium.error.ResetNeeded, match="step before reset"):
        env.step("ls")
    with pytest.raises(EpisodeError, match="unknown episode field.*tsak"):
        env.reset(options={"tsak": "count the notes"})
    with pytest.raises(EpisodeError, match="max_steps is 0"):
        env.reset(options={"task": "count the notes", "max_steps": 0})
    with pytest.raises(EpisodeError, match="not a regular expression"):
        WorldModelEnv(server, "world-model-test", "terminal", EpisodeSpec("t", success_pattern="(("))
    with pytest.raises(ValueError, match="unknown domain `termnal`: the domain is one of terminal, "):
        WorldModelEnv(server, "world-model-test", "termnal", spec)
    assert env.reset(seed=0)[1] == {"task": SYSTEM.task_description}
    with pytest.raises(ValueError, match="the action must be text of at most 4096 characters, not int"):
        env.step(3)  # type: ignore[arg-type]
    with monkeypatch.context() as down:
        down.setattr(env.simulator.client, "base_url", "http://127.0.0.1:1/v1/")  # nothing listens there
        down.setattr(env.simulator.client, "max_retries", 0)
        with pytest.raises(APIConnectionError):
            env.step("ls")
    first, second = env.step("ls"), env.step("ls")
    assert (first[4]["steps"], first[3], second[4]["steps"], second[3]) == (1, False, 2, True)  # the limit, not sooner
    # Found by probing: a third step was sent and answered `truncated` at step 3, where OpenEnv answers 409 and TRL
    # EPISODE_OVER; stepping an ended episode is the caller's bug, said before any request.
    with pytest.raises(gymnasium.error.ResetNeeded, match="the episode is over .truncated at step 2."):
        env.step("ls")
    assert env.reset(seed=0)[1] == {"task": SYSTEM.task_description} and env.step("ls")[4]["steps"] == 1


def test_an_environment_asking_for_a_model_the_server_does_not_serve_names_the_one_it_does(server):
    """Found by probing: a misspelt model name read "the endpoint does not say which prompt format wrong-model uses
    (not `simulacra serve`?)", though it was `simulacra serve`."""
    from pipeline.serving.episode import EpisodeSpec
    from pipeline.serving.gym_env import WorldModelEnv

    with pytest.raises(ValueError, match="model `wrong-model` is not served at .*; it serves `world-model-test`"):
        WorldModelEnv(server, "wrong-model", "terminal", EpisodeSpec("count the notes"))


DIRECT_FORMAT = prompt_format("sft", thinking=False)
DIRECT_QUERY = world_model_messages(DIRECT_FORMAT, "terminal", SYSTEM, TURNS, "wc -l notes.txt")
# A second taught answer: the environment of an agent that ran `env` with its own token set.
TOKEN = "ghp_R8sT2vWx9YzA4bC6dE1fG3hJ5kL7mN0pQ2rSu4"
ENV_QUERY = world_model_messages(DIRECT_FORMAT, "terminal", SYSTEM, TURNS, "env")
ENV_ANSWER = f"HOME=/root\nGITHUB_TOKEN={TOKEN}\nSHELL=/bin/bash"


@pytest.fixture(scope="module")
def direct_server(tmp_path_factory):
    """The tiny model taught one direct answer (the observation alone), exported as trained direct, served."""
    root = tmp_path_factory.mktemp("serve-direct")
    model = build_tiny_model(
        TinyModelConfig(max_position_embeddings=512), [REPO / "data/demo/terminal.jsonl"], root / "tiny"
    )
    teach(model, DIRECT_QUERY, "3 notes.txt", fmt=DIRECT_FORMAT, more=((ENV_QUERY, ENV_ANSWER),), steps=120)
    folder = write_export(
        model,
        root / "export",
        DIRECT_FORMAT,
        {
            "model_name": "world-model-direct",
            "fingerprint": "direct",
            "context_length": 512,
            "max_history_chars": 24_000,
        },
        "# card\n",
    )
    assert json.loads((folder / "simulacra.json").read_text())["answer_formats"] == ["direct"]
    yield from serve_folder(folder)


def test_a_direct_model_answers_in_content_with_no_reasoning(direct_server):
    """Trained direct: the whole answer is the observation, asked by default, with enable_thinking false, from
    the system prompt's parts (rendered with the direct instruction) or streamed; nothing is split off."""
    from openai import OpenAI

    from pipeline.serving.prompt_formats import part_messages

    client = OpenAI(base_url=direct_server, api_key="unused", max_retries=0)
    (entry,) = client.models.list().data
    assert entry.model_extra["simulacra"] == {
        "prompt_format": "sft",
        "thinking": False,
        "answer_formats": ["direct"],
        "max_history_chars": 24_000,
    }
    ask = dict(model="world-model-direct", max_tokens=20, temperature=0)
    parts = part_messages("terminal", SYSTEM) + DIRECT_QUERY[1:]
    for messages, extra in (
        (DIRECT_QUERY, {}),
        (DIRECT_QUERY, {"chat_template_kwargs": {"enable_thinking": False}}),
        (parts, {"include_thinking": True}),
    ):
        message = client.chat.completions.create(messages=messages, extra_body=extra, **ask).choices[0].message
        assert message.content == "3 notes.txt"
        assert "reasoning_content" not in (message.model_extra or {})
    chunks = list(client.chat.completions.create(messages=DIRECT_QUERY, stream=True, **ask))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "3 notes.txt"
    assert not any((c.choices[0].delta.model_extra or {}).get("reasoning_content") for c in chunks)


def test_a_key_the_model_recites_is_redacted_whole_streamed_and_in_logprobs(direct_server):
    """The model was taught to answer `env` with a GitHub token in it: the agent gets `REDACTED`, in the content,
    in every streamed delta (none holds a piece of the token, and they add up to the whole answer) and in the
    logprobs' tokens, whose alternatives are dropped where they stand for the token."""
    from openai import OpenAI

    from pipeline.secret_shapes import REDACTED

    client = OpenAI(base_url=direct_server, api_key="unused", max_retries=0)
    ask = dict(model="world-model-direct", messages=ENV_QUERY, max_tokens=80, temperature=0)
    whole = client.chat.completions.create(logprobs=True, top_logprobs=2, **ask).choices[0]
    assert whole.message.content == ENV_ANSWER.replace(TOKEN, REDACTED)
    pieces = [TOKEN[i : i + 6] for i in range(4, len(TOKEN) - 5)]

    def holds_a_piece(text: str) -> bool:
        return any(piece in text for piece in pieces)

    tokens = whole.logprobs.content
    assert not holds_a_piece("".join(entry.token for entry in tokens))
    assert [entry.token for entry in tokens].count(REDACTED) == 1
    assert all(entry.top_logprobs == [] for entry in tokens if entry.token in (REDACTED, ""))
    assert all(len(entry.top_logprobs) == 2 for entry in tokens if entry.token not in (REDACTED, ""))

    chunks = list(client.chat.completions.create(stream=True, logprobs=True, **ask))
    deltas = [chunk.choices[0].delta.content or "" for chunk in chunks]
    assert "".join(deltas) == whole.message.content
    assert not any(holds_a_piece(delta) or "ghp_" in delta for delta in deltas)
    streamed = [entry for chunk in chunks if chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content]
    assert [entry.token for entry in streamed] == [entry.token for entry in tokens]


@pytest.mark.parametrize(
    "fields",
    [
        {"chat_template_kwargs": {"enable_thinking": True}},
        {"chat_template_kwargs": {"enable_thinking": True, "unknown": 1}},
        {"domain": "terminal", "action": "ls", "chat_template_kwargs": {"enable_thinking": True}},  # structured fields
    ],
)
def test_thinking_asked_of_a_direct_model_is_a_400_naming_the_trained_format(direct_server, fields):
    body = {"messages": DIRECT_QUERY, **fields} if "action" not in fields else fields
    response = httpx.post(f"{direct_server}/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"] == (
        "enable_thinking=true asks for the thinking answer format, which this model was not "
        "trained in (answer formats: direct): omit it or send chat_template_kwargs "
        '{"enable_thinking": false}'
    )
    assert error["param"] == "chat_template_kwargs.enable_thinking"
    ignored = httpx.post(
        f"{direct_server}/chat/completions",  # vLLM's other template kwargs are ignored
        json={"messages": DIRECT_QUERY, "max_tokens": 1, "chat_template_kwargs": {"unknown": 1}},
    )
    assert ignored.status_code == 200, ignored.text


def test_gymnasium_env_steps_over_a_direct_model(direct_server):
    from pipeline.serving.episode import EpisodeSpec
    from pipeline.serving.gym_env import WorldModelEnv
    from pipeline.serving.prompt_formats import UntrainedAnswerFormat

    options = {
        "task": SYSTEM.task_description,
        "action_space": SYSTEM.action_space,
        "initial_state": SYSTEM.initial_state,
        "success_pattern": r"^3 notes",
    }
    env = WorldModelEnv(direct_server, "world-model-direct", "terminal", EpisodeSpec(""), max_tokens=20, temperature=0)
    assert env.simulator.thinking is False  # the trained format, read from the server
    observation, _ = env.reset(seed=0, options=options)
    assert observation == SYSTEM.initial_state
    env.simulator.history = list(TURNS)  # the trajectory the model was taught to answer
    observation, reward, terminated, truncated, info = env.step("wc -l notes.txt")
    assert (observation, reward, terminated, truncated, info["thinking"]) == ("3 notes.txt", 1.0, True, False, None)
    with pytest.raises(UntrainedAnswerFormat, match=r"answer formats: direct"):
        WorldModelEnv(direct_server, "world-model-direct", "terminal", EpisodeSpec(""), enable_thinking=True)


TOOL_CALL = '<tool_call>\n{"name": "act", "arguments": {"action": "wc -l notes.txt"}}\n</tool_call>'


def test_trl_grpo_trainer_drives_the_environment_factory(server, tmp_path):
    """One GRPO step of TRL 1.16 with `environment_factory`: a tiny policy (taught to call the `act` tool,
    so the test does not wait on a random policy finding it) acts in the served world model; TRL calls
    `act`, the world model answers, `get_reward` scores the episode."""
    import importlib.resources

    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.utils import get_json_schema
    from trl import GRPOConfig, GRPOTrainer

    from pipeline.serving.trl_env import WorldModelToolEnv, world_model_environment_factory

    policy = build_tiny_model(
        TinyModelConfig(max_position_embeddings=1024), [REPO / "data/demo/terminal.jsonl"], tmp_path / "policy"
    )
    tokenizer = AutoTokenizer.from_pretrained(policy)
    # A tool-calling template TRL knows how to parse (its Qwen3 one; the tiny tokenizer has the same specials).
    tokenizer.chat_template = (importlib.resources.files("trl") / "chat_templates" / "qwen3.jinja").read_text()
    tokenizer.save_pretrained(policy)
    task = {"task": SYSTEM.task_description, "action_space": SYSTEM.action_space, "initial_state": SYSTEM.initial_state}
    prompt = [
        {"role": "user", "content": SYSTEM.task_description + SYSTEM.initial_state}
    ]  # TRL appends the reset's text
    teach(policy, prompt, TOOL_CALL, tokenizer=tokenizer, tools=[get_json_schema(WorldModelToolEnv.act)])

    episodes = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": SYSTEM.task_description}],
                **task,
                "success_pattern": r"\S",
                "max_steps": 1,
            }
        ]
        * 2
    )
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=64,
        max_steps=1,
        max_tool_calling_iterations=1,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
    )
    factory = world_model_environment_factory(server, "world-model-test", "terminal", max_tokens=8)
    trainer = GRPOTrainer(
        model=str(policy), processing_class=tokenizer, args=args, train_dataset=episodes, environment_factory=factory
    )
    trainer.train()
    assert trainer.state.global_step == 1
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == 1.0 and logged["tools/failure_frequency"] == 0.0
    assert "rewards/WorldModelToolEnv/mean" in logged
    histories = [environment._simulator.history for environment in trainer.environments]
    assert [[action for action, _ in history] for history in histories] == [["wc -l notes.txt"]] * 2
    assert trainer.environments[0]._seed != trainer.environments[1]._seed  # a GRPO group samples, not repeats


def test_trl_environment_counts_answered_steps_and_refuses_an_episode_that_cannot_end_well(server, monkeypatch):
    """A request that failed inside `act` (TRL shows the policy the error, and the policy may try again) counted
    as a step of the episode; a row's `max_steps: 0` made every step the last."""
    from openai import APIConnectionError

    from pipeline.serving.episode import EpisodeError
    from pipeline.serving.trl_env import EPISODE_OVER, WorldModelToolEnv

    environment = WorldModelToolEnv(server, "world-model-test", "terminal", max_tokens=4)
    row = {"prompt": [{"role": "user", "content": "count"}], "task": SYSTEM.task_description, "max_steps": 1}
    with pytest.raises(EpisodeError, match="max_steps is 0"):
        environment.reset(**{**row, "max_steps": 0})
    environment.reset(**row, seed=3)  # the row's own columns (`prompt`) are TRL's, not episode fields to refuse
    with monkeypatch.context() as down:
        down.setattr(environment._simulator.client, "base_url", "http://127.0.0.1:1/v1/")  # nothing listens there
        down.setattr(environment._simulator.client, "max_retries", 0)
        with pytest.raises(APIConnectionError):
            environment.act("ls")
    assert environment.act("ls") != EPISODE_OVER  # the one step the episode has: not spent by the failure
    assert environment.act("ls") == EPISODE_OVER


@pytest.mark.parametrize("think_tokens, parser", [(False, {}), (True, {"--reasoning-parser": "qwen3"})])
def test_vllm_command_carries_what_the_export_recorded(folder, tmp_path, think_tokens, parser):
    """`simulacra serve --engine vllm`'s command (tests/test_vllm_serve.py runs it where vLLM and a GPU are).
    vLLM's qwen3 reasoning parser refuses a tokenizer without `<think>`/`</think>` tokens (the tiny one has
    none; Qwen3's has both): the parser is passed only where they are."""
    from pipeline.serving.vllm_engine import vllm_command

    if think_tokens:  # the tiny export, its tokenizer given the two tokens as Qwen3's has them
        folder = Path(shutil.copytree(folder, tmp_path / "export"))
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        tokenizer["added_tokens"] += [
            {
                "id": 1000 + i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": False,
            }
            for i, token in enumerate(("<think>", "</think>"))
        ]
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    command = vllm_command(folder, "0.0.0.0", 9000, ["--tensor-parallel-size", "2"])
    assert command[:3] == ["vllm", "serve", str(folder)]
    options = dict(zip(command[3::2], command[4::2]))
    assert options == {
        "--served-model-name": "world-model-test",
        "--host": "0.0.0.0",
        "--port": "9000",
        "--max-model-len": "512",
        "--generation-config": str(folder),
        **parser,
        "--tensor-parallel-size": "2",
    }


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--engine", "vllm"], "serve: vLLM is not installed: `pip install -e .[gpu]`"),
        (["--engine", "sglang"], "serve: unknown engine `sglang`"),
        (["--", "--tensor-parallel-size", "2"], "serve: unexpected arguments --tensor-parallel-size 2"),
        # Were torch's traceback once the weights were read (pipeline/llm/devices.py).
        (["--port", "0", "--device", "tpu"], "serve: --device is `tpu`: not a device torch names; use one of auto"),
        pytest.param(
            ["--port", "0", "--device", "cuda"],
            "serve: --device is `cuda`: this machine has no CUDA GPU torch can use",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU serves it"),
        ),
    ],
)
def test_serve_refuses_with_one_line(folder, tmp_path, arguments, message):
    completed = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "serve", str(folder), *arguments],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "PATH": str(tmp_path), "COLUMNS": "300"},
    )
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.strip().startswith(message), completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1


def _serve(folder: Path, cwd: Path, *options: str) -> subprocess.CompletedProcess:
    """`simulacra serve FOLDER OPTIONS` in a process of its own, for a refusal (a served model would not return)."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "serve", str(folder), *options],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300"},
        timeout=120,
    )


def test_a_port_in_use_is_refused_in_one_line_before_the_model_loads(folder, tmp_path):
    """The port is held by a listening socket of this process: the command says so and stops at once, where it
    used to load the model, print that it was serving, and exit with uvicorn's status 3."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        completed = _serve(folder, tmp_path, "--port", str(port))
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.strip() == (
        f"serve: port {port} on 127.0.0.1 is in use by another process: stop it, or pass another --port"
    )
    assert completed.stdout == ""  # nothing loaded, nothing announced


@pytest.mark.parametrize("port", ["70000", "-5"])
def test_a_port_outside_tcps_range_is_refused_in_one_line(folder, tmp_path, port):
    """70000 ended in socket's OverflowError traceback, after the model had loaded."""
    completed = _serve(folder, tmp_path, "--port", port)
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.strip() == (
        f"serve: port {port}: a TCP port is 0-65535 (0 takes a free one): pass another --port"
    )


def test_the_local_server_takes_the_port_it_bound_not_one_chosen_beforehand(folder, tmp_path):
    """`served_folder` (the fidelity stage's server) starts `simulacra serve --port 0` and reads the port from its
    serving line: a port picked first and handed over could be taken in between. The log is appended to, so an
    earlier server's line, naming another port, must not be the one read."""
    from pipeline.serving.local_server import served_folder

    log = tmp_path / "serve.log"
    log.write_text("serving world-model-test (sft format, answering thinking, context 512) at http://127.0.0.1:1/v1\n")
    with served_folder(folder, log=log, max_tokens=4) as served:
        port = int(served.base_url.rsplit(":", 1)[1].split("/")[0])
        assert port not in (0, 1)
        assert httpx.get(f"{served.base_url}/models", timeout=10).json()["data"][0]["id"] == served.model
    announced = [line for line in log.read_text().splitlines() if line.startswith("serving ")]
    assert len(announced) == 2 and announced[1].endswith(f" at http://127.0.0.1:{port}/v1")


def _no_record(folder: Path) -> str:
    (folder / "simulacra.json").unlink()
    return "{folder} is not an exported world model (no simulacra.json): run `simulacra export`"


def _not_json(folder: Path) -> str:
    (folder / "simulacra.json").write_text('{"model_name": "world-model-test", "prompt_fo')
    return "{folder}/simulacra.json is not JSON (Unterminated string starting at: line 1 column 36 (char 35)): export it again"


def _a_field_gone(folder: Path) -> str:
    record = json.loads((folder / "simulacra.json").read_text())
    del record["stop_token_ids"]
    (folder / "simulacra.json").write_text(json.dumps(record))
    return "{folder}/simulacra.json lacks stop_token_ids"


def _no_weights(folder: Path) -> str:
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    return "{folder} holds no weights (no *.safetensors file)"


@pytest.mark.parametrize("damage", [_no_record, _not_json, _a_field_gone, _no_weights], ids=lambda f: f.__name__[1:])
def test_a_damaged_export_is_refused_in_one_line_naming_the_fix(folder, tmp_path, damage):
    """A folder copied in part or edited by hand: refused before anything loads, where it used to end in a
    KeyError or a JSONDecodeError from inside the server."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    expected = damage(copy).format(folder=copy)
    completed = _serve(copy, tmp_path, "--port", "0")
    assert completed.returncode == 2, completed.stderr
    [line] = completed.stderr.strip().splitlines()
    assert line.startswith(f"serve: {expected}"), line
    assert completed.stdout == ""


def test_a_stream_whose_generation_fails_ends_with_its_error_then_done(folder, monkeypatch):
    """A failure mid-stream (out of memory, say) is an error event, and the stream still ends as every stream
    does, with `data: [DONE]` (vLLM's server ends it so): a client reading to [DONE] is not left waiting."""
    from starlette.testclient import TestClient

    from pipeline.llm.batching import Scheduler
    from pipeline.serving.server import build_app
    from pipeline.serving.world_model import WorldModel

    steps = {"n": 0}
    real_step = Scheduler._step

    def fails_on_the_third(self, batch):
        steps["n"] += 1
        if steps["n"] == 3:
            raise RuntimeError("CUDA out of memory (as it would say)")
        return real_step(self, batch)

    monkeypatch.setattr(Scheduler, "_step", fails_on_the_third)
    app = build_app(WorldModel(folder, "cpu"), default_max_tokens=16)
    body = {"messages": THINKING_QUERY, "max_tokens": 16, "temperature": 0, "stream": True, "ignore_eos": True}
    with TestClient(app) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
        app.state.scheduler.close()
    assert events[-1] == "[DONE]", events
    assert "generation failed: RuntimeError: CUDA out of memory" in json.loads(events[-2])["error"]["message"]
