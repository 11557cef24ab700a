"""The Prefect flows on a real (temporary) Prefect server: DAG order, skip by fingerprint, resume
after an injected fault, artifacts in the UI, the `simulacra run` command, typed parameters.

Executions are counted in `stage_runs`: a stage executed once has one `completed` row; a failure
that resumed has a `failed` row then a `completed` one; a skip adds a `skipped` row only.
"""

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect.artifacts import Artifact
from prefect.testing.utilities import prefect_test_harness
from typer.testing import CliRunner

from flows import stage_flows
from flows.artifacts import stage_key
from flows.dag import StageFailed, resolve_config
from flows.gpu_stage import gpu_stage
from flows.world_model import world_model_pipeline
from pipeline.cli import app
from pipeline.config.orchestration import STAGE_ORDER
from pipeline.orchestration.fingerprint import STAGE_INPUTS
from pipeline.store import stage_runs
from pipeline.store.database import Store

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo"
PREFECT_FILE = REPO / "deploy" / "prefect.yaml"
# The nightly refresh's stages, as far as they have been written: each joins when its module lands.
DATA_STAGES = ["ingest", "filter", "score", "split"]


@pytest.fixture(scope="session", autouse=True)
def prefect_server():
    """One temporary Prefect server for the whole session: starting one costs about 18 s."""
    with prefect_test_harness(server_startup_timeout=120):
        yield


