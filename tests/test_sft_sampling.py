"""The rejection sampler over a real DuckDB store: who meets pairwise, what is stored, what decided (issue 17,
items 7 and 8). The LLM judge answers over real HTTP (tests/openai_server.py); the similarity judge is the real
offline scorer. The generators are scripted in Python, so each candidate's prediction is known."""

import json
import re

from openai_server import OpenAIServer

from pipeline.config.sft import GeneratorConfig, JudgeConfig
from pipeline.sft.generators import build_generators, build_judge, generator_label, judge_label
from pipeline.sft.queries import Query
from pipeline.sft.sampling import GeneratedText, Generator, RejectionSampler
from pipeline.store.database import Store
from pipeline.store.schema import SystemPrompt


def scripted_generator(predictions: dict[str, list[str]]) -> Generator:
    """Sample k of a query predicts `predictions[action][k]`, after a thinking block."""
    samples = len(next(iter(predictions.values())))

    def generate(items: list[tuple[Query, int]]) -> list[GeneratedText]:
        return [GeneratedText(f"<think>\nI predict it.\n</think>\n\n{predictions[query.action][k]}") for query, k in items]

    return Generator(f"scripted#{samples}", samples, 0, generate)


def query(action: str, reference: str, trajectory: str) -> Query:
    return Query(trajectory, 1, "terminal", SystemPrompt("Manage files."), (), action, reference, 0)


# The LLM judge's pointwise answer per prediction: (factuality, every other criterion).
POINTWISE = {"alpha": (4, 4), "beta": (4, 4), "gamma": (4, 4), "low": (2, 2), "guess": (1, 5)}
PREFERENCE = ["gamma", "beta", "alpha", "low", "guess"]  # the pairwise judge's order, best first


def llm_answer(request: dict) -> str:
    user = request["messages"][-1]["content"]
    if "## Prediction A\n" in user:
        a, b = re.search(r"## Prediction A\n(.*)\n\n## Prediction B\n(.*)\Z", user, re.DOTALL).groups()
        return json.dumps({"winner": "A" if PREFERENCE.index(a) < PREFERENCE.index(b) else "B", "rationale": "scripted"})
    factuality, other = POINTWISE[user.split("## Predicted observation\n")[1]]
    return json.dumps({"content_classes": ["deterministic output"], "format": other, "factuality": factuality,
                       "consistency": other, "realism": other, "quality": other, "rationale": "scripted"})


def selections(store) -> dict[str, dict]:
    rows = store.rows(
        "SELECT s.trajectory_id, s.kept, s.reason, s.decided_by, c.prediction AS winner FROM sft_samples s "
        "LEFT JOIN sft_candidates c ON c.candidate_id = s.winner"
    )
    return {row.pop("trajectory_id"): row for row in rows}


def pairwise_predictions(store) -> set[tuple[str, str]]:
    return set(store.execute(
        "SELECT a.prediction, b.prediction FROM judgements j JOIN sft_candidates a ON a.candidate_id = j.candidate_a "
        "JOIN sft_candidates b ON b.candidate_id = j.candidate_b WHERE j.kind = 'pairwise'"
    ).fetchall())


def test_llm_judge_round_robin_among_the_candidates_that_pass_both_gates(tmp_path):
    queries = [query("cat a", "gamma", "mixed"), query("cat b", "gamma", "all-guessed")]
    generator = scripted_generator({"cat a": ["alpha", "beta", "gamma", "low", "guess"], "cat b": ["guess"] * 5})
    with OpenAIServer(answer=llm_answer) as server, Store(tmp_path / "store.duckdb") as store:
        config = JudgeConfig(kind="llm", endpoint={"backend": "openai", "base_url": server.base_url, "model": "m",
                                                   "max_retries": 0, "api_key_env": None})
        judge, _ = build_judge(config, store)
        sampler = RejectionSampler(store, [generator], judge, judge_label(config), min_score=3.0, min_agreement=3.0,
                                   seed=0, batch_queries=2)
        tally = sampler.run(queries)
        decided, pairs = selections(store), pairwise_predictions(store)
    # "low" (score 2) and "guess" (score 4.2, factuality 1) never meet anyone; the other three meet each
    # other in both orders. "all-guessed" has no competitor, so nothing is compared.
    competitors = ("alpha", "beta", "gamma")
    assert pairs == {(a, b) for a in competitors for b in competitors if a != b}
    assert tally.pairwise_judged == 6
    assert decided == {
        "mixed": {"kept": True, "reason": "kept", "decided_by": "pairwise", "winner": "gamma"},
        "all-guessed": {"kept": False, "reason": "thinking_inconsistent", "decided_by": "pointwise", "winner": "guess"},
    }


