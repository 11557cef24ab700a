"""Rationale mode of an SFT generator (pipeline/sft/rationale.py): the observation first, as CPT prompts it,
then the thinking that explains it, over real HTTP to the scripted OpenAI-protocol server."""

import pytest
from openai_server import Fault, OpenAIServer

from pipeline.config.sft import GeneratorConfig
from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.sft.candidates import parse_candidate
from pipeline.sft.generators import build_generators, generator_label
from pipeline.sft.queries import Query
from pipeline.sft.rationale import EMPTY_OBSERVATION, SHOWN_OBSERVATION_CHARS, rationale_messages, rationale_text
from pipeline.store.database import Store
from pipeline.store.schema import ScoredTurn, SystemPrompt

HISTORY = (ScoredTurn(0, "echo hi > f0", "", "action", 1.0),)
QUERIES = [
    Query(f"t{i}", 1, "terminal", SystemPrompt("Sort files."), HISTORY, f"cat f{i}", f"real {i}\n", 0) for i in range(2)
]
RATIONALE_ASK = "What the environment answered:"


def is_rationale(request: dict) -> bool:
    return RATIONALE_ASK in request["messages"][-1]["content"]


def answer(request: dict) -> str:
    if is_rationale(request):
        return "cat prints the file the history wrote. It holds one"  # cut mid-sentence, as a budget cuts
    return "predicted " + request["messages"][-1]["content"]


def generator(server, store, **fields):
    endpoint = {
        "backend": "openai",
        "base_url": server.base_url,
        "model": "m",
        "max_retries": 0,
        "api_key_env": None,
        "max_tokens": 200,
    }
    config = GeneratorConfig(
        kind="endpoint", samples=2, rationale=True, thinking_budget=32, endpoint=endpoint, **fields
    )
    generators, clients = build_generators([config], store, None, "unused", "pools")
    return generators[0], clients


def test_a_candidate_is_the_thinking_of_the_model_s_own_prediction_then_the_prediction(tmp_path):
    with Store(tmp_path / "store.duckdb") as store, OpenAIServer(answer=answer) as server:
        made, clients = generator(server, store)
        texts = made.generate([(query, k) for query in QUERIES for k in range(2)])
    assert len(clients) == 2  # both tallies are checked at the end of the stage
    parsed = [parse_candidate(t.text) for t in texts]
    assert [p.status for p in parsed] == ["ok"] * 4
    assert parsed[0].thinking == "cat prints the file the history wrote."  # the half sentence is cut
    assert [p.prediction for p in parsed] == [
        "predicted cat f0",
        "predicted cat f0",
        "predicted cat f1",
        "predicted cat f1",
    ]
    # Requests run concurrently: the log is in arrival order, so look them up by what they ask.
    observed = sorted(
        (r.body for r in server.log if not is_rationale(r.body)), key=lambda b: b["messages"][-1]["content"]
    )
    explained = sorted((r.body for r in server.log if is_rationale(r.body)), key=lambda b: b["messages"][-1]["content"])
    assert len(observed) == len(explained) == 4
    # The observation is asked as CPT asks it: the environment's system prompt, the history, the action.
    assert observed[0]["messages"][0] == {
        "role": "system",
        "content": render_cpt_system_prompt("terminal", QUERIES[0].system),
    }
    assert [m["content"] for m in observed[0]["messages"][1:]] == ["echo hi > f0", "", "cat f0"]
    assert {body["max_tokens"] for body in observed} == {200}
    # The rationale sees the action and the model's own prediction, never the reference, within its budget.
    assert {body["max_tokens"] for body in explained} == {32}
    shown = explained[0]["messages"][-1]["content"]
    assert "cat f0" in shown and "predicted cat f0" in shown and "real 0" not in shown
    assert texts[0].prompt_tokens is not None and texts[0].completion_tokens is not None


def test_a_failed_rationale_is_asked_again_and_its_observation_is_not(tmp_path):
    with Store(tmp_path / "store.duckdb") as store:
        with OpenAIServer(answer=answer) as broken:
            broken.faults.extend([Fault("answer", text="predicted")] * 4 + [Fault("unauthorized")] * 4)
            made, _ = generator(broken, store)
            texts = made.generate([(query, k) for query in QUERIES for k in range(2)])
        assert [t.text for t in texts] == [None] * 4
        assert all("401" in t.error for t in texts)
        with OpenAIServer(answer=answer) as working:
            made, _ = generator(working, store)
            texts = made.generate([(query, k) for query in QUERIES for k in range(2)])
            asked = [r.body for r in working.log]
    assert asked and all(is_rationale(body) for body in asked)  # the observations came from the cache
    assert [parse_candidate(t.text).prediction for t in texts] == ["predicted"] * 4


