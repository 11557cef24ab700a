"""A training run's folder is one process's at a time: two `simulacra cpt` (two clicks on a deployment) trained the
same run into the same folder at once, computing it twice and racing on its checkpoints. A real second process
holds the folder here; the system releases a holder that dies, so a killed run leaves nothing stale."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import UserFixableError
from pipeline.training.runs import RUN_LOCK, _hold_run_folder, release_run_folder

REPO = Path(__file__).resolve().parents[1]
HOLD = """
import sys, time
from pathlib import Path
from pipeline.training.runs import _hold_run_folder
_hold_run_folder(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


def holder(folder: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout is not None and process.stdout.readline() == "held\n"
    return process


def test_a_run_folder_another_process_trains_is_refused_naming_it_and_free_once_it_dies(tmp_path):
    folder = tmp_path / "runs" / "cpt" / "98f8ca0c6358dfee"
    folder.mkdir(parents=True)
    other = holder(folder)
    try:
        with pytest.raises(UserFixableError) as refused:
            _hold_run_folder(folder)
        assert str(refused.value) == (
            f"{folder} is being trained by another process (pid {other.pid}): let it finish, then rerun (its model is "
            "then reused, not trained again), or stop it"
        )
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait(timeout=30)
    _hold_run_folder(folder)  # killed, it holds nothing: no stale lock to remove by hand
    assert (folder / RUN_LOCK).read_text() == f"{os.getpid()}\n"
    _hold_run_folder(folder)  # this process again (a stage rerun in one `simulacra run`): already its own
    release_run_folder(folder)
    again = holder(folder)  # released once recorded: another process may claim it
    again.send_signal(signal.SIGKILL)
    again.wait(timeout=30)
