"""Fingerprints change exactly when a stage's config, inputs or code change; `stage_runs` decides
what is done (no Prefect here: the same rules hold for the CLI and the flows)."""

import os
import shutil
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.orchestration.fingerprint import STAGE_INPUTS, import_closure, stage_fingerprint
from pipeline.stage import StageResult
from pipeline.store import stage_runs
from pipeline.store.database import Store
from stages import filter as filter_stage
from stages import ingest

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
STAGES = list(STAGE_INPUTS)


def workspace_config(tmp_path: Path, **sections):
    sources = [{"name": "terminal", "path": str(tmp_path / "sources")}]
    return load_config(None, [{"workspace": {"path": str(tmp_path / "ws")}, "ingest": {"sources": sources}}, sections])


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    folder = tmp_path / "sources"
    folder.mkdir()
    shutil.copy(DEMO / "terminal.jsonl", folder / "terminal.jsonl")
    return folder


def fingerprints(config) -> dict[str, str]:
    with Store(config.workspace.database_path) as store:
        return {stage: stage_fingerprint(config, store, stage) for stage in STAGES}


def add_source_file(config, sources: Path) -> None:
    shutil.copy(DEMO / "flawed.jsonl", sources / "flawed.jsonl")


def ingest_sources(config, sources: Path) -> None:
    with Store(config.workspace.database_path) as store:
        ingest.run(config, store)


def judge(config, sources: Path) -> None:
    with Store(config.workspace.database_path) as store:
        ingest.run(config, store)
        filter_stage.run(config, store)


def no_change(config, sources: Path) -> None:
    return None


def edit_a_source_keeping_size_and_times(config, sources: Path) -> None:
    """Issue 8.4: the same number of bytes, the modification time put back (as `cp -p` or a checkout do)."""
    path = sources / "terminal.jsonl"
    before = path.stat()
    data = path.read_bytes()
    at = data.rindex(b"terminal")
    path.write_bytes(data[:at] + b"T" + data[at + 1 :])
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


# (what happens, how, config overrides of the second measurement, stages whose fingerprint must change).
# Export's model card shows every stage's settings and the data's counts, so it follows them all.
CHANGES = [
    ("nothing", no_change, {}, set()),
    ("a file appears in a source folder", add_source_file, {}, {"ingest"}),
    ("a source file is edited, size and times kept", edit_a_source_keeping_size_and_times, {}, {"ingest"}),
    ("trajectories are ingested", ingest_sources, {}, {"filter", "export"}),
    ("the filter keeps other turns", judge, {}, {"filter", "score", "split", "export"}),
    ("a filter threshold changes", no_change, {"filter": {"min_turns": 3}}, {"filter", "export"}),
    # CPT reads keep ratios: scores of another score config are stale (issue 13), never a completed run.
    ("a keep ratio changes", no_change, {"score": {"keep_ratios": {"echo": 0.2}}}, {"score", "cpt", "export"}),
    ("the pool salt changes", no_change, {"split": {"salt": "other"}}, {"split", "export"}),
    ("the step count changes", no_change, {"cpt": {"max_steps": 7}}, {"cpt", "export"}),
    (
        "the base model changes",
        no_change,
        {"model": {"base": "Qwen/Qwen3-0.6B"}},
        {"cpt", "sft", "rl", "evaluate", "fidelity", "export"},
    ),
    ("the sft threshold changes", no_change, {"sft": {"min_score": 4.0}}, {"sft", "export"}),
    ("cpt's eval windows change", no_change, {"cpt": {"eval_max_sequences": 8}}, {"cpt", "sft", "export"}),
    ("an rl setting changes", no_change, {"rl": {"control_fraction": 0.5}}, {"rl", "export"}),
    ("the eval budget changes", no_change, {"evaluate": {"max_queries": 5}}, {"evaluate", "export"}),
    # Fidelity asks its rollouts as evaluation asks its queries: the history budget, not evaluation's query budget.
    (
        "the evaluation history changes",
        no_change,
        {"evaluate": {"max_history_chars": 1000}},
        {"evaluate", "fidelity", "export"},
    ),
    (
        "evaluation measures the shipped checkpoint alone",
        no_change,
        {"evaluate": {"checkpoints": "shipped"}},
        {"evaluate", "fidelity", "export"},
    ),
    # The card quotes fidelity's numbers from the store, not its settings.
    ("a fidelity setting changes", no_change, {"fidelity": {"episodes_per_policy": 3}}, {"fidelity"}),
    ("only orchestration changes", no_change, {"orchestration": {"stages": ["ingest"]}}, set()),
    ("the export destination changes", no_change, {"export": {"destination": "s3://bucket/wm"}}, {"export"}),
]


