"""The evaluate stage end to end: real DuckDB, the real tiny model (generation and teacher forcing),
the offline similarity judge, and a real OpenAI-protocol server on 127.0.0.1 as the served checkpoint
and the LLM judge.

- A run that fails after its first committed batch, then a rerun: the committed rows are not
  recomputed (same rows, same timestamps), every model ends with one row per query, and a third run
  reuses every evaluation (same checkpoint, eval set and judge fingerprints).
- `--data` reads AgentWorldBench rows as the benchmark defines them (their turn, their system prompt,
  the whole history; empty generations counted and left out; the macro mean beside the weighted one),
  without adding them to the workspace's store.
- The LLM judge's five criteria map onto 0-100; an invalid judge answer is counted and left out; the
  served checkpoints are asked under their folder's name; a failed run and its rerun ask the server
  nothing twice.
"""

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

# Prefect's logging set up now, at collection, as a `simulacra run` process sets it up before any stage runs. Set up
# first inside `simulacra run` under CliRunner, after an earlier test imported absl (the ROUGE metric), its
# dictConfig closed absl's handler, and absl closed that handler's stream: pytest's own stderr, which took the
# rest of the run with it ("lost sys.stderr"). Only this file run alone met it; the whole suite imports Prefect
# at collection (tests/test_flows.py).
import prefect.main  # noqa: F401
import pytest

from pipeline.config import load_config
from pipeline.config.model import TinyModelConfig
from pipeline.evaluation.report import evaluation_rows, markdown_table
from pipeline.orchestration.faults import InjectedFault
from pipeline.store.database import Store
from pipeline.training.tiny_model import build_tiny_model
from stages import filter as filter_stage
from stages import ingest, score, split
from tests.openai_server import OpenAIServer
from tests.test_benchmark_reader import MARKER, SYSTEM, awb_row

