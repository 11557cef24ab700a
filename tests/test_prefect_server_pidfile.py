"""`simulacra server start|stop|status` trust a pid file only where it names the process this workspace started.

A pid file holding garbage crashed `status` and `stop` with int()'s ValueError. A stale one whose pid the system
had given to an unrelated process made `stop` interrupt, then SIGKILL, that process's group (or raise
ProcessLookupError where it led none), `status` report it as the server, and `start` refuse to start. Now such a
pid file is removed with a one-line note and read as "not running". No Prefect server is started here: the
process this workspace "started" is a `sleep` recorded as `start` records its server; `start --port 0` stands for
a start that got past the check (the port is refused right after it, before anything starts).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.orchestration.prefect_server import LocalServer

REPO = Path(__file__).resolve().parents[1]


def simulacra(workspace: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "--set", f"workspace.path={workspace}", "server", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def home(tmp_path) -> Path:
    """The workspace's Prefect home, where `start` keeps its pid files."""
    prefect_home = tmp_path / "ws" / "prefect"
    prefect_home.mkdir(parents=True)
    return prefect_home


@pytest.fixture
def unrelated(request):
    """A live process in a session (and process group) of its own, as a process that got a stale pid would be;
    where a test asks (indirect parametrization), one that leads no group: os.killpg of its pid had no group."""
    process = subprocess.Popen(["sleep", "600"], start_new_session=getattr(request, "param", True))
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def alive(process: subprocess.Popen) -> bool:
    return process.poll() is None  # reaps it where it ended: no zombie is read as alive


def one_line(result: subprocess.CompletedProcess) -> str:
    return " ".join(result.stderr.split())


@pytest.mark.parametrize("content", ["garbage\n", "", "0\n", "-1\n"])
def test_a_pid_file_without_a_pid_is_not_running_for_status_and_stop(home, content):
    """int() of it was a ValueError traceback, exit 1 (0 and -1 would have signalled this command's own group, or
    every process)."""
    for command in ("status", "stop"):
        (home / "simulacra-server.pid").write_text(content)
        result = simulacra(home.parent, command)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        assert f"removed {home / 'simulacra-server.pid'} (no pid in it" in one_line(result)
        assert not (home / "simulacra-server.pid").exists()
        if command == "status":
            assert json.loads(result.stdout)["server_pid"] is None
        else:
            assert one_line(result).endswith("nothing was running")


@pytest.mark.parametrize("unrelated", [True, False], ids=["group-leader", "in-another-group"], indirect=True)
def test_stop_leaves_alone_an_unrelated_process_that_has_the_pid_now(home, unrelated):
    """It printed "stopped: server" and killed the process's group (SIGINT, then SIGKILL); where the process led no
    group, os.killpg raised ProcessLookupError, exit 1."""
    (home / "simulacra-server.pid").write_text(str(unrelated.pid))
    (home / "simulacra-worker.pid").write_text(str(unrelated.pid))
    stopped = simulacra(home.parent, "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert one_line(stopped).endswith("nothing was running")
    assert "Traceback" not in stopped.stderr
    time.sleep(0.5)
    assert alive(unrelated)
    assert not list(home.glob("simulacra-*.pid"))


def test_stop_leaves_alone_a_process_with_the_recorded_pid_that_started_later(home, unrelated):
    """The pid file and its start time as `start` wrote them, for a process that has ended; its pid now another's
    (the start time recorded is one no process with that pid has)."""
    LocalServer(home).record("server", unrelated.pid)
    recorded = json.loads((home / "simulacra-server.started").read_text())
    (home / "simulacra-server.started").write_text(json.dumps(recorded | {"started": recorded["started"] + "0"}))
    stopped = simulacra(home.parent, "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"pid {unrelated.pid} is no longer the server this workspace started" in one_line(stopped)
    time.sleep(0.5)
    assert alive(unrelated)


def test_status_does_not_report_an_unrelated_process_as_the_server(home, unrelated):
    (home / "simulacra-server.pid").write_text(str(unrelated.pid))
    status = simulacra(home.parent, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["server_pid"] is None
    assert "the server is not running" in one_line(status)
    assert alive(unrelated)


def test_start_is_not_refused_because_of_an_unrelated_process(home, unrelated):
    """It refused: "already running (pid N)". Past that check `--port 0` is refused, before anything starts."""
    (home / "simulacra-server.pid").write_text(str(unrelated.pid))
    started = simulacra(home.parent, "start", "--port", "0")
    assert started.returncode == 2, started.stdout + started.stderr
    assert "already running" not in started.stderr
    assert "server: --port 0: the Prefect server needs a fixed port" in one_line(started)
    assert alive(unrelated)


def test_starting_a_second_time_is_refused_in_one_line_with_the_fix(home, unrelated):
    """The pid files as a first `start` leaves them (its server's pid and start time); the second `start` exited 1
    without naming what to do. Now one line and status 2, and the running server untouched."""
    LocalServer(home).record("server", unrelated.pid)
    started = simulacra(home.parent, "start")
    assert started.returncode == 2, started.stdout + started.stderr
    assert started.stderr.strip().count("\n") == 0, started.stderr
    assert one_line(started) == (
        f"server: this workspace's server is already running (server pid {unrelated.pid}): `simulacra server status` "
        "shows it, `simulacra server stop` with the same --config stops it"
    )
    assert alive(unrelated)
    status = simulacra(home.parent, "status")
    assert json.loads(status.stdout)["server_pid"] == unrelated.pid


def test_stop_stops_the_process_this_workspace_started_and_a_group_gone_meanwhile_is_no_error(home, unrelated):
    """The recorded process is still stopped (signalled as a group); a group that ended between the check and the
    signal is what the signal was for, where os.killpg raised ProcessLookupError."""
    LocalServer(home).record("server", unrelated.pid)
    stopped = simulacra(home.parent, "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert one_line(stopped) == "stopped: server"
    assert unrelated.wait(timeout=10) == -signal.SIGINT
    assert not list(home.glob("simulacra-server.*"))

    from pipeline.orchestration import prefect_server

    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    prefect_server._signal_group(gone.pid, signal.SIGINT)  # no ProcessLookupError


def test_a_server_started_before_start_times_were_recorded_is_still_stopped(home):
    """After an upgrade a running server has its pid file alone: it is `prefect server start` by its command line,
    so `stop` stops it, where the stale-file rule alone would forget it and leave it running with no way to stop it
    but by hand. (A process with any other command line is not trusted: the tests above.)"""
    legacy = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "prefect", "server", "start"], start_new_session=True
    )
    try:
        (home / "simulacra-server.pid").write_text(str(legacy.pid))
        status = simulacra(home.parent, "status")
        assert json.loads(status.stdout)["server_pid"] == legacy.pid, status.stderr
        stopped = simulacra(home.parent, "stop")
        assert stopped.returncode == 0 and one_line(stopped).endswith("stopped: server"), stopped.stderr
        legacy.wait(timeout=30)
    finally:
        legacy.kill()
        legacy.wait()
