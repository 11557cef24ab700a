"""The validation score every training stage reports before and after (issue 28), and how export ships by it.

Real parts: the offline similarity judge (MiniLM), the answer files the training side writes, the tiny
chat model where something is generated, a real DuckDB store for the checkpoints export chooses from.
"""

import json

import pytest

from pipeline.prompts.answer_format import NON_THINKING, SFT_DIRECT, SFT_THINKING
from pipeline.sft.judging import SemanticJudge
from pipeline.sft.queries import Query
from pipeline.store.schema import SystemPrompt
from pipeline.training import validation


def _query(n: int, action: str, reference: str) -> Query:
    return Query(f"t{n}", 0, "terminal", SystemPrompt(task_description="a shell"), (), action, reference, 0)


QUERIES = [_query(0, "mkdir x", ""), _query(1, "echo hi", "hi\n"), _query(2, "echo yo", "yo\n")]


@pytest.fixture(scope="module")
def judge():
    return SemanticJudge()


def _answers(tmp_path, name, fmt, texts):
    answers = [
        {"query_id": q.query_id, "text": t, "error": None if t is not None else "boom"} for q, t in zip(QUERIES, texts)
    ]
    (tmp_path / f"validation_{name}.json").write_text(
        json.dumps({"format": fmt.name, "model": "m", "answers": answers})
    )


def test_a_direct_empty_answer_is_judged_and_a_failed_generation_is_left_out(judge, tmp_path):
    _answers(tmp_path, "after", SFT_DIRECT, ["", "hi\n", None])
    rows = validation.score(QUERIES, tmp_path, "after", judge)
    # `mkdir x` prints nothing: the empty answer is right (100); the exact echo too; the failure has no score.
    assert rows["t0:0"]["score"] == pytest.approx(100.0, abs=0.1) and rows["t1:0"]["score"] == pytest.approx(
        100.0, abs=0.1
    )
    assert rows["t2:0"] == {"status": "generation_failed", "score": None}


def test_an_answer_not_in_its_format_is_scored_as_the_empty_observation(judge, tmp_path):
    # A thinking answer without its block, and a direct answer that thinks aloud: both the empty observation.
    _answers(tmp_path, "thinking", SFT_THINKING, ["", "hi\n", "<think>\nechoes\n</think>\n\nyo\n"])
    _answers(tmp_path, "direct", SFT_DIRECT, ["", "<think>\nechoes\n</think>\n\nhi\n", "yo\n"])
    thinking = validation.score(QUERIES, tmp_path, "thinking", judge)
    direct = validation.score(QUERIES, tmp_path, "direct", judge)
    assert thinking["t1:0"]["status"] == "missing_think" and direct["t1:0"]["status"] == "think_tag_in_direct"
    assert thinking["t1:0"]["score"] == direct["t1:0"]["score"] < 50
    assert thinking["t2:0"]["score"] == pytest.approx(100.0, abs=0.1) and direct["t2:0"]["score"] == pytest.approx(
        100.0, abs=0.1
    )


def _rows(scores, status="ok"):
    return {f"q{i}": {"status": status, "score": s} for i, s in enumerate(scores)}


def test_the_metrics_carry_intervals_and_say_when_nothing_changed():
    same = validation.metrics(_rows([10, 50, 90]), _rows([10, 50, 90]), "semantic")
    assert (same["val_change"], same["val_change_low"], same["val_change_high"]) == (0.0, 0.0, 0.0)
    assert same["val_verdict"] == "no measurable change"
    assert same["val_score_after_low"] <= same["val_score_after"] <= same["val_score_after_high"]
    assert "no measurable change +0.0 [+0.0, +0.0]" in validation.summary_words(same)


def test_a_stage_that_made_the_model_worse_says_so_in_words():
    worse = validation.metrics(_rows([60, 70, 80, 90, 60, 70]), _rows([40, 50, 60, 70, 45, 52]), "semantic")
    assert worse["val_verdict"] == "worse" and worse["val_change_high"] < 0
    assert "WORSE -" in validation.summary_words(worse)
    better = validation.metrics(_rows([40, 50, 60, 70, 45, 52]), _rows([60, 70, 80, 90, 60, 70]), "semantic")
    assert better["val_verdict"] == "better" and "improved +" in validation.summary_words(better)


def test_the_parse_rate_counts_answers_in_format_among_those_answered():
    rows = {
        **_rows([50, 60]),
        "bad": {"status": "think_tag_in_direct", "score": 0.0},
        "failed": {"status": "generation_failed", "score": None},
    }
    assert validation.metrics(rows, rows, "semantic")["val_parse_rate_after"] == pytest.approx(2 / 3)