def write_config(tmp_path: Path, **sections) -> Path:
    """A workspace in tmp_path reading two demo files; 40-trajectory batches, so ingest commits
    several times per file and a fault after the first commit leaves work to resume."""
    config = {
        "workspace": {"path": str(tmp_path / "ws")},
        "ingest": {
            "batch_trajectories": 40,
            "sources": [
                {"name": "terminal", "path": str(DEMO / "terminal.jsonl")},
                {"name": "flawed", "path": str(DEMO / "flawed.jsonl")},
            ],
        },
        "orchestration": {"stages": DATA_STAGES},
        **sections,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def executions(tmp_path: Path) -> dict[str, list[str]]:
    with Store(tmp_path / "ws" / "simulacra.duckdb", read_only=True) as store:
        runs = stage_runs.history(store)
    statuses: dict[str, list[str]] = {}
    for run in runs:
        statuses.setdefault(run.stage, []).append(run.status)
    return statuses


def test_stages_run_in_dag_order_then_a_rerun_skips_each_by_fingerprint(tmp_path):
    config = write_config(tmp_path)
    state = world_model_pipeline(config_path=str(config), stages=DATA_STAGES[::-1], return_state=True)
    first = state.result()
    assert [(o.stage, o.status) for o in first] == [(stage, "ran") for stage in DATA_STAGES]
    assert first[0].metrics["records_read"] == 131  # 120 terminal sessions + 11 flawed records

    again = world_model_pipeline(config_path=str(config))
    assert [(o.stage, o.status) for o in again] == [(stage, "skipped") for stage in DATA_STAGES]
    assert [(o.fingerprint, o.metrics) for o in again] == [(o.fingerprint, o.metrics) for o in first]
    assert executions(tmp_path) == {stage: ["completed", "skipped"] for stage in DATA_STAGES}

    # What the UI shows for the first run, under stable keys.
    run_id = state.state_details.flow_run_id
    counts = Artifact.get("ingest-counts")
    assert counts.type == "table" and counts.flow_run_id == run_id
    assert {row["source"] for row in json.loads(counts.data)} == {"terminal", "flawed"}
    assert Artifact.get("filter-drops").type == "table"
    summary = Artifact.get("filter-summary")
    assert summary.type == "markdown" and first[1].fingerprint in summary.data
    assert Artifact.get("filter-progress").data == 100.0


# (stage that fails once, stages run)
FAULTS = [
    ("ingest", DATA_STAGES),
    ("filter", DATA_STAGES),
    ("score", DATA_STAGES),  # found by probing: the drill did nothing for score and split
    ("split", DATA_STAGES),
]


@pytest.mark.parametrize("fail_stage,stages", FAULTS, ids=[f for f, _ in FAULTS])
def test_a_rerun_after_a_fault_resumes_the_failed_stage_and_runs_every_other_stage_once(tmp_path, fail_stage, stages):
    config = write_config(tmp_path, orchestration={"stages": stages, "fail_stage": fail_stage})
    with pytest.raises(StageFailed, match=f"stage '{fail_stage}' failed: injected fault") as failure:
        world_model_pipeline(config_path=str(config))
    before = stages[: stages.index(fail_stage)]
    assert [o.stage for o in failure.value.outcomes] == before

    outcomes = world_model_pipeline(config_path=str(config))
    expected = {stage: ["completed"] for stage in stages}
    expected[fail_stage] = ["failed", "completed"]
    for stage in before:
        expected[stage] = ["completed", "skipped"]
    assert executions(tmp_path) == expected
    assert [o.status for o in outcomes] == ["skipped" if s in before else "ran" for s in stages]


def test_ingest_resumes_after_its_last_committed_batch(tmp_path):
    config = write_config(tmp_path, orchestration={"stages": ["ingest"], "fail_stage": "ingest"})
    with pytest.raises(StageFailed):
        world_model_pipeline(config_path=str(config))
    database = tmp_path / "ws" / "simulacra.duckdb"
    with Store(database, read_only=True) as store:
        assert store.scalar("SELECT sum(records_read) FROM ingested_files") == 40
    [outcome] = world_model_pipeline(config_path=str(config))
    with Store(database, read_only=True) as store:
        per_file = store.rows(
            "SELECT source, records_read, added, duplicates, quarantined FROM ingested_files ORDER BY 1"
        )
        stored = store.scalar("SELECT count(*) FROM trajectories")
    # Each record counted once over both runs; nothing inserted twice.
    assert [(r["source"], r["records_read"]) for r in per_file] == [("flawed", 11), ("terminal", 120)]
    assert all(r["records_read"] == r["added"] + r["duplicates"] + r["quarantined"] for r in per_file)
    assert stored == sum(r["added"] for r in per_file) and outcome.metrics["duplicates"] == 0


def test_the_store_decides_not_the_prefect_cache(tmp_path):
    config = write_config(tmp_path)
    world_model_pipeline(config_path=str(config))
    # Cached results without the store they described: every stage runs again.
    (tmp_path / "ws" / "simulacra.duckdb").unlink()
    assert {o.status for o in world_model_pipeline(config_path=str(config))} == {"ran"}
    # The store without Prefect's cached results: every stage is still done.
    shutil.rmtree(tmp_path / "ws" / "prefect" / "results")
    assert {o.status for o in world_model_pipeline(config_path=str(config))} == {"skipped"}


# (fidelity.enabled, the stages a run names, the stages it runs): an optional stage runs when its section enables
# it or when a run names it.
OPTIONAL = [
    (False, [], [s for s in STAGE_ORDER if s != "fidelity"]),
    (True, [], list(STAGE_ORDER)),
    (False, ["evaluate", "fidelity"], ["evaluate", "fidelity"]),
]


@pytest.mark.parametrize(("enabled", "named", "expected"), OPTIONAL, ids=["off", "enabled", "named"])
def test_fidelity_runs_in_the_dag_when_enabled_or_named(enabled, named, expected):
    from flows.dag import config_stages

    config = resolve_config("", [f"fidelity.enabled={str(enabled).lower()}"], "", 0)
    assert config_stages(config, named) == expected


def test_a_stage_flow_runs_its_stage_alone(tmp_path):
    config = write_config(tmp_path)
    [outcome] = stage_flows.ingest_flow(config_path=str(config))
    assert (outcome.stage, outcome.status) == ("ingest", "ran")
    assert executions(tmp_path) == {"ingest": ["completed"]}


def table_statuses(output: str) -> dict[str, str]:
    """{stage: status} from the table `simulacra run` prints."""
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in output.splitlines() if line.startswith("│")]
    return {row[0]: row[1] for row in cells if row and row[0] in STAGE_ORDER}