def test_rationale_mode_is_a_generator_of_its_own():
    endpoint = {"backend": "transformers", "model": "some/model"}
    first = GeneratorConfig(samples=2, endpoint=endpoint)
    labels = {
        generator_label(first, "base", "pools"),
        generator_label(first.model_copy(update={"rationale": True}), "base", "pools"),
        generator_label(first.model_copy(update={"rationale": True, "thinking_budget": 48}), "base", "pools"),
    }
    assert len(labels) == 3  # candidates of one mode are never reused as the other's


@pytest.mark.parametrize(
    ("answer_text", "thinking"),
    [
        ("It lists the folder.", "It lists the folder."),
        ("  It lists the folder. Two files", "It lists the folder."),
        ('The drawer is "closed." It then', 'The drawer is "closed."'),
        ("One sentence without an end", "One sentence without an end"),  # all there is: kept, the parser judges it
        ("A. B! C? d", "A. B! C?"),
        ("notes/todo.txt is a file", "notes/todo.txt is a file"),  # a dot inside a word ends no sentence
        ("   ", ""),  # empty: the candidate fails as `empty_thinking`
    ],
)
def test_rationale_text(answer_text, thinking):
    assert rationale_text(answer_text) == thinking


def test_the_rationale_request_shows_a_long_or_empty_observation_plainly():
    query = QUERIES[0]
    long = rationale_messages(query, "x" * (SHOWN_OBSERVATION_CHARS + 500))[0]["content"]
    assert "x" * SHOWN_OBSERVATION_CHARS + "\n[...]" in long and "x" * (SHOWN_OBSERVATION_CHARS + 1) not in long
    assert EMPTY_OBSERVATION in rationale_messages(query, "\n")[0]["content"]
    braces = Query("t", 1, "mcp", SystemPrompt(), (), '{"name": "f", "arguments": {}}', "{}", 0)
    assert '{"name": "f", "arguments": {}}' in rationale_messages(braces, '{"ok": true}')[0]["content"]


def test_an_empty_rationale_fails_the_candidate_as_empty_thinking(tmp_path):
    with (
        Store(tmp_path / "store.duckdb") as store,
        OpenAIServer(answer=lambda r: "  " if is_rationale(r) else "out") as server,
    ):
        made, _ = generator(server, store)
        texts = made.generate([(QUERIES[0], 0)])
    assert parse_candidate(texts[0].text).status == "empty_thinking"


def test_a_local_model_decodes_rationales_in_wider_batches_than_observations(tmp_path):
    """Rationale requests are short, so more rows a step pay for them (48 rows: 45 s against 79 s at 8 on the
    demo's 48); the observations keep the endpoint's `batch_size`."""
    from pipeline.sft.generators import RATIONALE_BATCH_ROWS

    config = GeneratorConfig(
        kind="endpoint",
        samples=2,
        rationale=True,
        thinking_budget=32,
        endpoint={"backend": "transformers", "model": str(tmp_path / "not-loaded"), "batch_size": 8},
    )
    with Store(tmp_path / "store.duckdb") as store:
        _, (observer, explainer) = build_generators([config], store, None, "unused", "pools")
    assert observer.backend.batch_size == 8  # the model is loaded on the first request, never here
    assert explainer.backend.batch_size == RATIONALE_BATCH_ROWS > 8


def test_with_int8_observations_the_rationales_come_from_the_float_model(tmp_path):
    """Observations only compete for selection; the thinking is what SFT teaches, and int8 weights made the
    135M model's rationales off-topic, so the rationale client never quantizes."""
    config = GeneratorConfig(
        kind="endpoint",
        samples=2,
        rationale=True,
        thinking_budget=32,
        endpoint={"backend": "transformers", "model": str(tmp_path / "not-loaded"), "quantize": "int8"},
    )
    with Store(tmp_path / "store.duckdb") as store:
        _, (observer, explainer) = build_generators([config], store, None, "unused", "pools")
    assert observer.endpoint.quantize == "int8" and explainer.endpoint.quantize is None