def test_similarity_judge_makes_no_pairwise_judgement_and_checks_the_content(tmp_path):
    queries = [
        query("ls docs", "field-notes.txt\nreadme.md\nplan.md", "listing"),
        query("wc -c field-notes.txt", "169 field-notes.txt", "byte-count"),
    ]
    generator = scripted_generator({
        "ls docs": ["field-notes.txt\nreadme.md\nplans.md", "field-notes.txt\nreadme.md\nplan.md"],
        "wc -c field-notes.txt": ["170 field-notes.txt", "171 field-notes.txt"],  # the right shape, the wrong count
    })
    with Store(tmp_path / "store.duckdb") as store:
        config = JudgeConfig(kind="semantic")
        judge, _ = build_judge(config, store)
        # min_score 1 lets every candidate through the score gate: the thinking check alone decides the byte count.
        sampler = RejectionSampler(store, [generator], judge, judge_label(config), min_score=1.0, min_agreement=0.5,
                                   seed=0, batch_queries=2)
        tally = sampler.run(queries)
        decided = selections(store)
        kinds = dict(store.execute("SELECT kind, count(*) FROM judgements GROUP BY ALL").fetchall())
    assert kinds == {"pointwise": 4} and tally.pairwise_judged == 0
    assert decided == {
        "listing": {"kept": True, "reason": "kept", "decided_by": "pointwise", "winner": "field-notes.txt\nreadme.md\nplan.md"},
        "byte-count": {"kept": False, "reason": "thinking_inconsistent", "decided_by": "pointwise", "winner": "170 field-notes.txt"},
    }


def test_the_thinking_check_is_part_of_the_selection_key(tmp_path):
    generator = scripted_generator({"ls": ["x"]})
    with Store(tmp_path / "store.duckdb") as store:
        config = JudgeConfig(kind="semantic")
        judge, _ = build_judge(config, store)
        keys = {
            RejectionSampler(store, [generator], judge, judge_label(config), 3.0, threshold, 0, 1).selection
            for threshold in (None, 0.5, 0.6)
        }
    assert len(keys) == 3


def test_a_rationalizing_generator_is_shown_the_real_observation_and_judged_on_its_own_prediction(tmp_path):
    """Rationalization (STaR) over real HTTP: the hinted generator's prompt ends with the reference, the
    unaided one's never holds it; a hinted thinking that cites the hint is rejected; both are judged alike."""
    prompts = []

    def answer(request: dict) -> str:
        system = request["messages"][0]["content"]
        prompts.append(system)
        if "<real_response>" not in system:
            return "<think>\nls lists the folder.\n</think>\n\nwrong.txt"
        if request["messages"][-1]["content"] == "ls leaky":
            return "<think>\nThe real response says it.\n</think>\n\nnotes.txt"
        return "<think>\nls lists the one file the history created.\n</think>\n\nnotes.txt"

    queries = [query("ls docs", "notes.txt", "hinted-wins"), query("ls leaky", "notes.txt", "leaked")]
    with OpenAIServer(answer=answer) as server, Store(tmp_path / "store.duckdb") as store:
        endpoint = {"backend": "openai", "base_url": server.base_url, "model": "m", "max_retries": 0, "api_key_env": None}
        configs = [GeneratorConfig(samples=1, endpoint=endpoint), GeneratorConfig(samples=1, endpoint=endpoint, rationalize=True)]
        generators, _ = build_generators(configs, store, tmp_path, "unused", "pools")
        judge_config = JudgeConfig(kind="semantic")
        judge, _ = build_judge(judge_config, store)
        RejectionSampler(store, generators, judge, judge_label(judge_config), min_score=3.0, min_agreement=0.5,
                         seed=0, batch_queries=2).run(queries)
        decided = selections(store)
        statuses = dict(store.execute("SELECT generator || ':' || query_id, parse_status FROM sft_candidates").fetchall())
    hinted = [p for p in prompts if "<real_response>\nnotes.txt\n</real_response>" in p]
    assert len(prompts) == 4 and len(hinted) == 2
    assert generators[1].label.endswith("+hint") and not generators[0].label.endswith("+hint")
    assert sorted(statuses.values()) == ["hint_leaked", "ok", "ok", "ok"]
    assert decided["hinted-wins"] == {"kept": True, "reason": "kept", "decided_by": "only_candidate", "winner": "notes.txt"}
    # The leaky query's only right answer cited the hint: the unaided wrong one is all that competes.
    assert decided["leaked"]["kept"] is False and decided["leaked"]["winner"] == "wrong.txt"


def test_an_unaided_generator_keeps_its_label_when_a_rationalizing_one_joins():
    plain, hinted = GeneratorConfig(), GeneratorConfig(rationalize=True)
    assert generator_label(plain, "base", "p") != generator_label(hinted, "base", "p")
    assert generator_label(plain, "base", "p") == generator_label(GeneratorConfig(), "base", "p")


def test_only_a_model_rationalizes():
    import pydantic
    import pytest

    with pytest.raises(pydantic.ValidationError, match="rationalize"):
        GeneratorConfig(kind="retrieval", rationalize=True)
