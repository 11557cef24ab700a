"""The SFT judges: validation of the LLM judge's JSON, the judge over real HTTP, the similarity judge."""

import json

import pytest

from pipeline.config.llm import EndpointConfig
from pipeline.llm.client import open_client
from pipeline.sft.judging import (
    CRITERIA,
    LLMJudge,
    PairwiseItem,
    PointwiseItem,
    SemanticJudge,
    validate_pairwise,
    validate_pointwise,
)
from pipeline.sft.queries import Query
from pipeline.store.schema import ScoredTurn, SystemPrompt
from tests.openai_server import OpenAIServer

GOOD = {
    "content_classes": ["deterministic output"],
    "format": 5,
    "factuality": 4,
    "consistency": 5,
    "realism": 4,
    "quality": 2,
    "rationale": "close",
}

POINTWISE_CASES = [
    # (why, answer text, valid, score, invalid reason)
    ("a valid answer: the mean of the five", json.dumps(GOOD), True, 4.0, None),
    ("fenced JSON (no structured output)", "```json\n" + json.dumps(GOOD) + "\n```", True, 4.0, None),
    ("a score above 5", json.dumps({**GOOD, "factuality": 6}), False, 0.0, "out of range: factuality"),
    ("a score below 1", json.dumps({**GOOD, "quality": 0}), False, 0.0, "out of range: quality"),
    (
        "a missing criterion",
        json.dumps({k: v for k, v in GOOD.items() if k != "realism"}),
        False,
        0.0,
        "missing: realism",
    ),
    ("a fractional score", json.dumps({**GOOD, "format": 4.5}), False, 0.0, "int_from_float: format"),
    ("an extra key", json.dumps({**GOOD, "overall": 5}), False, 0.0, "extra_forbidden: overall"),
    ("prose, not JSON", "I would give it a 4.", False, 0.0, "not JSON"),
    ("a JSON list", "[4, 4, 4, 4, 4]", False, 0.0, "model_type: (answer)"),
    ("text around the JSON is not repaired", "Score: " + json.dumps(GOOD), False, 0.0, "not JSON"),
]


@pytest.mark.parametrize(
    ("why", "text", "valid", "score", "reason"), POINTWISE_CASES, ids=[c[0] for c in POINTWISE_CASES]
)
def test_validate_pointwise(why, text, valid, score, reason):
    verdict = validate_pointwise(text)
    assert (verdict.valid, verdict.score, verdict.invalid_reason, verdict.raw) == (valid, score, reason, text)
    assert (verdict.criteria is not None) == valid


PAIRWISE_CASES = [
    ('{"winner": "A", "rationale": "r"}', "A", True, None),
    ('{"winner": "tie", "rationale": "r"}', "tie", True, None),
    ('{"winner": "C", "rationale": "r"}', None, False, "literal_error: winner"),
    ('{"winner": "B"}', None, False, "missing: rationale"),
    ("B is better", None, False, "not JSON"),
]


@pytest.mark.parametrize(("text", "winner", "valid", "reason"), PAIRWISE_CASES)
def test_validate_pairwise(text, winner, valid, reason):
    preference = validate_pairwise(text)
    assert (preference.winner, preference.valid, preference.invalid_reason) == (winner, valid, reason)


def test_a_failed_request_is_an_invalid_judgement():
    verdict = validate_pointwise(None, "server_error: HTTP 500")
    assert (verdict.valid, verdict.score, verdict.invalid_reason) == (
        False,
        0.0,
        "request failed: server_error: HTTP 500",
    )


def _query(domain="terminal", reference="notes.txt\n"):
    history = (ScoredTurn(0, "touch notes.txt", "", "action", 1.0),)
    return Query("t1", 1, domain, SystemPrompt("Manage files."), history, "ls", reference, 0)


