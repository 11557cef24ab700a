"""Against a real Prefect server on 127.0.0.1, one for the module, started by `simulacra server
start` from a copy of the project in a temporary folder while the code comes from elsewhere (as an
installed package or another checkout): the work pools, the `gpu` limit, the deployments of
deploy/prefect.yaml bound to that folder, the nightly schedule; a run triggered with the
deployment's defaults writing only there; and a GPU stage dispatched to the GPU process pool's
worker, failed by the fault hook after its first checkpoint, retried with `prefect flow-run retry`,
resuming from that checkpoint. `simulacra server stop` ends server and worker, also when an
assertion failed.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pipeline.orchestration.prefect_server import LocalServer, prefect_executable
from pipeline.store.database import Store
from pipeline.store.stage_runs import history

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo"
PREFECT_FILE = REPO / "deploy" / "prefect.yaml"
# What a flow run executes: copied into the temporary project folder.
PROJECT_PARTS = ("pipeline", "stages", "flows", "deploy")
# The nightly refresh's stages, as far as they have been written: each joins when its module lands.
DATA_STAGES = ["ingest", "filter", "score", "split"]
GPU_POOL = "simulacra-process-gpu"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}

needs_prefect = pytest.mark.skipif(
    not Path(prefect_executable()).is_file(), reason="the `prefect` executable is not installed beside this Python"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def api(url: str, body: dict | None = None, attempts: int = 5) -> dict:
    """One call to the server's REST API. A 429, 502 or 503 is retried with backoff, as Prefect's own client
    retries them: a loaded machine once got a 503 from `create_flow_run` while the server's database was busy."""
    request = urllib.request.Request(
        url, data=None if body is None else json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            if error.code not in (429, 502, 503) or attempt == attempts - 1:
                raise
            time.sleep(2**attempt)


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie waiting for init to reap it (`server stop` returns once its processes
    have exited, which is before init collects them)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: kill 0 is all there is
    return stat[stat.rindex(")") + 2] not in "ZX"


def executions(workspace: Path) -> dict[str, list[str]]:
    with Store(workspace / "simulacra.duckdb", read_only=True) as store:
        runs = history(store)
    statuses: dict[str, list[str]] = {}
    for run in runs:
        statuses.setdefault(run.stage, []).append(run.status)
    return statuses


@dataclass
class Served:
    project: Path  # the temporary project folder `server start` ran in
    api_url: str
    env: dict[str, str]  # for `prefect` commands against the server

    def get(self, path: str, body: dict | None = None) -> dict:
        return api(f"{self.api_url}/{path}", body)

    def trigger(self, deployment: str, parameters: dict | None = None) -> str:
        found = self.get(f"deployments/name/{deployment}")
        return self.get(f"deployments/{found['id']}/create_flow_run", {"parameters": parameters or {}})["id"]

    def final_state(self, flow_run_id: str, timeout_s: float = 240) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.get(f"flow_runs/{flow_run_id}")["state"]["type"]
            if state in TERMINAL:
                return state
            time.sleep(0.5)
        raise AssertionError(f"flow run {flow_run_id} did not finish in {timeout_s:.0f}s")

    def prefect(self, *arguments: str) -> str:
        done = subprocess.run(
            [prefect_executable(), *arguments],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"prefect {' '.join(arguments)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout


def copy_project(folder: Path) -> Path:
    for part in PROJECT_PARTS:
        shutil.copytree(REPO / part, folder / part, ignore=shutil.ignore_patterns("__pycache__"))
    config = {
        "workspace": {"path": "ws"},  # relative: to the folder the command runs in
        "ingest": {"batch_trajectories": 40, "sources": [{"name": "terminal", "path": str(DEMO / "terminal.jsonl")}]},
        "orchestration": {"stages": DATA_STAGES},
    }
    (folder / "simulacra.yaml").write_text(yaml.safe_dump(config))
    return folder


def stop_worker(worker: subprocess.Popen) -> None:
    """A worker needs two SIGINTs (STACK.md); the first only asks it to finish."""
    for _ in range(2):
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGINT)
            time.sleep(1.0)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`simulacra server start` run in a copy of the project, the CLI's code taken from this
    repository (`-P`: not from the current folder), plus a worker of the GPU process pool started as
    a GPU host starts it. Stopped at the end of the module, and every process checked gone."""
    project = copy_project(tmp_path_factory.mktemp("project"))
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    prefect_home = project / "ws" / "prefect"
    # Nothing from the caller's Prefect profile; workers poll every second instead of every ten.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PYTHONPATH": str(REPO),
    }
    simulacra = [sys.executable, "-P", "-m", "pipeline.cli", "--config", "simulacra.yaml", "server"]
    prefect_env = env | {"PREFECT_API_URL": api_url, "PREFECT_HOME": str(prefect_home), "DO_NOT_TRACK": "1"}
    started = subprocess.run(
        [*simulacra, "start", "--port", str(port)], cwd=project, env=env, capture_output=True, text=True, timeout=240
    )
    pids = [int(p.read_text()) for p in prefect_home.glob("simulacra-*.pid")]
    gpu_worker = None
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert len(pids) == 2
        with (prefect_home / "gpu-worker.log").open("ab") as log:
            gpu_worker = subprocess.Popen(
                [prefect_executable(), "worker", "start", "--pool", GPU_POOL],
                cwd=project,
                env=prefect_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        yield Served(project, api_url, prefect_env)
    finally:
        if gpu_worker is not None:
            stop_worker(gpu_worker)
        stopped = subprocess.run(
            [*simulacra, "stop"], cwd=project, env=env, capture_output=True, text=True, timeout=120
        )
    assert stopped.returncode == 0, stopped.stderr
    assert not [pid for pid in pids if alive(pid)]


@needs_prefect
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_triggered_with_the_deployments_defaults_writes_only_in_the_project_folder(served):
    pools = {pool["name"]: pool for pool in served.get("work_pools/filter", {})}
    assert {name: pool["type"] for name, pool in pools.items()} == {
        "simulacra-process": "process",
        GPU_POOL: "process",
        "simulacra-docker-gpu": "docker",
        "simulacra-kubernetes-gpu": "kubernetes",
    }
    assert "gpu_count" in pools["simulacra-kubernetes-gpu"]["base_job_template"]["variables"]["properties"]
    assert served.get("v2/concurrency_limits/gpu")["limit"] == 1
    spec = yaml.safe_load(PREFECT_FILE.read_text())
    assert {d["name"] for d in served.get("deployments/filter", {})} == {d["name"] for d in spec["deployments"]}

    nightly_spec = next(d for d in spec["deployments"] if d["name"] == "nightly-data-refresh")
    nightly = served.get("deployments/name/world-model-pipeline/nightly-data-refresh")
    assert [s["schedule"]["cron"] for s in nightly["schedules"]] == [nightly_spec["schedules"][0]["cron"]]
    assert nightly["global_concurrency_limit"]["limit"] == 1
    assert nightly["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"

    # The deployment records the project folder and hands its runs absolute paths.
    pipeline = served.get("deployments/name/world-model-pipeline/world-model-pipeline")
    assert pipeline["pull_steps"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(served.project)}}
    ]
    workspace = served.project / "ws"
    assert pipeline["parameters"] == {
        "config_path": str(served.project / "simulacra.yaml"),
        "workspace": str(workspace),
    }

    # The checkout the code runs from may hold a workspace of its own (after `make demo`): the run must
    # leave it as it was.
    checkout_before = checkout_workspaces()
    run = served.trigger("world-model-pipeline/world-model-pipeline")
    assert served.final_state(run) == "COMPLETED"
    assert executions(workspace) == {stage: ["completed"] for stage in DATA_STAGES}
    assert checkout_workspaces() == checkout_before


@needs_prefect
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_server_deploy_deploys_an_edited_cron_bound_to_the_same_config_and_workspace(served):
    """Found by probing: the documented way to change the cron (edit, `prefect deploy`) pointed the nightly refresh at
    data/configs/demo.yaml and the project's default workspace, without a word."""
    spec_file = served.project / "deploy" / "prefect.yaml"
    original = spec_file.read_text()
    spec_file.write_text(original.replace('cron: "0 2 * * *"', 'cron: "30 3 * * *"'))
    try:
        done = subprocess.run(
            [sys.executable, "-P", "-m", "pipeline.cli", "--config", "simulacra.yaml", "server", "deploy"],
            cwd=served.project,
            env={k: v for k, v in served.env.items() if not k.startswith("PREFECT_")},
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        spec_file.write_text(original)
    assert done.returncode == 0, done.stdout + done.stderr
    nightly = served.get("deployments/name/world-model-pipeline/nightly-data-refresh")
    assert [s["schedule"]["cron"] for s in nightly["schedules"]] == ["30 3 * * *"]
    assert nightly["parameters"]["config_path"] == str(served.project / "simulacra.yaml")
    assert nightly["parameters"]["workspace"] == str(served.project / "ws")


def test_server_deploy_without_a_running_server_says_how_to_start_one(tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli import app

    result = CliRunner().invoke(
        app, ["--set", f"workspace.path={tmp_path / 'ws'}", "server", "deploy", "--project-dir", str(REPO)]
    )
    assert result.exit_code == 2, result.output
    assert "this workspace's server is not running" in result.output and "server start" in result.output


def checkout_workspaces() -> dict[str, tuple[int, int]]:
    """Every file under the checkout's possible workspace folders, with its size and modification time."""
    found = {}
    for folder in (REPO / "ws", REPO / "simulacra-workspace"):
        for path in folder.rglob("*") if folder.is_dir() else ():
            if path.is_file():
                stat = path.stat()
                found[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return found


def flow_runs_of(served: Served, deployment: str) -> list[dict]:
    found = served.get(f"deployments/name/{deployment}")
    return served.get(
        "flow_runs/filter", {"sort": "START_TIME_ASC", "flow_runs": {"deployment_id": {"any_": [found["id"]]}}}
    )


@needs_prefect
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_gpu_stage_trains_on_the_gpu_pool_and_a_retry_resumes_from_its_checkpoint(served):
    config = served.project / "gpu.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "workspace": {"path": "ws-gpu"},
                "ingest": {
                    "batch_trajectories": 40,
                    "sources": [{"name": "terminal", "path": str(DEMO / "terminal.jsonl")}],
                },
                "cpt": {
                    "max_steps": 4,
                    "save_steps": 2,
                    "tokens_per_step": 1024,
                    "micro_batch_rows": 4,
                    "max_length": 256,
                    "eval_max_sequences": 8,
                },
                # Fails once, in the GPU run, after the checkpoint of step 2.
                "orchestration": {
                    "gpu_deployment": "gpu-stage/process-gpu",
                    "fail_stage": "cpt",
                    "stages": [*DATA_STAGES, "cpt"],
                },
            }
        )
    )
    workspace = served.project / "ws-gpu"
    parameters = {"config_path": str(config), "workspace": str(workspace)}
    run = served.trigger("world-model-pipeline/world-model-pipeline", parameters)
    assert served.final_state(run, timeout_s=400) == "FAILED"
    assert executions(workspace) == {stage: ["completed"] for stage in DATA_STAGES} | {"cpt": ["failed"]}

    assert re.search(r"scheduled for\s+retry", served.prefect("flow-run", "retry", run))
    assert served.final_state(run, timeout_s=400) == "COMPLETED"
    assert executions(workspace) == {stage: ["completed", "skipped"] for stage in DATA_STAGES} | {
        "cpt": ["failed", "completed"]
    }

    # Ingestion and the other data stages ran in the pipeline's run, on the process pool; each CPT
    # attempt ran as its own flow run on the GPU pool, the second from the first one's checkpoint.
    assert served.get(f"flow_runs/{run}")["work_pool_name"] == "simulacra-process"
    gpu_runs = flow_runs_of(served, "gpu-stage/process-gpu")
    assert [(r["work_pool_name"], r["state"]["type"]) for r in gpu_runs] == [
        (GPU_POOL, "FAILED"),
        (GPU_POOL, "COMPLETED"),
    ]
    parents = {served.get(f"task_runs/{r['parent_task_run_id']}")["flow_run_id"] for r in gpu_runs}
    assert parents == {run}
    with Store(workspace / "simulacra.duckdb", read_only=True) as store:
        [registered] = store.rows("SELECT path, metrics FROM checkpoints")
    metrics = json.loads(registered["metrics"])
    assert (metrics["resumed_from_step"], metrics["first_step_this_run"], metrics["global_step"]) == (2, 2, 4)
    assert (Path(registered["path"]) / "model.safetensors").is_file()


def rendered(template_file: Path) -> dict:
    """The job configuration a worker builds from the template's defaults (what Prefect's
    BaseJobConfiguration.from_template_and_values does when a deployment sets nothing)."""
    from prefect.utilities.templating import apply_values, find_placeholders

    template = json.loads(template_file.read_text())
    variables = template["variables"]["properties"]
    undefined = {p.name for p in find_placeholders(template["job_configuration"])} - variables.keys()
    assert not undefined, f"{template_file.name}: placeholders without a variable: {undefined}"
    defaults = {name: spec["default"] for name, spec in variables.items() if spec.get("default") is not None}
    return apply_values(template["job_configuration"], defaults)


DOCKER = REPO / "deploy" / "docker" / "job-template.json"
K8S = REPO / "deploy" / "k8s" / "job-template.json"
POD = ("job_manifest", "spec", "template", "spec")
# (template, path into the rendered job configuration, expected value)
TEMPLATE_DEFAULTS = [
    (DOCKER, ("image",), "simulacra-gpu:latest"),
    (DOCKER, ("container_create_kwargs", "device_requests", 0, "capabilities"), [["gpu"]]),
    (DOCKER, ("volumes",), ["simulacra-workspace:/workspace"]),
    (K8S, (*POD, "containers", 0, "image"), "simulacra-gpu:latest"),
    (K8S, (*POD, "containers", 0, "resources", "limits", "nvidia.com/gpu"), 1),
    (K8S, (*POD, "containers", 0, "volumeMounts", 0, "mountPath"), "/workspace"),
    (K8S, (*POD, "volumes", 0, "persistentVolumeClaim", "claimName"), "simulacra-workspace"),
]


@pytest.mark.parametrize(
    "template,path,expected", TEMPLATE_DEFAULTS, ids=[f"{t.parent.name}:{p[-1]}" for t, p, _ in TEMPLATE_DEFAULTS]
)
def test_gpu_job_templates_render_the_image_gpus_and_workspace_volume(template, path, expected):
    value = rendered(template)
    for step in path:
        value = value[step]
    assert value == expected


def start_server(tmp_path, port: str) -> tuple[Path, subprocess.CompletedProcess]:
    """`simulacra server start --port PORT` in a copy of the project, as a process, outside any Prefect settings."""
    project = copy_project(tmp_path / "project")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {"PYTHONPATH": str(REPO)}
    started = subprocess.run(
        [sys.executable, "-P", "-m", "pipeline.cli", "--config", "simulacra.yaml", "server", "start", "--port", port],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return project, started


def test_a_port_another_process_holds_is_refused_before_anything_starts(tmp_path):
    """`prefect server start` on a held port exits at once, and the health check took whatever answered there, another
    workspace's Prefect server among them, for this workspace's server and deployed to it. Now one line, status 2,
    and no process started (no pid file)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        project, started = start_server(tmp_path, str(port))
    assert started.returncode == 2, started.stdout + started.stderr
    assert " ".join(started.stderr.split()) == (
        f"server: port {port} on 127.0.0.1 is in use by another process: stop it, or pass another --port"
    )
    assert not list((project / "ws").rglob("simulacra-*.pid"))


@pytest.mark.parametrize(
    "port, said",
    [
        ("70000", "port 70000: a TCP port is 0-65535 (0 takes a free one): pass another --port"),
        (
            "0",
            "--port 0: the Prefect server needs a fixed port (the UI's address and PREFECT_API_URL name it): pass one",
        ),
    ],
)
def test_a_port_no_server_can_take_is_refused_in_one_line(tmp_path, port, said):
    """70000 ended in socket's OverflowError traceback; 0 started a server on a port only it knew."""
    project, started = start_server(tmp_path, port)
    assert started.returncode == 2, started.stdout + started.stderr
    assert " ".join(started.stderr.split()).startswith(f"server: {said}")
    assert not list((project / "ws").rglob("simulacra-*.pid"))


def test_status_is_healthy_only_where_this_workspaces_server_answers(tmp_path):
    """Another server answering /health on the workspace's port (another workspace's Prefect server) was reported as
    `healthy: true` beside `server_pid: null`. A real HTTP server on 127.0.0.1 stands in for it."""
    import http.server
    import json
    import threading

    from typer.testing import CliRunner

    from pipeline.cli import app

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # the name http.server calls
            self.send_response(200 if self.path == "/api/health" else 404)
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args):
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    home = tmp_path / "ws" / "prefect"
    home.mkdir(parents=True)
    (home / "simulacra-server.url").write_text(f"http://127.0.0.1:{other.server_address[1]}/api")
    try:
        status = CliRunner().invoke(app, ["--set", f"workspace.path={tmp_path / 'ws'}", "server", "status"])
        assert json.loads(status.stdout)["server_pid"] is None and json.loads(status.stdout)["healthy"] is False
        LocalServer(home).record("server", os.getpid())  # a live pid: this workspace's server, as `start` records it
        status = CliRunner().invoke(app, ["--set", f"workspace.path={tmp_path / 'ws'}", "server", "status"])
        assert json.loads(status.stdout)["healthy"] is True
    finally:
        other.shutdown()
