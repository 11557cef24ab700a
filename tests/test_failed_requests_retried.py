"""A run that failed on its endpoint does not poison the next (issue 20.11): failed requests are
recorded, never counted as done, and asked again once the endpoint works. Real DuckDB, a real
OpenAI-protocol server on 127.0.0.1."""

import json

import pytest
from openai_server import Fault, OpenAIServer

from pipeline.config.sft import GeneratorConfig, JudgeConfig
from pipeline.llm.client import EndpointFailed
from pipeline.rewards.rubrics import prompt_text
from pipeline.sft.generators import build_generators, build_judge, judge_label
from pipeline.sft.queries import Query
from pipeline.sft.sampling import RejectionSampler
from pipeline.store.database import Store
from pipeline.store.schema import SystemPrompt

# The generator is told apart from the judge by the opening of its prompt file (data/prompts/sft_generator.md).
GENERATOR_OPENING = prompt_text("sft_generator")[:40]
CANDIDATE = "<think>\nIt prints the file.\n</think>\n\nline\n"
QUERIES = [Query(f"t{i}", 1, "terminal", SystemPrompt(), (), f"cat f{i}", f"line {i}\n", 0) for i in range(2)]


def answer(request: dict) -> str:
    if request["messages"][0]["content"].startswith(GENERATOR_OPENING):
        return CANDIDATE
    if "## Criteria" in request["messages"][0]["content"]:
        return json.dumps(
            {
                "content_classes": [],
                "format": 4,
                "factuality": 4,
                "consistency": 4,
                "realism": 4,
                "quality": 4,
                "rationale": "close",
            }
        )
    return json.dumps({"winner": "A", "rationale": "closer"})


def sample(store, server):
    endpoint = {"backend": "openai", "base_url": server.base_url, "model": "m", "max_retries": 0, "api_key_env": None}
    generators, clients = build_generators(
        [GeneratorConfig(kind="endpoint", samples=2, endpoint=endpoint)], store, None, "unused", "pools"
    )
    judge_config = JudgeConfig(kind="llm", endpoint=endpoint)
    judge, judge_client = build_judge(judge_config, store)
    sampler = RejectionSampler(
        store, generators, judge, judge_label(judge_config), min_score=1.0, min_agreement=3.0, seed=0, batch_queries=4
    )
    sampler.run(QUERIES)
    return sampler, clients[0], judge_client


def kept(store, sampler) -> int:
    return store.scalar("SELECT count(*) FROM sft_samples WHERE selection = ? AND kept", [sampler.selection])


@pytest.mark.parametrize("role", ["generator", "judge"])
def test_requests_that_failed_are_asked_again_by_the_next_run(tmp_path, role):
    with Store(tmp_path / "store.duckdb") as store:
        with OpenAIServer(answer=answer) as broken:
            if role == "generator":
                broken.faults.extend([Fault("unauthorized")] * 4)  # every candidate
            else:
                # The 4 candidates are answered (they are asked first); every judge request is refused.
                broken.faults.extend([Fault("answer", text=CANDIDATE)] * 4 + [Fault("unauthorized")] * 40)
            sampler, generator, judge = sample(store, broken)
            client = generator if role == "generator" else judge
            with pytest.raises(EndpointFailed, match="http 401"):
                client.check_failures()
        assert kept(store, sampler) == 0
        assert store.scalar("SELECT count(*) FROM sft_samples") == 0  # undecided, not discarded
        with OpenAIServer(answer=answer) as working:
            sampler, generator, judge = sample(store, working)
            generator.check_failures()
            judge.check_failures()
            asked = len(working.log)
        assert asked > 0
        assert kept(store, sampler) == len(QUERIES)
        assert store.scalar("SELECT count(*) FROM sft_candidates WHERE parse_status = 'generation_failed'") == 0
