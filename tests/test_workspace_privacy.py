"""A workspace is private to its owner (issue 20): another local user, or a verifier in the
sandbox, read the store and Prefect's database, which keeps the Secret blocks' key beside their
ciphertext."""

import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.orchestration.prefect_env import configure
from pipeline.store.database import Store

MODES = {"workspace": 0o700, "prefect home": 0o700, "store": 0o600}


def modes(workspace: Path) -> dict[str, int]:
    paths = {"workspace": workspace, "prefect home": workspace / "prefect", "store": workspace / "simulacra.duckdb"}
    return {name: stat.S_IMODE(path.stat().st_mode) for name, path in paths.items()}


def open_workspace(workspace: Path) -> None:
    """What `simulacra run` does first: Prefect's environment, then the store."""
    config = load_config(None, [{"workspace": {"path": str(workspace)}}])
    configure(config.workspace.prefect_home)
    with Store(config.workspace.database_path) as store:
        store.connection  # noqa: B018 - the property opens and migrates the store


@pytest.fixture
def shared_folder():
    """A folder every local user may enter, as a home or project folder often is."""
    folder = Path(tempfile.mkdtemp(prefix="simulacra-workspace-test-"))
    folder.chmod(0o755)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=True)


def test_a_new_workspace_is_private(shared_folder):
    open_workspace(shared_folder / "workspace")
    assert modes(shared_folder / "workspace") == MODES


def test_a_workspace_made_open_to_others_is_closed(shared_folder):
    workspace = shared_folder / "workspace"
    (workspace / "prefect").mkdir(parents=True, mode=0o755)
    workspace.chmod(0o755)
    open_workspace(workspace)
    (workspace / "simulacra.duckdb").chmod(0o644)  # as a store made before the fix was
    open_workspace(workspace)
    assert modes(workspace) == MODES


def test_a_store_in_a_shared_sticky_folder_leaves_the_folder_open(shared_folder):
    """A store file placed directly in a folder like /tmp (mode 1777) is private; the folder stays shared."""
    shared_folder.chmod(0o1777)
    with Store(shared_folder / "scratch.duckdb") as store:
        store.connection  # noqa: B018 - the property opens and migrates the store
    assert stat.S_IMODE(shared_folder.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared_folder / "scratch.duckdb").stat().st_mode) == 0o600


def test_a_workspace_its_owner_made_read_only_is_refused_and_left_as_set(shared_folder):
    """Issue 29.2: taking group and other bits away is ours to do; giving the owner write back is not."""
    from pipeline.config.workspace import OwnerLockedOut

    workspace = shared_folder / "workspace"
    workspace.mkdir()
    workspace.chmod(0o555)
    with pytest.raises(OwnerLockedOut, match=f"cannot write {workspace}: it is mode 0555"):
        open_workspace(workspace)
    assert stat.S_IMODE(workspace.stat().st_mode) == 0o555 and not any(workspace.iterdir())


def test_a_workspace_that_is_a_file_is_named_as_one_not_as_a_mode_to_change(tmp_path):
    """`workspace.path` set to a file (0644) was refused as a folder whose owner lacks rwx, with `chmod u+rwx` as the
    fix; the command line says what it is, and the file is left as it was."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    placed = tmp_path / "notes.txt"
    placed.write_text("mine\n")
    placed.chmod(0o644)
    flawed = Path(__file__).resolve().parents[1] / "data" / "demo" / "flawed.jsonl"
    result = CliRunner().invoke(app, ["--set", f"workspace.path={placed}", "ingest", str(flawed)])
    assert result.exit_code == 2, result.output
    assert " ".join(result.output.split()) == (
        f"ingest: {placed} is a file, not a folder: set `workspace.path` to a folder, or move the file away"
    )
    assert placed.read_text() == "mine\n" and stat.S_IMODE(placed.stat().st_mode) == 0o644


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_another_user_reads_neither_the_store_nor_prefects_database(shared_folder):
    workspace = shared_folder / "workspace"
    open_workspace(workspace)
    (workspace / "prefect" / "prefect.db").write_bytes(b"the key")  # Prefect creates it 0644
    read = "import sys\nfor path in sys.argv[1:]:\n    try:\n        open(path, 'rb').read()\n        print('read', path)\n    except PermissionError:\n        pass\n"
    targets = [str(workspace / "simulacra.duckdb"), str(workspace / "prefect" / "prefect.db")]
    system = Path("/usr/bin/python3")  # one that user may run (the project's may live in /root)
    if not system.is_file():
        pytest.skip("needs /usr/bin/python3")
    completed = subprocess.run(
        [str(system), "-I", "-c", read, *targets],
        user=65534,
        group=65534,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=True,
    )
    assert completed.stdout == ""