def test_simulacra_run_reports_each_stage_and_fails_with_the_stage_named(tmp_path):
    config = write_config(tmp_path, orchestration={"stages": DATA_STAGES, "fail_stage": "ingest"})
    runner = CliRunner()
    failed = runner.invoke(app, ["run", "--config", str(config), "--stages", "ingest,filter"])
    assert failed.exit_code == 1
    assert "stage 'ingest' failed: injected fault" in " ".join(failed.output.split())
    resumed = runner.invoke(app, ["run", "--config", str(config)])
    assert resumed.exit_code == 0, resumed.output
    assert table_statuses(resumed.output) == {stage: "ran" for stage in DATA_STAGES}
    unknown = runner.invoke(app, ["run", "--config", str(config), "--stages", "ingest,judge"])
    assert unknown.exit_code == 2 and "judge" in unknown.output


def test_a_stage_run_before_its_inputs_names_what_to_run_first_not_a_rerun(tmp_path):
    """A UserFixableError inside `simulacra run` is the stage's one line and status 2, as when the stage runs alone:
    "rerun the same command to resume" would fail again until the named stage has run."""
    config = write_config(tmp_path)
    failed = CliRunner().invoke(app, ["run", "--config", str(config), "--stages", "sft"])
    assert failed.exit_code == 2, failed.output
    printed = " ".join(failed.output.split())
    refusal = "stage 'sft' failed: the store holds no trajectory: run `simulacra ingest` first"  # not "cpt first"
    assert refusal in printed
    assert "rerun the same command" not in printed


def test_a_stage_that_fills_the_disk_fails_with_the_fix_named_and_the_rerun_resumes_it(tmp_path):
    """score's plot drawn onto /dev/full, which answers every write with ENOSPC, as a full disk does."""
    config = write_config(tmp_path)
    plot = tmp_path / "ws" / "runs" / "score" / "categories.png"
    plot.parent.mkdir(parents=True)
    plot.symlink_to("/dev/full")
    runner = CliRunner()
    failed = runner.invoke(app, ["run", "--config", str(config)])
    assert failed.exit_code == 1
    printed = " ".join(failed.output.split())
    assert "stage 'score' failed: a write failed because the disk is full or over its quota (" in printed
    assert f" free at {tmp_path / 'ws'}): free space there; rerun the same command to resume" in printed
    plot.unlink()
    resumed = runner.invoke(app, ["run", "--config", str(config)])
    assert resumed.exit_code == 0, resumed.output
    assert table_statuses(resumed.output) == {"ingest": "skipped", "filter": "skipped", "score": "ran", "split": "ran"}
    assert executions(tmp_path)["score"] == ["failed", "completed"]


