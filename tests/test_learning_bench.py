"""bench/learning.py's budgets follow the config it is given, its comparisons are against rows of the same run,
and a target is met only when its interval says so."""

import importlib.util
import json
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.evaluation.comparison import EvaluatedTargets
from pipeline.evaluation.intervals import Interval

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "configs" / "demo.yaml"


@pytest.fixture(scope="module")
def learning():
    spec = importlib.util.spec_from_file_location("learning_bench", REPO / "bench" / "learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _values(overrides: list[str]) -> dict[str, str]:
    return dict(text.split("=", 1) for text in overrides)


def test_the_budgets_are_the_configs_scaled_and_a_budget_set_by_the_user_is_taken_as_given(learning, tmp_path):
    demo = load_config(DEMO)
    values = _values(learning.bench_overrides(DEMO, tmp_path / "ws", ["cpt.max_steps=2", "model.base=null"]))
    assert values["cpt.max_steps"] == "2"  # the user's
    # Two rows a step where the demo trains one (chosen on the validation pool over three seeds); the user's if given.
    assert values["cpt.tokens_per_step"] == str(2 * demo.cpt.tokens_per_step) == "2048"
    assert (
        _values(learning.bench_overrides(DEMO, tmp_path / "ws", ["cpt.tokens_per_step=1024"]))["cpt.tokens_per_step"]
        == "1024"
    )
    # CPT's arithmetic is the model's (float32 on a CPU), where the demo's CPT runs in bf16 where the CPU has it.
    assert demo.cpt.mixed_precision == "native-bf16" and values["cpt.mixed_precision"] == "null"
    assert (
        _values(learning.bench_overrides(DEMO, tmp_path / "ws", ["cpt.mixed_precision=bf16"]))["cpt.mixed_precision"]
        == "bf16"
    )
    assert values["sft.max_queries"] == str(3 * demo.sft.max_queries)
    assert values["sft.max_steps"] == str(3 * demo.sft.max_steps)
    # 6 x the demo's groups, 4 of them (4 prompts) an optimizer step.
    assert values["rl.max_steps"] == str(6 * demo.rl.max_steps // learning.RL_PROMPTS_PER_STEP)
    assert values["rl.gradient_accumulation_steps"] == values["rl.steps_per_generation"] == "4"
    # RL's learning rate x3, written as a --set of it would be (the same run fingerprint).
    assert values["rl.learning_rate"] == "3e-05" and demo.rl.learning_rate == 1e-5
    assert load_config(DEMO, [learning.parse_override("rl.learning_rate=3e-05")]).rl.learning_rate == 3e-5
    assert values["rl.max_prompts"] == str(3 * demo.rl.max_prompts)
    # Groups of 4, as in the runs that chose RL's budget, where the demo trains groups of 2; the user's if given.
    assert demo.rl.num_generations == 2 and values["rl.num_generations"] == values["rl.per_device_batch_size"] == "4"
    eights = _values(
        learning.bench_overrides(DEMO, tmp_path / "ws", ["rl.num_generations=8", "rl.per_device_batch_size=8"])
    )
    assert eights["rl.num_generations"] == eights["rl.per_device_batch_size"] == "8"
    # CPT checkpoints every 4 of its 32 float32 steps (about a minute of them), where the demo saves every 16.
    assert demo.cpt.save_steps == 16 and values["cpt.save_steps"] == "4"
    # The stages' before/after and the export's choice on the demo's own validation targets.
    assert values["validation.max_queries"] == "32" and demo.validation.max_queries == 24
    # Their answers' budget holds the 32 targets' p95 (162 tokens), where the demo's 24 need 84 and get 128.
    assert values["validation.max_tokens"] == "200" and demo.validation.max_tokens == 128
    assert (
        _values(learning.bench_overrides(DEMO, tmp_path / "ws", ["validation.max_queries=8"]))["validation.max_queries"]
        == "8"
    )
    assert values["workspace.path"] == str(tmp_path / "ws")
    # A benchmark item gets the history the checkpoints were trained on, unless the user says otherwise.
    assert values["evaluate.benchmark.max_history_chars"] == str(demo.evaluate.max_history_chars)
    # Each benchmark path gives at most its share of the targets.
    assert values["evaluate.benchmark.max_items_per_path"] == str(learning.ITEMS_PER_PATH)
    # Every stage's checkpoint is evaluated, for each stage's gain, where the demo evaluates the shipped one.
    assert demo.evaluate.checkpoints == "shipped" and values["evaluate.checkpoints"] == "newest"
    given = learning.bench_overrides(DEMO, tmp_path / "ws", ["evaluate.benchmark.max_history_chars=null"])
    assert _values(given)["evaluate.benchmark.max_history_chars"] == "null"
    scaled = load_config(DEMO, [learning.parse_override(text) for text in given])
    assert scaled.evaluate.benchmark.max_history_chars is None and scaled.cpt.max_steps == demo.cpt.max_steps == 32
    assert scaled.cpt.mixed_precision is None and scaled.model.mixed_precision == "auto"
    assert scaled.rl.num_generations == 4 and scaled.rl.per_device_batch_size % scaled.rl.num_generations == 0
    # Given steps are the user's: counted as optimizer steps, with the prompts a step they give or 4.
    assert _values(learning.bench_overrides(DEMO, tmp_path / "ws", ["rl.max_steps=5"]))["rl.max_steps"] == "5"
    assert "rl.learning_rate" not in _values(learning.scaled_budgets(DEMO, ["rl.learning_rate=1e-6"]))
    one = _values(learning.bench_overrides(DEMO, tmp_path / "ws", ["rl.gradient_accumulation_steps=1"]))
    assert one["rl.max_steps"] == str(6 * demo.rl.max_steps) and "rl.steps_per_generation" not in one


def test_a_budget_of_the_whole_pool_stays_the_whole_pool(learning, tmp_path):
    config = tmp_path / "all.yaml"
    config.write_text("sft:\n  max_queries: null\n")
    assert "sft.max_queries" not in _values(learning.scaled_budgets(config, []))


def _row(model, stage, score, ce, semantic=0.5, exact=0.1, parse=1.0):
    return {
        "model": model,
        "stage": stage,
        "score": score,
        "observation_ce": ce,
        "semantic_match": semantic,
        "exact_match": exact,
        "parse_rate": parse,
    }


def test_each_model_is_compared_with_the_base_and_the_retrieval_baseline_of_the_same_table(learning):
    overall = [
        _row("base", "base", 20.0, 4.0),
        _row("sft-x", "sft", 30.0, 2.0, exact=0.0),
        _row("retrieval baseline", "baseline", 40.0, None, exact=0.0),
    ]
    by_model = {entry["model"]: entry for entry in learning.comparison(overall)}
    sft = by_model["sft-x"]
    assert sft["vs_base"]["score"] == {"difference": 10.0, "ratio": 1.5}
    assert sft["vs_base"]["observation_ce"] == {"difference": -2.0, "ratio": 0.5}
    assert sft["vs_baseline"]["score"] == {"difference": -10.0, "ratio": 0.75}
    assert sft["vs_baseline"]["observation_ce"] == {"difference": None, "ratio": None}  # the baseline has no CE
    assert sft["vs_baseline"]["exact_match"] == {"difference": 0.0, "ratio": None}  # 0 / 0 is no ratio
    assert by_model["base"]["vs_base"]["score"] == {"difference": 0.0, "ratio": 1.0}


def test_without_a_baseline_row_the_comparison_says_nothing_rather_than_zero(learning):
    compared = learning.comparison([_row("base", "base", 20.0, 4.0), _row("cpt-x", "cpt", 25.0, 3.0)])
    assert all(pair == {"difference": None, "ratio": None} for pair in compared[1]["vs_baseline"].values())


def test_without_the_public_data_the_bench_says_so_in_one_line(learning, monkeypatch, tmp_path):
    monkeypatch.setattr(learning, "PUBLIC", tmp_path / "public")
    with pytest.raises(SystemExit, match=r"^bench/learning.py: no public trajectories at .*give --data FILE\.\.\.$"):
        learning.public_data()
    for name in learning.PUBLIC_PATHS:
        (tmp_path / "public" / name).mkdir(parents=True)
    assert learning.public_data() == [str(tmp_path / "public" / name) for name in learning.PUBLIC_PATHS]


@pytest.mark.skipif(not (REPO.parent / "shared" / "data" / "public").is_dir(), reason="no ../shared/data/public")
def test_the_default_eval_set_has_at_least_100_targets_of_text_games_and_swe(learning):
    """Issue 28: at least 100 public targets, none in a training pool, of two domains."""
    from pipeline.evaluation.benchmark import read_benchmark

    items = read_benchmark(learning.public_data(), "benchmark_target", 800, learning.ITEMS_PER_PATH, 0).items
    domains = [item.query.domain for item in items]
    assert len(items) >= 100 and domains.count("swe") >= 10 and domains.count("text-game") >= 30


class _WordTokenizer:
    """A token a word: what `answer_tokens` asks of a tokenizer, without loading one."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return text.split()


def test_the_answer_budget_is_raised_to_the_p95_observation_unless_the_user_set_one(learning, tmp_path, monkeypatch):
    import pipeline.training.models

    monkeypatch.setattr(pipeline.training.models, "load_tokenizer", lambda ref, trust_remote_code: _WordTokenizer())
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  base: some/model\nevaluate:\n  predictor:\n    max_tokens: 64\n")
    data = tmp_path / "bench.jsonl"

    def benchmark(*words: int) -> list[str]:
        turns = [{"action": f"cat f{i}", "observation": "x " * count} for i, count in enumerate(words)]
        data.write_text(
            json.dumps(
                {
                    "schema": "simulacra/trajectory-v1",
                    "domain": "terminal",
                    "task": "t",
                    "system": {"task_description": "a shell"},
                    "turns": turns,
                }
            )
            + "\n"
        )
        return [str(data)]

    # p95 of two answers is the longer: 400 words and the end token.
    assert learning.answer_budget(config, [], benchmark(400, 3)) == ["evaluate.predictor.max_tokens=401"]
    assert learning.answer_budget(config, [], benchmark(40, 3)) == []  # the config's 64 holds it
    assert learning.answer_budget(config, ["evaluate.predictor.max_tokens=32"], benchmark(400, 3)) == []  # the user's


@pytest.mark.parametrize(
    ("difference", "relation", "met"),
    [
        (Interval(2.0, 0.5, 3.5, 50), ">", True),  # the interval above 0: a measurable gain
        (Interval(2.0, -0.5, 4.5, 50), ">", False),  # a gain the interval does not support
        (Interval(2.0, 0.0, 4.0, 50), ">", False),  # low end at 0: not above it
        (Interval(-1.0, -3.0, 0.0, 50), ">=", True),  # not shown worse: the high end reaches 0
        (Interval(-2.0, -3.5, -0.5, 50), ">=", False),  # measurably worse
        (Interval(None, None, None, 0), ">=", False),  # nothing scored: nothing met
    ],
)
def test_a_target_is_met_only_where_its_interval_supports_it(learning, difference, relation, met):
    assert learning.target_met(difference, relation) is met


def _targets(stage: str, scores: list[float | None], seen: int = 0) -> EvaluatedTargets:
    """Per-target scores of one model; the first `seen` targets seen in training (no unseen score)."""
    ids = [f"t{i}" for i in range(len(scores))]
    unseen = {q: (None if i < seen else v) for i, (q, v) in enumerate(zip(ids, scores))}
    return EvaluatedTargets(
        f"e-{stage}",
        "retrieval baseline" if stage == "baseline" else stage,
        stage,
        dict.fromkeys(ids, "text-game"),
        {"score": dict(zip(ids, scores)), "score_unseen": unseen},
    )


def test_each_stage_is_compared_with_the_one_it_started_from_and_the_exported_one_on_unseen_targets(learning):
    evaluated = [
        _targets("base", [10, 20, 30, 40]),
        _targets("cpt", [20, 30, 40, 50]),
        _targets("sft", [20, 30, 40, 50]),
        _targets("rl", [10, 20, 30, 40]),
        _targets("baseline", [90, 25, 35, 45], seen=1),
    ]
    found = learning.gains(evaluated, "cpt")
    assert {name: c.difference.mean for name, c in found.items()} == {
        "cpt vs base": 10.0,
        "sft vs cpt": 0.0,
        "rl vs sft": -10.0,
        "exported vs base": 10.0,
        "exported vs baseline": 5.0,
    }  # 3 unseen targets: t0 is left out
    assert found["exported vs baseline"].difference.n == 3 and found["exported vs baseline"].model == "cpt"
    verdicts = {row["target"]: row["verdict"] for row in learning.targets(found)}
    assert verdicts == {
        "cpt > base": "met",
        "sft >= cpt": "met",
        "rl > sft": "missed",
        "exported > retrieval baseline": "met",
    }


def test_a_target_without_its_models_is_not_measured_rather_than_missed(learning):
    found = learning.gains([_targets("base", [10, 20]), _targets("cpt", [20, 30])], None)
    verdicts = {row["target"]: row["verdict"] for row in learning.targets(found)}
    assert verdicts["cpt > base"] == "met" and verdicts["rl > sft"] == "not measured"
    assert verdicts["exported > retrieval baseline"] == "not measured"


def test_a_stages_validation_and_rl_reward_are_read_from_its_run_folder(learning, tmp_path):
    run = tmp_path / "runs" / "rl" / "f1"
    (run / "model").mkdir(parents=True)
    metrics = {
        "val_queries": 32,
        "val_score_before": 30.0,
        "val_score_after": 36.0,
        "val_change": 6.0,
        "val_change_low": 1.0,
        "val_change_high": 11.0,
        "val_parse_rate_after": 1.0,
        "prompt_reward_prompts": 24,
        "prompt_reward_before": 5.0,
        "prompt_reward_after": 7.5,
        "prompt_reward_change": 2.5,
        "prompt_reward_change_low": -0.5,
        "prompt_reward_change_high": 5.5,
    }
    (run / "metrics.json").write_text(json.dumps(metrics))
    read = learning.run_metrics(str(run / "model"))
    assert learning.validation_words(read).startswith("validation score 30.0 -> 36.0, improved +6.0 [+1.0, +11.0]")
    assert learning.prompt_reward_words(read) == (
        "reward on its 24 prompts (greedy, 0-25) 5.00 -> 7.50, no measurable change +2.50 [-0.50, +5.50]"
    )
    assert learning.run_metrics(None) == {} and learning.run_metrics(str(tmp_path / "nothing" / "model")) == {}