REPO = Path(__file__).resolve().parents[1]
MODELS = {"base", "cpt", "sft", "retrieval baseline"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """The demo's terminal and tool-call trajectories split into pools; a tiny base model; copies of it
    registered as the cpt and sft checkpoints (real model folders, so every stage's format is exercised)."""
    root = tmp_path_factory.mktemp("evaluate-prepared")
    config = load_config(None, [{"workspace": {"path": str(root / "workspace")}}])
    build_tiny_model(TinyModelConfig(), [REPO / "data/demo/terminal.jsonl"], root / "base-model")
    with Store(config.workspace.database_path) as store:
        ingest.run(
            config, store, paths=[str(REPO / "data/demo/terminal.jsonl"), str(REPO / "data/demo/tool_calls.json")]
        )
        filter_stage.run(config, store)
        score.run(config, store)
        split.run(config, store)
        for stage in ("cpt", "sft"):
            shutil.copytree(root / "base-model", root / f"{stage}-model")
            store.execute(
                "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, now(), '{}')",
                [
                    f"{stage}-test",
                    stage,
                    f"{stage}-fingerprint",
                    str(root / f"{stage}-model"),
                    str(root / "base-model"),
                ],
            )
    return root


def _config(root: Path, fail: bool = True, **evaluate):
    settings = {
        "max_queries": 6,
        "batch_queries": 4,
        "max_length": 1024,
        "max_history_chars": 2000,
        "predictor": {"max_tokens": 640, "batch_size": 6, "temperature": 0.0},
        **evaluate,
    }
    return load_config(
        None,
        [
            {
                "workspace": {"path": str(root / "workspace")},
                "model": {"base": str(root / "base-model")},
                "orchestration": {"fail_stage": "evaluate" if fail else None},
                "evaluate": settings,
            }
        ],
    )


def _copy(prepared: Path, name: str) -> Path:
    # Beside the module's prepared workspace, named after it: other modules' copies share the base folder.
    root = prepared.parent / f"{prepared.name}-{name}"
    shutil.copytree(prepared, root)
    return root


def _predictions(store) -> list[tuple]:
    return store.execute(
        "SELECT e.model, p.query_id, p.parse_status, p.judge_raw, p.ce_tokens, p.created_at "
        "FROM eval_predictions p JOIN evaluations e USING (evaluation_id) ORDER BY 1, 2"
    ).fetchall()


def test_a_failed_run_resumes_by_row_and_a_completed_evaluation_is_reused(prepared):
    from stages import evaluate

    root = _copy(prepared, "offline")
    config = _config(root, judge={"kind": "semantic"})
    with Store(config.workspace.database_path) as store:
        with pytest.raises(InjectedFault):
            evaluate.run(config, store)
        first_batch = _predictions(store)
        result = evaluate.run(config, store)
        rows = _predictions(store)
        again = evaluate.run(config, store)
        unchanged = _predictions(store)
        table = result.tables["evaluate-table"]
        card = evaluation_rows(store, "cpt-test")
        markdown = markdown_table(card)
        by_seen = store.rows(
            "SELECT e.model, count(*) FILTER (WHERE p.seen_in_training) AS seen, "
            "avg((p.judge_raw - 1) / 4 * 100) FILTER (WHERE NOT p.seen_in_training) AS unseen "
            "FROM eval_predictions p JOIN evaluations e USING (evaluation_id) GROUP BY 1"
        )

    assert len(first_batch) == 4 and set(first_batch) <= set(rows)  # committed rows kept as they were
    assert Counter(row[0] for row in rows) == {model: 6 for model in MODELS}
    assert again.metrics["reused"] == 4 and unchanged == rows
    overall = {row["model"]: row for row in table if row["domain"] == "all"}
    assert set(overall) == MODELS and all(row["queries"] == 6 for row in overall.values())
    # The tiny random model never writes a <think> block: every thinking-format answer is unparsed, scored
    # as the empty observation by the same judge (not a floor), and has no trained context for teacher forcing.
    assert {row[2] for row in rows if row[0] == "sft"} == {"missing_think"} and overall["sft"]["parse_rate"] == 0.0
    assert overall["sft"]["judged"] == 6 and overall["sft"]["observation_ce"] is None and overall["sft"]["ce_rows"] == 0
    for model in ("base", "cpt"):
        assert overall[model]["parse_rate"] == 1.0  # a query too long for max_length has no CE: counted apart
        assert overall[model]["ce_rows"] == sum(1 for row in rows if row[0] == model and row[4] is not None) > 0
        assert overall[model]["observation_ce"] > 0
        assert overall[model]["perplexity"] == pytest.approx(2.718281828 ** overall[model]["observation_ce"])
    for entry in by_seen:  # the score without the targets seen in training, beside the score over all of them
        assert overall[entry["model"]]["seen"] == entry["seen"]
        assert overall[entry["model"]]["score_unseen"] == pytest.approx(entry["unseen"])
    assert overall["retrieval baseline"]["observation_ce"] is None  # not a language model
    assert 0 <= overall["retrieval baseline"]["score"] <= 100 and overall["base"]["format"] is None  # no criteria
    assert {row["model"] for row in card} == MODELS and "similarity judge" in markdown
    assert result.images["evaluate-scores"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    correlations = result.tables["evaluate-correlations"]
    # Over the judged rows only: the sft answers did not parse (issue 17, item 12).
    assert correlations[-1]["domain"] == "all" and correlations[-1]["rows"] == 18
    # Every score with its 95% interval over targets, every model paired with the one it started from (issue 28).
    assert all(
        row["score_low"] <= row["score_high"] and row["score_ci"].startswith(f"{row['score']:.1f} [")
        for row in table
        if row["score"] is not None
    )
    comparisons = result.tables["evaluate-comparisons"]
    overall_scores = [c for c in comparisons if c["measure"] == "score" and c["domain"] == "all"]
    assert {(c["model"], c["compared_with"], c["relation"]) for c in overall_scores} == {
        ("cpt", "base", "started from"),
        ("sft", "cpt", "started from"),
        ("sft", "base", "base"),
        *((model, "retrieval baseline", "retrieval baseline") for model in ("base", "cpt", "sft")),
    }
    assert "cpt vs base " in result.summary and "sft vs cpt " in result.summary
    report = json.loads(Path(result.metrics["report"]).read_text())
    assert len(report["comparisons"]) == len(comparisons) and "score_low" in report["table"][0]
    assert "- cpt vs base (started from): score " in markdown


def test_simulacra_run_ends_with_the_evaluation_tables_from_what_evaluate_stored(prepared, tmp_path):
    """`simulacra run` shows the evaluate stage's tables after its stage table (the demo ends with them): the
    stage's first run evaluates, a second is skipped by fingerprint and shows the same tables, asking nothing."""
    import yaml
    from prefect.testing.utilities import prefect_test_harness
    from typer.testing import CliRunner

    from pipeline.cli import app

    root = _copy(prepared, "run-tables")
    config = _config(root, fail=False, judge={"kind": "semantic"})
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "workspace": {"path": str(root / "workspace")},
                "model": {"base": str(root / "base-model")},
                "evaluate": config.evaluate.model_dump(mode="json", exclude_defaults=True),
            }
        )
    )
    outputs, predictions = [], []
    with prefect_test_harness(server_startup_timeout=120):
        for _ in range(2):
            result = CliRunner().invoke(app, ["run", "--config", str(config_file), "--stages", "evaluate"])
            assert result.exit_code == 0, result.output
            outputs.append(" ".join(result.output.split()))
            with Store(config.workspace.database_path, read_only=True) as store:
                predictions.append(_predictions(store))
    assert "│ evaluate │ ran │" in outputs[0] and "│ evaluate │ skipped │" in outputs[1]
    for output in outputs:
        assert output.index("│ evaluate │") < output.index("paired comparisons, all domains")
        assert "judge-free metrics" in output and "│ retrieval baseline │" in output
    assert len(predictions[0]) == 24 and predictions[1] == predictions[0]  # the second run asked nothing