def test_a_run_on_a_server_logs_its_progress_lines_where_the_ui_shows_them(tmp_path):
    """Found by probing: the Logs tab of a run training for minutes showed only "Beginning flow run"; its progress
    went to the worker's log alone."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    state = world_model_pipeline(config_path=str(write_config(tmp_path)), return_state=True)
    run_id = state.state_details.flow_run_id
    APILogWorker.drain_all(timeout=30)  # logs are sent in batches, in the background
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    messages = [log.message for log in logs]
    assert any(message.startswith("filter: started, ") and message.endswith(" to do") for message in messages), messages


def test_a_stage_waiting_for_the_gpu_slot_does_not_hold_the_store(tmp_path, monkeypatch):
    """Found by probing: a run queued for the `gpu` slot held the store's write lock while it waited, and the nightly
    refresh failed after 120 s behind it. While the slot is awaited, another process writes to the store."""
    import subprocess
    import sys
    from contextlib import contextmanager

    import flows.dag

    database = tmp_path / "ws" / "simulacra.duckdb"
    writes: list[str] = []

    @contextmanager
    def slot_taken_by_another_run(config, stage):
        write = f"import duckdb; duckdb.connect({str(database)!r}).execute('CREATE TABLE IF NOT EXISTS probe (x INT)')"
        done = subprocess.run([sys.executable, "-c", write], capture_output=True, text=True, timeout=120)
        writes.append(stage if done.returncode == 0 else done.stderr.strip().splitlines()[-1])
        yield

    monkeypatch.setattr(flows.dag, "gpu_slot", slot_taken_by_another_run)
    world_model_pipeline(config_path=str(write_config(tmp_path)))
    assert writes == DATA_STAGES


def test_a_stage_whose_work_another_run_did_while_it_waited_for_the_slot_is_skipped(tmp_path, monkeypatch):
    """A second run queued for the `gpu` slot behind a run of the same stage and inputs: once it has the slot, the
    store says the work is done, and it is skipped rather than done twice."""
    from contextlib import contextmanager

    import flows.dag
    import stages.score
    from pipeline.config import load_config
    from pipeline.orchestration.fingerprint import stage_fingerprint

    config_path = write_config(tmp_path)

    @contextmanager
    def slot_held_by_a_run_of_the_same_stage(config, stage):
        if stage == "score":
            other = load_config(config_path, [])
            with Store(tmp_path / "ws" / "simulacra.duckdb") as store:
                fingerprint = stage_fingerprint(other, store, "score")
                stage_runs.execute(store, "score", fingerprint, lambda: stages.score.run(other, store))
        yield

    monkeypatch.setattr(flows.dag, "gpu_slot", slot_held_by_a_run_of_the_same_stage)
    outcomes = world_model_pipeline(config_path=str(config_path))
    assert [(o.stage, o.status) for o in outcomes] == [
        ("ingest", "ran"),
        ("filter", "ran"),
        ("score", "skipped"),
        ("split", "ran"),
    ]
    assert executions(tmp_path)["score"] == ["completed", "skipped"]


def test_a_ctrl_c_duckdb_caught_mid_query_leaves_the_run_crashed_not_failed(tmp_path, monkeypatch):
    """ctrl-C while DuckDB runs a query reaches Python as DuckDB's InterruptException, an Exception: Prefect recorded
    the flow run FAILED, as if the stage had a fault. Here filter's query is interrupted for real, from another
    thread, as DuckDB's own SIGINT handling does; the run ends CRASHED (an interrupted run), the stage's row is
    `failed` with DuckDB's words, and the rerun resumes at filter."""
    import threading

    import duckdb
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    import stages.filter

    def interrupted_filter(config, store):
        connection, answered = duckdb.connect(), threading.Event()

        def interrupt() -> None:  # again until the query gives up: one sent before it started would be lost
            while not answered.wait(0.2):
                connection.interrupt()

        threading.Thread(target=interrupt, daemon=True).start()
        try:
            connection.execute("SELECT sum(a.range * b.range) FROM range(100000000) a, range(100000) b").fetchall()
        finally:
            answered.set()

    config = write_config(tmp_path)
    monkeypatch.setattr(stages.filter, "run", interrupted_filter)
    with pytest.raises(KeyboardInterrupt, match="INTERRUPT Error"):
        world_model_pipeline(config_path=str(config))
    with get_client(sync_client=True) as client:
        [flow_run] = client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=1)
        runs = [run for run in client.read_task_runs() if run.flow_run_id == flow_run.id]
    task_states = {run.name.rsplit("-", 1)[0]: run.state.type.value for run in runs}  # "filter-c9c"
    assert flow_run.state.type.value == "CRASHED"
    assert task_states == {"ingest": "COMPLETED", "filter": "CRASHED"}
    assert executions(tmp_path) == {"ingest": ["completed"], "filter": ["failed"]}

    monkeypatch.undo()
    outcomes = world_model_pipeline(config_path=str(config))
    assert [o.status for o in outcomes] == ["skipped", "ran", "ran", "ran"]


# (stage, key the stage gave, key in the UI)
KEYS = [
    ("ingest", "ingest-counts", "ingest-counts"),
    ("split", "pools", "split-pools"),
    ("cpt", "Loss Curve", "cpt-loss-curve"),
    ("score", "summary", "score-summary"),
]


@pytest.mark.parametrize("stage,given,key", KEYS, ids=[k for _, _, k in KEYS])
def test_artifact_keys_are_prefixed_with_their_stage_in_prefects_alphabet(stage, given, key):
    assert stage_key(stage, given) == key


# (tables and plots a stage gives, the artifacts the UI then holds: key -> type). Issue 29.8: score's table and
# plot were both `score-categories`, and the UI kept the plot alone.
PUBLISHED = [
    (
        "a table and its plot under one name",
        ["categories"],
        ["categories"],
        {"score-categories": "table", "score-categories-plot": "image"},
    ),
    ("a plot of its own", ["counts"], ["score-share-bars"], {"score-counts": "table", "score-share-bars": "image"}),
]