def test_the_next_stage_reads_the_previous_stages_answers_instead_of_asking_again(
    tiny_chat_model, tmp_path, monkeypatch
):
    from pipeline.config import load_config, parse_override

    config = load_config(
        None, [parse_override(f"workspace.path={tmp_path / 'ws'}"), parse_override("validation.max_tokens=8")]
    )
    first, second = tmp_path / "cpt-run", tmp_path / "sft-run"
    first.mkdir(), second.mkdir()
    validation.predict(config, QUERIES, str(tiny_chat_model), NON_THINKING, first, "after")

    def no_model(*args, **kwargs):
        raise AssertionError("asked the model again")

    monkeypatch.setattr("pipeline.llm.client.open_client", no_model)
    validation.predict(config, QUERIES, str(tiny_chat_model), NON_THINKING, second, "before")
    made = json.loads((first / "validation_after.json").read_text())
    read = json.loads((second / "validation_before.json").read_text())
    assert read["answers"] == made["answers"] and read["format"] == "non-thinking"
    # Another format is another request: asked, not read.
    with pytest.raises(AssertionError, match="asked the model again"):
        validation.predict(config, QUERIES, str(tiny_chat_model), SFT_DIRECT, second, "after")


def test_measure_is_computed_once_per_run(tiny_chat_model, tmp_path, monkeypatch):
    from pipeline.config import load_config, parse_override

    config = load_config(
        None, [parse_override(f"workspace.path={tmp_path / 'ws'}"), parse_override("validation.max_tokens=8")]
    )
    run = tmp_path / "run"
    run.mkdir()
    measured = validation.measure(
        config, QUERIES, run, (str(tiny_chat_model), NON_THINKING), (str(tiny_chat_model), SFT_DIRECT)
    )
    assert measured["val_queries"] == 3 and measured["val_format_after"] == "direct"
    assert set(validation.target_scores(run)) == {q.query_id for q in QUERIES}
    monkeypatch.setattr(validation, "predict", lambda *a, **k: pytest.fail("measured twice"))
    assert (
        validation.measure(
            config, QUERIES, run, (str(tiny_chat_model), NON_THINKING), (str(tiny_chat_model), SFT_DIRECT)
        )
        == measured
    )
    assert (
        validation.measure(
            config, [], tmp_path, (str(tiny_chat_model), NON_THINKING), (str(tiny_chat_model), SFT_DIRECT)
        )
        == {}
    )


# -- export ships the best validation score -----------------------------------------------------------
def _register(store, tmp_path, stage, score, scores_after, scores_before=None, created="2026-12-02 10:00:00"):
    run = tmp_path / stage
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    rows = {
        "after": {k: {"status": "ok", "score": v} for k, v in scores_after.items()},
        "before": {k: {"status": "ok", "score": v} for k, v in (scores_before or {}).items()},
    }
    (run / validation.SCORES_FILE).write_text(json.dumps(rows))
    metrics = {"val_score_after": score} if score is not None else {}
    store.execute(
        "INSERT INTO checkpoints (checkpoint_id, stage, fingerprint, path, base_model, created_at, metrics) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [f"{stage}-1", stage, "f", str(run / "model"), "base", created, json.dumps(metrics)],
    )


@pytest.fixture()
def store(tmp_path):
    from pipeline.store.database import Store

    with Store(tmp_path / "store.duckdb") as opened:
        yield opened


def test_export_ships_the_best_validation_score_and_names_the_runner_up(store, tmp_path):
    from pipeline.serving.export_choice import choose

    targets = [f"q{i}" for i in range(8)]
    _register(store, tmp_path, "cpt", 45.0, dict.fromkeys(targets, 45.0), dict.fromkeys(targets, 40.0))
    _register(store, tmp_path, "sft", 52.0, {t: 52.0 + (i % 2) for i, t in enumerate(targets)})
    _register(store, tmp_path, "rl", 30.0, dict.fromkeys(targets, 30.0))
    choice = choose(store)
    assert (choice.chosen.stage, choice.runner_up.stage, choice.base_score) == ("sft", "cpt", 40.0)
    assert choice.margin.measurable and choice.margin.low > 0
    words = choice.words()
    assert (
        words.startswith("sft (validation score 52.0) over the runner-up cpt (45.0): +7.5")
        and "a measurable margin" in words
    )
    assert "above the base model's 40.0" in words


def test_a_tie_goes_to_the_later_stage_and_no_score_falls_back_to_the_last_stage(store, tmp_path):
    from pipeline.serving.export_choice import choose

    _register(store, tmp_path, "cpt", 50.0, {"q": 50.0})
    _register(store, tmp_path, "rl", 50.0, {"q": 50.0})
    choice = choose(store)
    assert choice.chosen.stage == "rl" and "no measurable margin" in choice.words()


def test_without_validation_scores_export_ships_the_last_stage_and_says_why(store, tmp_path):
    from pipeline.serving.export_choice import choose

    _register(store, tmp_path, "cpt", None, {})
    _register(store, tmp_path, "sft", None, {})
    choice = choose(store)
    assert choice.chosen.stage == "sft" and "no checkpoint has a validation score" in choice.words()
    assert choose_empty(tmp_path) is None


def choose_empty(tmp_path):
    from pipeline.serving.export_choice import choose
    from pipeline.store.database import Store

    with Store(tmp_path / "empty.duckdb") as empty:
        return choose(empty)
