"""The AgentWorldBench-style judge (issue 18): per-domain prompts that classify content first, free
reasoning, then the verdict as tagged JSON; invalid verdicts counted, never scored. Verdicts are parsed
from answers written as such a judge writes them; the judge is asked through the real LLM client over
HTTP on 127.0.0.1 (tests/openai_server.py), its answers cached in a real DuckDB store."""

import json

import pytest

from pipeline.evaluation.tagged_judge import TaggedJudge, parse_verdict, prompts_digest
from pipeline.rewards.rubrics import load_rubric
from pipeline.sft.judging import PointwiseItem
from pipeline.sft.queries import Query
from pipeline.store.schema import SystemPrompt
from tests.openai_server import OpenAIServer

SCORES = {"format": 5, "factuality": 3, "consistency": 4, "realism": 4, "quality": 4}


def verdict(scores=SCORES, fence=True, **extra) -> str:
    body = json.dumps(
        {"content_classes": ["deterministic output"], "strengths": [], "weaknesses": [], "scores": scores, **extra}
    )
    return f"<final_evaluation>\n{'```json' if fence else ''}\n{body}\n{'```' if fence else ''}\n</final_evaluation>"


@pytest.mark.parametrize(
    ("answer", "score", "reason"),
    [
        (f"The listing matches; the prompt is right.\n{verdict()}", 4.0, None),
        (verdict(fence=False), 4.0, None),  # the JSON without its fence
        # Only the last block counts, and none inside the thinking (a fake verdict there never scores).
        (
            f"<think>{verdict({**SCORES, 'factuality': 1})}</think>draft {verdict({**SCORES, 'quality': 1})} final {verdict()}",
            4.0,
            None,
        ),
        ("The prediction is close. Scores: 5, 3, 4, 4, 4.", None, "no <final_evaluation> block"),
        (verdict({**SCORES, "format": 7}), None, "out of range: scores.format"),
        (verdict({k: v for k, v in SCORES.items() if k != "realism"}), None, "missing: scores.realism"),
        ("<final_evaluation>```json\n{not json}\n```</final_evaluation>", None, "not JSON"),
        (None, None, "request failed: HTTP 500"),
    ],
)
def test_tagged_verdicts(answer, score, reason):
    parsed = parse_verdict(answer, "HTTP 500" if answer is None else None)
    assert parsed.valid is (score is not None)
    assert (parsed.score if parsed.valid else None) == score and parsed.invalid_reason == reason


def test_each_domain_has_its_prompt_classifying_content_first_and_the_judge_is_asked_over_http(tmp_path):
    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.client import open_client
    from pipeline.store.database import Store

    def judge(request: dict) -> str:
        return (
            f"Classes first: deterministic output.\n{verdict()}"
            if "cat a" in request["messages"][1]["content"]
            else "no verdict"
        )

    queries = [
        Query("t", i, "terminal", SystemPrompt(), (), action, "x\n", 0) for i, action in enumerate(["cat a", "ls"])
    ]
    with OpenAIServer(answer=judge) as server, Store(tmp_path / "cache.duckdb") as store:
        endpoint = EndpointConfig(
            backend="openai",
            base_url=server.base_url,
            model="judge-model",
            temperature=0.6,
            max_tokens=32768,
            max_retries=0,
            timeout_s=30,
        )
        tagged = TaggedJudge(open_client(endpoint, store, "test.judge"), history_turns=2)
        first, second = tagged.pointwise([PointwiseItem(q, "x\n") for q in queries])
        body = server.log[0].body
    assert first.valid and first.criteria["factuality"] == 3.0 and not second.valid
    system = body["messages"][0]["content"]
    assert load_rubric("terminal") in system and "classify the content of the ground truth" in system
    assert body["temperature"] == 0.6 and body["max_tokens"] == 32768 and "response_format" not in body
    assert tagged.system("mcp") != system  # per domain
    assert len(prompts_digest()) == 12


def test_the_agentworldbench_preset_asks_and_judges_as_the_benchmark():
    """data/configs/agentworldbench.yaml: eval.py's sampling (0.6, 32,768 tokens) for the model and the
    judge, the tagged per-domain judge, empty generations left out, the whole history."""
    from pathlib import Path

    from pipeline.config import load_config

    evaluate = load_config(Path(__file__).resolve().parents[1] / "data/configs/agentworldbench.yaml").evaluate
    assert (evaluate.predictor.temperature, evaluate.predictor.max_tokens) == (0.6, 32768)
    assert (evaluate.judge.kind, evaluate.judge_prompt) == ("llm", "agentworldbench")
    assert (evaluate.judge.endpoint.temperature, evaluate.judge.endpoint.max_tokens) == (0.6, 32768)
    assert evaluate.exclude_empty_generations and evaluate.benchmark.max_history_chars is None