@pytest.mark.parametrize("tables,images,held", [case[1:] for case in PUBLISHED], ids=[case[0] for case in PUBLISHED])
def test_each_artifact_has_its_own_key_and_a_plot_is_described_in_words(tmp_path, tables, images, held):
    from prefect import flow

    from flows.artifacts import publish_stage
    from pipeline.stage import StageResult

    png = tmp_path / "plot.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    result = StageResult(
        "score",
        tables={key: [{"domain": "terminal", "turns": 3}] for key in tables},
        images={key: png for key in images},
    )

    @flow(name="publish")
    def publish():
        publish_stage("score", "f" * 16, result)

    publish()
    for key, kind in held.items():
        artifact = Artifact.get(key)
        assert artifact.type == kind, key
        if kind == "image":  # in words, not a path on the worker's disk
            assert artifact.description.startswith("score: plot of the ") and str(tmp_path) not in artifact.description


# (overrides, the variable the key is in): the key where no rule on the URL sees it (issue 29.4), or anywhere else.
KEY_IN_OVERRIDES = [
    ("in a URL's path", ["sft.judge.endpoint.base_url=http://127.0.0.1:9/v1/{key}"], "OPENAI_API_KEY"),
    ("in a URL's fragment", ["sft.judge.endpoint.base_url=http://127.0.0.1:9/v1#{key}"], "OPENAI_API_KEY"),
    ("as another field's value", ["sft.judge.endpoint.model=m-{key}"], "OPENAI_API_KEY"),
    (
        "of a variable another override names",
        [
            "sft.judge.endpoint.api_key_env=SIMULACRA_JUDGE_KEY",
            "sft.judge.endpoint.base_url=http://127.0.0.1:9/{key}/v1",
        ],
        "SIMULACRA_JUDGE_KEY",
    ),
]
OVERRIDDEN_FLOWS = [world_model_pipeline, *(getattr(stage_flows, f"{stage}_flow") for stage in STAGE_ORDER)]


@pytest.mark.parametrize(
    "overrides,variable", [case[1:] for case in KEY_IN_OVERRIDES], ids=[case[0] for case in KEY_IN_OVERRIDES]
)
@pytest.mark.parametrize("overridden", OVERRIDDEN_FLOWS, ids=[f.name for f in OVERRIDDEN_FLOWS])
def test_a_configured_key_is_redacted_from_the_stored_overrides_wherever_it_is(
    monkeypatch, overridden, overrides, variable
):
    from pipeline.llm.credentials import REDACTED

    key = f"sk-simulacra-{uuid.uuid4().hex}"
    monkeypatch.setenv(variable, key)
    given = [override.format(key=key) for override in overrides]
    stored = overridden.serialize_parameters({"config_path": "", "overrides": given})
    assert stored["overrides"] == [override.replace(key, REDACTED) for override in given]
    assert key not in json.dumps(stored)


@pytest.mark.parametrize("stored_as_typed", [False, True], ids=["called in the process", "started by the server"])
def test_the_run_uses_the_overrides_as_given_and_prefect_stores_them_redacted(tmp_path, monkeypatch, stored_as_typed):
    """Called in the process, the flow's `serialize_parameters` stores the overrides redacted. Found by probing: a run
    started from the UI or the API is stored by Prefect's server as it was typed, and its Parameters tab showed the
    key; stored so here (the base Flow's serialisation), the run rewrites them redacted as it starts."""
    from prefect import Flow, get_client

    from flows import world_model
    from flows.stored_parameters import PipelineFlow
    from pipeline.llm.credentials import REDACTED

    # Not in a provider's shape: a value of that shape is refused by the config itself (tests/test_config.py), and
    # this is the redaction of a key the run knows (its environment's), whatever it looks like.
    key = f"simulacra-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    if stored_as_typed:
        monkeypatch.setattr(PipelineFlow, "serialize_parameters", Flow.serialize_parameters)
    used = []
    monkeypatch.setattr(world_model, "run_stages", lambda config, stages: used.append(config) or [])
    url = f"http://127.0.0.1:9/v1/{key}"
    state = world_model_pipeline(
        config_path=str(write_config(tmp_path)), overrides=[f"sft.judge.endpoint.base_url={url}"], return_state=True
    )
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id).parameters
    assert stored["overrides"] == [f"sft.judge.endpoint.base_url=http://127.0.0.1:9/v1/{REDACTED}"]
    assert key not in json.dumps(stored) and used[0].sft.judge.endpoint.base_url == url