def test_llm_judge_over_http_scores_validates_and_sends_the_rubric_and_schema(store):
    answers = {
        "right": json.dumps(GOOD),
        "too high": json.dumps({**GOOD, "format": 9}),
        "prose": "Looks fine to me.",
    }

    def script(request):
        prediction = request["messages"][-1]["content"].split("## Predicted observation\n")[1]
        return answers[prediction]

    with OpenAIServer(answer=script) as server:
        endpoint = EndpointConfig(
            backend="openai", base_url=server.base_url, model=server.model, temperature=0.0, max_retries=0
        )
        judge = LLMJudge(open_client(endpoint, store, "sft.judge"), history_turns=2)
        verdicts = judge.pointwise([PointwiseItem(_query(), text) for text in answers])
        sent = [entry.body for entry in server.log]
    # Answers that are no judgement are rejected as they arrive (`pointwise_rejection`): failed requests, which the
    # next run asks again, never judgements stored as done.
    assert [(v.valid, v.score, v.invalid_reason) for v in verdicts] == [
        (True, 4.0, None),
        (False, 0.0, "request failed: rejected answer: out of range: format"),
        (False, 0.0, "request failed: rejected answer: not JSON"),
    ]
    assert all(body["response_format"]["type"] == "json_schema" for body in sent)
    schema = sent[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["factuality"] == {"maximum": 5, "minimum": 1, "title": "Factuality", "type": "integer"}
    system, user = sent[0]["messages"]
    assert "Rubric: terminal" in system["content"] and "runtime metadata" in system["content"]
    assert "## Reference observation\nnotes.txt" in user["content"] and "touch notes.txt" in user["content"]


def test_llm_judge_pairwise_uses_the_domain_rubric(store):
    with OpenAIServer(answer=lambda request: '{"winner": "B", "rationale": "B matches"}') as server:
        endpoint = EndpointConfig(backend="openai", base_url=server.base_url, model=server.model, max_retries=0)
        judge = LLMJudge(open_client(endpoint, store, "sft.judge"), history_turns=0)
        [preference] = judge.pairwise([PairwiseItem(_query("text-game"), "You see a mug.", "Nothing happens.")])
        body = server.log[0].body
    assert (preference.winner, preference.valid) == ("B", True)
    assert "Rubric: text-game" in body["messages"][0]["content"]
    assert "## Prediction A\nYou see a mug.\n\n## Prediction B\nNothing happens." in body["messages"][1]["content"]
    assert "(none shown)" in body["messages"][1]["content"]


def test_semantic_judge_maps_similarity_to_one_to_five():
    judge = SemanticJudge()
    json_reference = '{"order_id": 17, "status": "shipped"}'
    verdicts = judge.pointwise(
        [
            PointwiseItem(_query(reference="notes.txt\n"), "notes.txt\n"),
            PointwiseItem(_query(reference="notes.txt\n"), "The French Revolution began in 1789."),
            PointwiseItem(_query(reference=json_reference), json_reference),
            PointwiseItem(_query(reference=json_reference), '{"error": "not found"}'),
        ]
    )
    scores = [v.score for v in verdicts]
    assert scores[0] == pytest.approx(5.0, abs=1e-4) and scores[1] < 2.5
    assert scores[2] == 5.0 and scores[3] == 1.0  # JSON: no leaf in common
    assert all(v.valid and v.criteria is None for v in verdicts)
    assert [json.loads(v.raw)["method"] for v in verdicts] == ["identical", "observation", "identical", "json_leaves"]
    assert not judge.compares_pairwise and not hasattr(judge, "pairwise")


@pytest.mark.parametrize(
    ("action", "reference", "prediction", "expected", "why"),
    [
        ("ls", "notes.txt\n", "notes.txt", 1.0, "the listing, line ends aside"),
        ("wc -c notes.txt", "169 notes.txt", "170 notes.txt", 0.0, "the one fact wrong, the shape right"),
        ("mkdir x", "", "", 1.0, "an empty reference and an empty prediction"),
        ("mkdir x", "", "mkdir creates x.", 0.0, "an explanation where the environment prints nothing"),
        (
            "mv a.txt b.txt",
            "mv: cannot stat 'a.txt': No such file or directory",
            "mv: cannot stat 'b.txt': No such file or directory",
            pytest.approx(2 / 3),
            "the target named as the source",
        ),
    ],
)
def test_semantic_judge_agreement_is_the_content_agreement(action, reference, prediction, expected, why):
    query = Query("t1", 1, "terminal", SystemPrompt("Manage files."), (), action, reference, 0)
    assert SemanticJudge().agreement(PointwiseItem(query, prediction), {}) == expected, why


def test_llm_judge_agreement_is_its_factuality_criterion():
    judge = LLMJudge(client=None, history_turns=0)
    assert judge.compares_pairwise
    assert (
        judge.agreement(PointwiseItem(_query(), "notes.txt"), {**{c: 5.0 for c in CRITERIA}, "factuality": 2.0}) == 2.0
    )