def test_targets_seen_in_training_are_flagged_and_scored_apart(prepared):
    """A target whose (action, observation) is a kept turn of a training pool is seen in training; the same
    action with another observation is not (issue 17, item 15)."""
    from pipeline.evaluation.contamination import seen_in_training
    from pipeline.sft.queries import Query
    from pipeline.store.schema import SystemPrompt

    config = _config(prepared, fail=False)
    with Store(config.workspace.database_path) as store:
        action, observation = store.execute(
            "SELECT k.action, k.observation FROM kept_turns k JOIN splits s USING (trajectory_id) WHERE s.pool = 'cpt' "
            "ORDER BY 1, 2 LIMIT 1"
        ).fetchone()
        queries = [
            Query("e1", 1, "terminal", SystemPrompt(), (), action, observation, 0),
            Query("e2", 1, "terminal", SystemPrompt(), (), action, observation + " (changed)", 0),
        ]
        assert seen_in_training(store, queries) == {"e1:1"}


def benchmark_answer(request: dict) -> str:
    """A served world model: nothing for `mkdir x`, the real listing (with the benchmark's marker) for `ls`,
    a wrong error for `cat a`, an empty JSON object for the tool call."""
    action = request["messages"][-1]["content"]
    if "mkdir x" in action:
        return ""
    if "\nls\n" in action:
        return f"{MARKER}\nx\n"
    return "{}" if "get_weather" in action else "cat: a: Permission denied"