@pytest.mark.parametrize("event,act,overrides,changed", CHANGES, ids=[c[0] for c in CHANGES])
def test_a_fingerprint_changes_when_what_its_stage_reads_changes(tmp_path, sources, event, act, overrides, changed):
    config = workspace_config(tmp_path)
    before = fingerprints(config)
    act(config, sources)
    after = fingerprints(workspace_config(tmp_path, **overrides))
    assert {stage for stage in before if before[stage] != after[stage]} == changed & set(STAGES)


def test_code_version_covers_the_modules_a_stage_imports_indirectly():
    closure = import_closure("filter")
    assert {
        "stages.filter",
        "pipeline.filters.turn_rules",
        "pipeline.filters.loading",
        "pipeline.store.database",
    } <= closure.keys()
    assert "stages.ingest" not in closure


def test_a_stage_without_a_module_is_named():
    with pytest.raises(ValueError, match="stages/nowhere.py"):
        import_closure("nowhere")


def test_a_run_is_recorded_started_then_completed_with_metrics_summary_and_output(tmp_path, store):
    output = tmp_path / "out"
    output.mkdir()
    result = StageResult("score", metrics={"turns": 3}, output_path=output, summary="scored 3 turns")
    stage_runs.execute(store, "score", "fp1", lambda: result)
    [run] = stage_runs.history(store)
    assert (run.status, run.metrics, run.output_path, run.summary) == (
        "completed",
        {"turns": 3},
        str(output),
        "scored 3 turns",
    )
    assert stage_runs.completed_run(store, "score", "fp1").run_id == run.run_id
    assert stage_runs.completed_run(store, "score", "fp2") is None


def test_a_failed_run_records_the_error_and_reraises(store):
    def broken() -> StageResult:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        stage_runs.execute(store, "split", "fp1", broken)
    [run] = stage_runs.history(store)
    assert run.status == "failed" and "disk full" in run.error
    assert stage_runs.completed_run(store, "split", "fp1") is None


def test_a_completed_run_whose_output_was_removed_is_not_done(tmp_path, store):
    output = tmp_path / "model"
    output.mkdir()
    stage_runs.execute(store, "cpt", "fp1", lambda: StageResult("cpt", output_path=output, summary="trained"))
    output.rmdir()
    assert stage_runs.completed_run(store, "cpt", "fp1") is None


def test_a_skip_points_at_the_completed_run_and_returns_its_result(store):
    stage_runs.execute(store, "filter", "fp1", lambda: StageResult("filter", metrics={"kept": 5}, summary="kept 5"))
    completed = stage_runs.completed_run(store, "filter", "fp1")
    stage_runs.record_skip(store, completed)
    assert [run.status for run in stage_runs.history(store, "filter")] == ["completed", "skipped"]
    result = completed.result()
    assert (result.stage, result.metrics, result.summary) == ("filter", {"kept": 5}, "kept 5")


def test_a_relation_fingerprint_sees_the_same_change_in_two_rows(tmp_path: Path) -> None:
    """DuckDB folds the last of several columns into `hash(a, b, c)` by XOR, so a plain XOR of row hashes
    missed a change of that column made alike in an even number of rows: two repeated turns' keep ratio
    1 -> 0 left cpt's pool fingerprint, and its snapshot of the old masks, as they were."""
    with Store(tmp_path / "store.duckdb") as store:
        store.connection.execute("CREATE TABLE t (trajectory_id VARCHAR, turn_index INTEGER, keep_ratio DOUBLE)")
        store.connection.execute("INSERT INTO t VALUES ('a', 0, 1.0), ('a', 1, 1.0), ('b', 0, 1.0), ('b', 1, 0.5)")
        seen = {store.table_fingerprint("t", "trajectory_id, turn_index, keep_ratio")}
        for change in (
            "UPDATE t SET keep_ratio = 0.0 WHERE turn_index = 0",  # two rows, the same change
            "UPDATE t SET keep_ratio = 0.0",  # four rows
            "UPDATE t SET trajectory_id = 'c' WHERE trajectory_id = 'b'",  # a first column, two rows
        ):
            store.connection.execute(change)
            seen.add(store.table_fingerprint("t", "trajectory_id, turn_index, keep_ratio"))
        assert len(seen) == 4
        assert store.table_fingerprint("t", "trajectory_id, turn_index, keep_ratio") == store.table_fingerprint(
            "(SELECT * FROM t ORDER BY turn_index DESC) AS u", "trajectory_id, turn_index, keep_ratio"
        )
