"""bench/learning.py's budgets follow the config it is given, and its comparisons are against rows of the same run."""

import importlib.util
from pathlib import Path

import pytest

from pipeline.config import load_config

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
    assert values["cpt.max_steps"] == "2"  # the user's, not 4 x 2 or 4 x the demo's
    assert values["sft.max_queries"] == str(3 * demo.sft.max_queries)
    assert values["sft.max_steps"] == str(3 * demo.sft.max_steps)
    assert values["rl.max_steps"] == str(3 * demo.rl.max_steps)
    assert values["workspace.path"] == str(tmp_path / "ws")
    # A benchmark item gets the history the checkpoints were trained on, unless the user says otherwise.
    assert values["evaluate.benchmark.max_history_chars"] == str(demo.evaluate.max_history_chars)
    given = learning.bench_overrides(DEMO, tmp_path / "ws", ["evaluate.benchmark.max_history_chars=null"])
    assert _values(given)["evaluate.benchmark.max_history_chars"] == "null"
    scaled = load_config(DEMO, [learning.parse_override(text) for text in given])
    assert scaled.evaluate.benchmark.max_history_chars is None and scaled.cpt.max_steps == 4 * demo.cpt.max_steps


def test_a_budget_of_the_whole_pool_stays_the_whole_pool(learning, tmp_path):
    config = tmp_path / "all.yaml"
    config.write_text("sft:\n  max_queries: null\n")
    assert "sft.max_queries" not in _values(learning.scaled_budgets(config, []))


def _row(model, stage, score, ce, semantic=0.5, exact=0.1, parse=1.0):
    return {"model": model, "stage": stage, "score": score, "observation_ce": ce, "semantic_match": semantic,
            "exact_match": exact, "parse_rate": parse}


def test_each_model_is_compared_with_the_base_and_the_retrieval_baseline_of_the_same_table(learning):
    overall = [_row("base", "base", 20.0, 4.0), _row("sft-x", "sft", 30.0, 2.0, exact=0.0),
               _row("retrieval baseline", "baseline", 40.0, None, exact=0.0)]
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