def test_benchmark_rows_are_scored_as_the_benchmark_defines_them(prepared):
    """AgentWorldBench rows (their schema, written here): each row's own turn, its own system prompt and its
    whole history reach the model; the empty generation is counted and left out; the marker is stripped
    before scoring; the overall score is given sample-weighted and as the macro mean over domains; the
    workspace's store gains no trajectory (issue 18)."""
    from stages import evaluate

    root = _copy(prepared, "benchmark")
    bench = root / "AgentWorldBench"
    bench.mkdir()
    (bench / "terminal_test.jsonl").write_text("".join(json.dumps(awb_row(t)) + "\n" for t in (1, 2, 3)))
    tool = {
        "task": "mcp",
        "id": 1,
        "prompt": ['### Turn 1\n**Action:**\n{"name": "get_weather"}'],
        "response": [f'{MARKER}\n{{"temp": 3}}'],
        "current_prompt": "x",
        "system_str": SYSTEM,
        "turn_idx": 1,
        "total_turns": 1,
    }
    (bench / "mcp_test.jsonl").write_text(json.dumps(tool) + "\n")
    with OpenAIServer(answer=benchmark_answer) as server:
        endpoint = {"backend": "openai", "base_url": server.base_url, "max_retries": 0, "timeout_s": 30}
        config = _config(
            root,
            fail=False,
            judge={"kind": "semantic"},
            baseline_history_turns=None,
            exclude_empty_generations=True,
            predictor={**endpoint, "model": "{checkpoint}", "temperature": 0.6, "max_tokens": 640},
        )
        with Store(config.workspace.database_path) as store:
            trajectories = store.scalar("SELECT count(*) FROM trajectories")
            result = evaluate.run(config, store, checkpoints=["world-model"], data=[str(bench)])
            assert store.scalar("SELECT count(*) FROM trajectories") == trajectories
            rows = store.rows(
                "SELECT domain, turn_index, parse_status, judge_raw, exact, history_left_out FROM eval_predictions "
                "ORDER BY domain, turn_index"
            )
        requests = [e.body for e in server.log]

    assert all(r["messages"][0] == {"role": "system", "content": SYSTEM} for r in requests)  # the row's own prompt
    assert sorted(len(r["messages"]) for r in requests) == [2, 2, 4, 6]  # the whole history, as user/assistant turns
    assert all(r["temperature"] == 0.6 for r in requests)
    assert [(r["domain"], r["turn_index"], r["parse_status"]) for r in rows] == [
        ("mcp", 0, "ok"),
        ("terminal", 0, "empty_generation"),
        ("terminal", 1, "ok"),
        ("terminal", 2, "ok"),
    ]
    assert rows[1]["judge_raw"] is None and rows[2]["exact"] is True and rows[3]["exact"] is False
    assert all(r["history_left_out"] == 0 for r in rows)
    metrics = result.metrics
    assert (metrics["benchmark.records_read"], metrics["benchmark.items"], metrics["benchmark.records_failed"]) == (
        4,
        4,
        0,
    )
    table = {row["domain"]: row for row in result.tables["evaluate-table"]}
    assert table["terminal"]["empty"] == 1 and table["terminal"]["judged"] == 2 and table["all"]["judged"] == 3
    assert table["terminal"]["exact"] == pytest.approx(0.5)  # the marker stripped from both sides
    judged = [(r["judge_raw"] - 1) / 4 * 100 for r in rows if r["judge_raw"] is not None]
    assert table["all"]["score"] == pytest.approx(sum(judged) / 3)  # every scored row alike
    assert table["all"]["score_macro"] == pytest.approx((table["terminal"]["score"] + table["mcp"]["score"]) / 2)
    assert table["all"]["score_macro"] != pytest.approx(table["all"]["score"])


