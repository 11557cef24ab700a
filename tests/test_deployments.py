"""What `simulacra server start` deploys, without a server: the project folder is the folder the
command runs in (or --project-dir), never the installed package's; each process-pool deployment
records it as its working directory and hands its flow runs absolute config and workspace paths
(issue 8, item 5). The real server runs these deployments in tests/test_prefect_server.py.
"""

import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.orchestration.deployments import PREFECT_FILE, NotAProject, bind, project_folder

REPO = Path(__file__).resolve().parents[1]
WORKDIR_STEP = "prefect.deployments.steps.set_working_directory"


@pytest.fixture
def project(tmp_path) -> Path:
    """A project folder elsewhere than the code under test: deploy/ only."""
    shutil.copytree(REPO / "deploy", tmp_path / "project" / "deploy")
    return tmp_path / "project"


def test_the_project_folder_is_the_current_one_or_the_one_given(project, tmp_path, monkeypatch):
    monkeypatch.chdir(project)
    assert project_folder() == project
    monkeypatch.chdir(tmp_path)
    assert project_folder(project) == project


# (folder passed as --project-dir rather than the current one, the fix the error names)
NOT_A_PROJECT = [
    (False, "run the command in the project folder, or pass --project-dir"),
    (True, "pass the project folder with --project-dir"),
]


@pytest.mark.parametrize("given,hint", NOT_A_PROJECT, ids=["current", "given"])
def test_a_folder_without_deploy_prefect_yaml_is_refused_with_the_fix(tmp_path, monkeypatch, given, hint):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotAProject) as refused:
        project_folder(tmp_path if given else None)
    assert str(refused.value) == f"{tmp_path} is not a Simulacra project folder (no {PREFECT_FILE}): {hint}"


def test_server_start_outside_a_project_stops_before_starting_anything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(f"workspace:\n  path: {tmp_path / 'ws'}\n")
    result = CliRunner().invoke(app, ["--config", str(config), "server", "start", "--port", "1"])
    said = " ".join(result.output.split())  # rich wraps lines
    assert result.exit_code == 2
    assert f"server: {tmp_path} is not a Simulacra project folder" in said and "Traceback" not in said
    assert not (tmp_path / "ws").exists()  # no Prefect home, no server, no worker


def bound(project: Path, config_path: Path | None) -> dict[str, dict]:
    spec = yaml.safe_load((project / PREFECT_FILE).read_text())
    return {d["name"]: d for d in bind(spec, project, Path("/srv/ws"), config_path)["deployments"]}


def working_directory(deployment: dict) -> str:
    [step] = deployment["pull"]
    return step[WORKDIR_STEP]["directory"]


# (deployment, working directory, parameters it hands its flow runs); PROJECT: the project folder,
# CONFIG: the config `server start` was given.
BOUND = [
    ("world-model-pipeline", "PROJECT", {"config_path": "CONFIG", "workspace": "/srv/ws"}),
    (
        "nightly-data-refresh",
        "PROJECT",
        {"config_path": "CONFIG", "workspace": "/srv/ws", "stages": ["ingest", "filter", "score", "split"]},
    ),
    ("cpt", "PROJECT", {"config_path": "CONFIG", "workspace": "/srv/ws"}),
    # The GPU stage gets its config and plan from the pipeline that dispatches it.
    ("process-gpu", "PROJECT", None),
    # The GPU image holds its own project folder and mounts the workspace volume.
    (
        "world-model-pipeline-docker-gpu",
        "/opt/simulacra",
        {"config_path": "data/configs/demo.yaml", "workspace": "/workspace"},
    ),
    (
        "world-model-pipeline-kubernetes-gpu",
        "/opt/simulacra",
        {"config_path": "data/configs/demo.yaml", "workspace": "/workspace"},
    ),
]


@pytest.mark.parametrize("name,directory,parameters", BOUND, ids=[b[0] for b in BOUND])
def test_process_deployments_record_the_project_folder_and_absolute_paths(
    project, tmp_path, name, directory, parameters
):
    config = tmp_path / "mine.yaml"
    deployment = bound(project, config)[name]
    place = {"PROJECT": str(project), "CONFIG": str(config)}
    assert working_directory(deployment) == place.get(directory, directory)
    expected = {
        key: place.get(value, value) if isinstance(value, str) else value for key, value in (parameters or {}).items()
    }
    expected = expected or None
    assert deployment.get("parameters") == expected


def test_without_a_config_each_deployment_keeps_its_own_made_absolute(project):
    deployment = bound(project, None)["world-model-pipeline"]
    assert deployment["parameters"]["config_path"] == str(project / "data" / "configs" / "demo.yaml")