def test_parameters_are_typed_and_described_for_the_ui_form():
    schema = world_model_pipeline.parameters.model_dump()
    properties = schema["properties"]
    assert set(properties) == {"config_path", "workspace", "stages", "overrides", "base_model", "max_steps"}
    assert all(p.get("description") for p in properties.values())
    assert properties["stages"]["items"]["enum"] == list(STAGE_ORDER)
    assert (properties["max_steps"]["type"], properties["max_steps"]["minimum"]) == ("integer", 0)


# Every flow a deployment in deploy/prefect.yaml runs.
DEPLOYED_FLOWS = [world_model_pipeline, *(getattr(stage_flows, f"{stage}_flow") for stage in STAGE_ORDER), gpu_stage]


@pytest.mark.parametrize("deployed", DEPLOYED_FLOWS, ids=[f.name for f in DEPLOYED_FLOWS])
def test_every_parameter_renders_as_one_plain_field_with_its_type_and_default(deployed):
    """What the UI's run form and a deployment's Parameters tab render from. Prefect's UI shows
    `X | None` (JSON schema `anyOf`) as two forms behind a type toggle set to None, and shows no type
    or default for it; a plain type with a `null` default fails its own validation when left empty
    (issue 8, item 5). So: one type, and a default of that type unless the parameter is required."""
    schema = deployed.parameters.model_dump()
    for name, spec in schema["properties"].items():
        assert "anyOf" not in spec and spec.get("type"), f"{deployed.name}.{name}: {spec}"
        assert name in schema["required"] or spec.get("default") is not None, f"{deployed.name}.{name}: {spec}"


# (parameters of a flow run, expected (learning rate, base model, cpt max steps, workspace)); a
# workspace of None: the config file's.
PARAMETERS = [
    ({}, (5e-4, None, 60, None)),
    (
        {
            "overrides": ["cpt.learning_rate=0.001"],
            "base_model": "Qwen/Qwen3-0.6B",
            "max_steps": 3,
            "workspace": "/srv/ws",
        },
        (0.001, "Qwen/Qwen3-0.6B", 3, "/srv/ws"),
    ),
]


@pytest.mark.parametrize("given,expected", PARAMETERS, ids=["defaults keep the config's", "typed parameters override"])
def test_typed_parameters_override_the_config_file_and_their_defaults_keep_it(tmp_path, given, expected):
    arguments = {"overrides": (), "base_model": "", "max_steps": 0, "workspace": ""} | given
    config = resolve_config(str(write_config(tmp_path)), **arguments)
    learning_rate, base_model, max_steps, workspace = expected
    assert (config.cpt.learning_rate, config.model.base, config.cpt.max_steps) == (learning_rate, base_model, max_steps)
    assert str(config.workspace.path) == (workspace or str(tmp_path / "ws"))


def test_a_gpu_stage_with_no_such_deployment_fails_before_preparing(tmp_path):
    config = write_config(tmp_path, orchestration={"stages": ["cpt"], "gpu_deployment": "gpu-stage/nowhere"})
    with pytest.raises(StageFailed, match="the server has no deployment 'gpu-stage/nowhere'"):
        world_model_pipeline(config_path=str(config))
    assert executions(tmp_path) == {"cpt": ["failed"]}
    assert not (tmp_path / "ws" / "runs").exists()


def test_every_stage_has_inputs_a_flow_and_a_deployment():
    spec = yaml.safe_load(PREFECT_FILE.read_text())
    entrypoints = {d["name"]: d["entrypoint"] for d in spec["deployments"]}
    for stage in STAGE_ORDER:
        assert stage in STAGE_INPUTS
        assert getattr(stage_flows, f"{stage}_flow").name == stage
        assert entrypoints[stage] == f"flows/stage_flows.py:{stage}_flow"
    nightly = next(d for d in spec["deployments"] if d["name"] == "nightly-data-refresh")
    assert nightly["parameters"]["stages"] == ["ingest", "filter", "score", "split"]
    assert nightly["concurrency_limit"]["limit"] == 1