def _digest(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def _reference(request: dict) -> str:
    user = request["messages"][-1]["content"]
    return user.split("## Reference observation\n", 1)[1].split("\n\n## Predicted observation\n", 1)[0]


VALID_JUDGEMENT = json.dumps(
    {
        "content_classes": ["deterministic output"],
        "format": 5,
        "factuality": 3,
        "consistency": 4,
        "realism": 4,
        "quality": 4,
        "rationale": "scripted",
    }
)


def in_range(request: dict) -> str:
    """`scripted`, its judge never out of range."""
    return VALID_JUDGEMENT if "## Criteria" in request["messages"][0]["content"] else scripted(request)


def _out_of_range(request: dict) -> bool:
    """A judge request `scripted` answers out of range."""
    return "## Criteria" in request["messages"][0]["content"] and _digest(_reference(request)) % 3 == 0


def scripted(request: dict) -> str:
    """The judge (its system prompt has the criteria) scores 5/3/4/4/4, or out of range for a third of
    the references; anything else is a prediction request: a thinking block then an observation where the
    system prompt asks for the thinking format, the observation alone where it asks for the direct one."""
    if "## Criteria" in request["messages"][0]["content"]:
        if _out_of_range(request):
            return json.dumps(
                {
                    "content_classes": [],
                    "format": 7,
                    "factuality": 1,
                    "consistency": 1,
                    "realism": 1,
                    "quality": 1,
                    "rationale": "out of range",
                }
            )
        return VALID_JUDGEMENT
    if "<think>" not in request["messages"][0]["content"]:
        return "total 0\n"
    return "<think>\nThe command prints a listing.\n</think>\n\ntotal 0\n"


def test_llm_judge_and_a_served_checkpoint_over_http(prepared):
    from stages import evaluate

    root = _copy(prepared, "served")
    with OpenAIServer(answer=scripted) as server:
        endpoint = {
            "backend": "openai",
            "base_url": server.base_url,
            "concurrency": 2,
            "max_retries": 0,
            "timeout_s": 30,
        }
        config = _config(
            root,
            baseline_history_turns=None,
            predictor={**endpoint, "model": "{checkpoint}", "temperature": 0.0, "max_tokens": 640},
            # A third of the judge's answers are out of range, every time: rejected as they arrive, failed requests
            # (tolerated here), asked again by each run rather than stored as judged.
            judge={
                "kind": "llm",
                "endpoint": {**endpoint, "model": "judge-model", "temperature": 0.0, "max_failed_fraction": 1.0},
            },
        )
        folders = [
            str(root / "base-model"),
            str(prepared / "sft-model"),
        ]  # the copy's store registers prepared's folders
        with Store(config.workspace.database_path) as store:
            with pytest.raises(InjectedFault):
                evaluate.run(config, store, checkpoints=folders)
            result = evaluate.run(config, store, checkpoints=folders)
            asked = len(server.log)
            evaluate.run(config, store, checkpoints=folders)
            judged = store.rows(
                "SELECT e.model, p.judge_raw, p.judge_valid, p.format, p.factuality FROM eval_predictions p "
                "JOIN evaluations e USING (evaluation_id) WHERE p.parse_status = 'ok'"
            )
        answered = [
            json.dumps(e.body, sort_keys=True)
            for e in server.log
            if e.outcome == "answered" and not _out_of_range(e.body)
        ]

    from pipeline.sft.sampling import judge_files_digest

    # The judge is named in the table and the report by its model and its prompt's digest (issue 18).
    assert result.metrics["judge"] == f"llm:openai:judge-model prompt:rubric@{judge_files_digest()}"
    assert json.loads(Path(result.metrics["report"]).read_text())["judge"] == result.metrics["judge"]
    invalid = [row for row in judged if not row["judge_valid"]]
    assert len(server.log) - asked == len(invalid)  # the third run asked again only the judgements that were none
    assert not [body for body, n in Counter(answered).items() if n > 1]  # failed run + rerun: nothing asked twice
    served = {e.body["model"] for e in server.log if e.body["model"] != "judge-model"}
    assert served == {str(Path(folder).resolve()) for folder in folders}
    overall = {row["model"]: row for row in result.tables["evaluate-table"] if row["domain"] == "all"}
    assert len(judged) == 12 and 0 < len(invalid) < 12
    assert all(row["judge_raw"] is None for row in invalid)
    assert all(
        row["judge_raw"] == 4.0 and row["format"] == 5 and row["factuality"] == 3
        for row in judged
        if row["judge_valid"]
    )
    # Both models judged the same way: the mean of 5/3/4/4/4 is 4, (4 - 1) / 4 x 100 = 75; criteria mapped alike.
    for model in ("base", "sft"):
        assert overall[model]["score"] == pytest.approx(75.0)
        assert overall[model]["format"] == pytest.approx(100.0) and overall[model]["factuality"] == pytest.approx(50.0)
    assert {row["domain"] for row in result.tables["evaluate-table"]} >= {"all"}


def test_a_judge_request_that_failed_is_asked_again_by_the_next_run(prepared):
    """Issue 20.11: a tolerated failure (under max_failed_fraction) is recorded, and the next run asks it again."""
    from stages import evaluate
    from tests.openai_server import Fault

    root = _copy(prepared, "judge-failed")
    prediction = "<think>\nThe command prints a listing.\n</think>\n\ntotal 0\n"
    with OpenAIServer(answer=in_range) as server:
        endpoint = {
            "backend": "openai",
            "base_url": server.base_url,
            "concurrency": 1,
            "max_retries": 0,
            "timeout_s": 30,
        }
        config = _config(
            root,
            fail=False,
            baseline_history_turns=None,
            predictor={**endpoint, "model": "{checkpoint}", "temperature": 0.0, "max_tokens": 640},
            judge={
                "kind": "llm",
                "endpoint": {**endpoint, "model": "judge-model", "temperature": 0.0, "max_failed_fraction": 1.0},
            },
        )
        folders = [str(root / "base-model")]
        # The 6 predictions are asked first; then the judge's first two requests are refused.
        server.faults.extend([Fault("answer", text=prediction)] * 6 + [Fault("unauthorized")] * 2)
        with Store(config.workspace.database_path) as store:
            evaluate.run(config, store, checkpoints=folders)
            failed = store.scalar(
                "SELECT count(*) FROM eval_predictions WHERE judge_invalid_reason LIKE 'request failed:%'"
            )
            before = len(server.log)
            evaluate.run(config, store, checkpoints=folders)
            judged_again = [e for e in server.log[before:] if e.body["model"] == "judge-model"]
            still_failed = store.scalar(
                "SELECT count(*) FROM eval_predictions WHERE judge_invalid_reason LIKE 'request failed:%'"
            )
    assert failed == 2
    assert len(judged_again) == 2 and all(e.outcome == "answered" for e in judged_again)
    assert still_failed == 0
