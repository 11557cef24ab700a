"""A local Prefect server and process worker for one machine: `simulacra server start|stop|status`.

`start` runs the commands deploy/README.md documents, in order: `prefect server start` on 127.0.0.1
in the background, the work pools (those missing), the `gpu` global concurrency limit, `prefect
deploy --all` of deploy/prefect.yaml bound to the project folder and the workspace
(pipeline/orchestration/deployments.py), and a worker of the process pool (the GPU pools get their
workers on GPU hosts, deploy/README.md). Every `prefect` process runs in the project folder. The
server and the worker log to, and keep their pid files in, the workspace's Prefect home. `stop`
interrupts them: a worker needs two SIGINTs (STACK.md), the first only asks it to finish.

A pid file is trusted only while it names the process this workspace started: beside it, `start` records when
that process started (`simulacra-ROLE.started`), and a pid whose process started at another time is a later,
unrelated process the system gave the same pid. `status`, `start` and `stop` treat an unreadable, garbage or
stale pid file as "not running": they remove it, with a one-line note (`notes`), and signal nothing.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config.workspace import make_private
from pipeline.errors import UserFixableError
from pipeline.orchestration.deployments import write_bound
from pipeline.orchestration.prefect_env import check_prefect_database, prefect_environment
from pipeline.store.atomic_files import write_text_atomic

PROCESS_POOL = "simulacra-process"
# (pool, worker type, base job template relative to the project folder; None: the type's default).
# simulacra-process-gpu: process workers on GPU hosts, for GPU stages the pipeline dispatches
# (`orchestration.gpu_deployment`, flows/gpu_stage.py).
WORK_POOLS = (
    (PROCESS_POOL, "process", None),
    ("simulacra-process-gpu", "process", None),
    ("simulacra-docker-gpu", "docker", Path("deploy") / "docker" / "job-template.json"),
    ("simulacra-kubernetes-gpu", "kubernetes", Path("deploy") / "k8s" / "job-template.json"),
)
GPU_LIMIT = "gpu"
# `prefect server start` is ready in 11-17 s on an idle 2-core machine (STACK.md).
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


class ServerError(RuntimeError):
    """The local server could not be started, with the log to read."""


def prefect_executable() -> str:
    """The `prefect` script of this interpreter's environment (a venv's bin is not always on PATH)."""
    beside = Path(sys.executable).with_name("prefect")
    return str(beside) if beside.is_file() else "prefect"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """When process `pid` started, in a form that tells it from a later process given the same pid; None where
    there is no such process, it has exited (a zombie its parent has yet to collect), or its start cannot be read.

    Linux: /proc/PID/stat's field 22 (clock ticks after boot), with the boot's id. Without /proc (macOS, the
    BSDs): `ps -o lstart=`, to the second. Where neither can be read, None: the pid file is then never trusted,
    the safe side: a server left running is found by `start` on its port (refused in one line) and stopped by
    hand, where trusting a bare pid signalled whatever process had it."""
    if pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None  # /proc is there: no such process
    except OSError:
        return None
    else:
        # Field 2, the command's name in parentheses, may hold spaces and parentheses: count after the last ")".
        # Field 3 is the first after it, so field 22 is the 20th.
        fields = stat[stat.rindex(")") + 2 :].split()
        if len(fields) < 20 or fields[0] in ("Z", "X"):
            return None
        return f"{_boot_id()}:{fields[19]}"
    try:
        listed = subprocess.run(
            ["ps", "-o", "stat=", "-o", "lstart=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    state, _, started = listed.stdout.strip().partition(" ")
    if listed.returncode != 0 or not started.strip() or state.startswith("Z"):
        return None
    return f"ps:{started.strip()}"


def _prefect_started_before_records(pid: int, role: str) -> str | None:
    """A server or worker started before `start` recorded start times has a pid file alone: it is trusted where the
    process with that pid is `prefect server start` / `prefect worker start` (its command line, Linux), so `stop`
    after an upgrade still stops it rather than forgetting it; anything else with that pid is not."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    names = [Path(word.decode(errors="replace")).name for word in words]
    if "prefect" in names and role in names[names.index("prefect") :] and "start" in names:
        return _start_time(pid)
    return None


def _running(pid: int, started: str | None) -> bool:
    """Whether the process `start` recorded (pid, start time) still runs: a live process with that pid that
    started at another time is another process, and is not."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our own child, exited: reaped now
    except ChildProcessError:
        pass  # not our child (`simulacra server stop` runs in a later process)
    return started is not None and _start_time(pid) == started


def _signal_group(pid: int, sent: signal.Signals) -> None:
    try:
        os.killpg(pid, sent)
    except ProcessLookupError:
        pass  # the group ended meanwhile: what the signal was for


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class LocalServer:
    home: Path  # the workspace's Prefect home
    port: int = 4200
    # The project folder every `prefect` process runs in (deployments.project_folder); `stop` and
    # `status` need none.
    project: Path | None = None
    # One line each, for the command to print: pid files found stale and removed, a url file without a port.
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of_workspace(cls, home: Path) -> "LocalServer":
        """The server `start` recorded in this Prefect home (its port), or the default one."""
        url_file = home / "simulacra-server.url"
        if url_file.is_file():
            try:
                return cls(home, int(url_file.read_text().rsplit(":", 1)[1].split("/")[0]))
            except (OSError, ValueError, IndexError):
                server = cls(home)
                server.notes.append(f"{url_file} holds no port: taking the default, {server.port}")
                return server
        return cls(home)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def pid_file(self, role: str) -> Path:
        return self.home / f"simulacra-{role}.pid"

    def started_file(self, role: str) -> Path:
        """Beside the pid file: the pid and when its process started, to tell it from a later one with that pid."""
        return self.home / f"simulacra-{role}.started"

    def log_file(self, role: str) -> Path:
        return self.home / f"simulacra-{role}.log"

    def record(self, role: str, pid: int) -> None:
        """Write the pid file of the process `start` started, and when it started: the start time first, so a
        reader that finds the pid file finds it too; each replaced whole, so none reads half of one."""
        write_text_atomic(self.started_file(role), json.dumps({"pid": pid, "started": _start_time(pid)}))
        write_text_atomic(self.pid_file(role), str(pid))

    def _forget(self, role: str) -> None:
        for file in (self.pid_file(role), self.started_file(role)):
            try:
                file.unlink(missing_ok=True)
            except OSError:
                pass  # a folder that is not writable: the files stay, and are found stale again

    def _recorded(self, role: str, note: bool = True) -> tuple[int, str] | None:
        """The pid and start time of the server or worker this workspace started, where it still runs. A pid file
        that names no such process (unreadable, no pid in it, no start time recorded beside it, or a pid now
        another process's or no one's) is removed, with a note where `note`."""
        file = self.pid_file(role)
        try:
            text = file.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._stale(role, f"unreadable: {exc.strerror}", note)
            return None
        try:
            pid = int(text)
        except ValueError:
            pid = 0
        if pid <= 0:  # 0 and -1 would have signalled this command's own process group, or every process
            self._stale(role, f"no pid in it: {text.strip()[:40]!r}", note)
            return None
        try:
            recorded = json.loads(self.started_file(role).read_text())
            started = recorded["started"] if recorded["pid"] == pid else None
        except (OSError, ValueError, TypeError, KeyError):
            started = None
        if not isinstance(started, str):
            started = _prefect_started_before_records(pid, role)
        if not isinstance(started, str):
            self._stale(role, f"no start time recorded to tell pid {pid} from another process", note)
            return None
        if not _running(pid, started):
            self._stale(role, f"pid {pid} is no longer the {role} this workspace started", note)
            return None
        return pid, started

    def _stale(self, role: str, why: str, note: bool) -> None:
        self._forget(role)
        if note:
            self.notes.append(f"removed {self.pid_file(role)} ({why}): the {role} is not running")

    def pid(self, role: str) -> int | None:
        """The pid of a running server or worker this workspace started, if any."""
        recorded = self._recorded(role)
        return None if recorded is None else recorded[0]

    def environment(self) -> dict[str, str]:
        # The project's own loggers reach the runs' logs in the UI (a stage waiting for the store said so in the
        # worker's log alone, found by probing); a user's own choice of extra loggers stands.
        return {
            "PREFECT_LOGGING_EXTRA_LOGGERS": "pipeline",
            **os.environ,
            **prefect_environment(self.home),
            "PREFECT_API_URL": self.api_url,
        }

    def _spawn(self, role: str, arguments: list[str]) -> subprocess.Popen:
        with self.log_file(role).open("ab") as log:
            process = subprocess.Popen(
                [prefect_executable(), *arguments],
                cwd=self.project,
                env=self.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: `stop` signals it and its children
            )
        self.record(role, process.pid)
        return process

    def _prefect(self, *commands: list[str]) -> None:
        """Run `prefect` commands side by side (each spends seconds importing Prefect); all must succeed."""
        running = [
            (
                command,
                subprocess.Popen(
                    [prefect_executable(), *command],
                    cwd=self.project,
                    env=self.environment(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
            )
            for command in commands
        ]
        finished = [(command, process.communicate()[0], process.returncode) for command, process in running]
        failures = [f"`prefect {' '.join(command)}`:\n{output}" for command, output, code in finished if code != 0]
        if failures:
            raise ServerError("\n".join(failures))

    def _missing_pools(self) -> list[list[str]]:
        """`prefect work-pool create` commands for the pools the server does not have yet (an existing
        pool keeps whatever its users changed)."""
        commands = []
        for name, kind, template in WORK_POOLS:
            try:
                urllib.request.urlopen(f"{self.api_url}/work_pools/{name}", timeout=10).close()
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
                extra = ["--base-job-template", str(template)] if template else []  # relative to cwd
                commands.append(["work-pool", "create", "--type", kind, *extra, name])
        return commands

    def _ensure_gpu_limit(self, slots: int) -> None:
        """The global concurrency limit GPU stages take slots of; an existing one is left as it is."""
        request = urllib.request.Request(
            f"{self.api_url}/v2/concurrency_limits/",
            data=json.dumps({"name": GPU_LIMIT, "limit": slots}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # 409: it exists already
                raise ServerError(f"creating the `{GPU_LIMIT}` concurrency limit failed: HTTP {exc.code}") from exc

    def _require_free_port(self) -> None:
        """Refuse a port another process holds, before anything starts (a UserFixableError naming the fix): there
        `prefect server start` exits at once, and the health check found whatever answered on the port, another
        workspace's Prefect server among them, and deployed this workspace's flows to it."""
        from pipeline.serving.listening import listening_socket

        if self.port == 0:  # a port the system picks would be known to Prefect's server alone
            raise UserFixableError(
                "--port 0: the Prefect server needs a fixed port (the UI's address and PREFECT_API_URL name it): "
                "pass one, such as the default 4200"
            )
        listening_socket("127.0.0.1", self.port).close()

    def _wait_ready(self, server: subprocess.Popen) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _healthy(self.api_url):
            if server.poll() is not None or time.monotonic() > deadline:
                self._stop(note=False)
                raise ServerError(
                    f"the Prefect server did not come up on port {self.port}; see {self.log_file('server')}"
                )
            time.sleep(0.5)

    def start(self, workspace: Path, config_path: Path | None, gpu_slots: int = 1) -> None:
        """Start the server, create pools and the `gpu` limit, deploy, start the process worker.
        `workspace` and `config_path` (absolute) are what the deployments hand their flow runs."""
        if self.project is None:
            raise ServerError("no project folder to deploy from")
        running = [f"{role} pid {pid}" for role in ("server", "worker") if (pid := self.pid(role)) is not None]
        if running:  # a worker alone too: a second one would leave it running with no pid file to stop it by
            raise UserFixableError(
                f"this workspace's server is already running ({', '.join(running)}): `simulacra server status` "
                "shows it, `simulacra server stop` with the same --config stops it"
            )
        self._require_free_port()
        check_prefect_database(self.home)
        make_private(self.home.parent)
        make_private(self.home)
        server = self._spawn("server", ["server", "start", "--host", "127.0.0.1", "--port", str(self.port)])
        (self.home / "simulacra-server.url").write_text(self.api_url)
        self._wait_ready(server)
        try:
            self._prefect(*self._missing_pools())
            self._ensure_gpu_limit(gpu_slots)
            deployments = write_bound(self.project, workspace, config_path, self.home)
            self._prefect(["--no-prompt", "deploy", "--all", "--prefect-file", str(deployments)])
            self._spawn("worker", ["worker", "start", "--pool", PROCESS_POOL])
        except BaseException:
            self._stop(note=False)
            raise

    def deploy(self, workspace: Path, config_path: Path | None) -> Path:
        """Deploy deploy/prefect.yaml again to this workspace's running server, bound as `start` binds it: a cron or
        a deployment edited since. `prefect deploy` by hand deploys the file as it is, which points the nightly
        refresh at data/configs/demo.yaml and the project's default workspace (found by probing). Returns the bound
        file."""
        if self.project is None:
            raise ServerError("no project folder to deploy from")
        if self.pid("server") is None or not _healthy(self.api_url):
            raise UserFixableError(
                f"this workspace's server is not running (port {self.port}): `simulacra server start` with the same "
                "--config starts it, and deploys"
            )
        deployments = write_bound(self.project, workspace, config_path, self.home)
        self._prefect(["--no-prompt", "deploy", "--all", "--prefect-file", str(deployments)])
        return deployments

    def _interrupt(self, role: str, signals: tuple[signal.Signals, ...], note: bool) -> bool:
        """Send the signals to the process group, a second apart; SIGKILL if it outlives the timeout.
        True when something was running: the process this workspace started, never one that has its pid now."""
        recorded = self._recorded(role, note)
        self._forget(role)
        if recorded is None:
            return False
        pid, started = recorded
        for number, sent in enumerate(signals):
            if number:
                time.sleep(1.0)
            if not _running(pid, started):
                break
            _signal_group(pid, sent)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _running(pid, started) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _running(pid, started):
            _signal_group(pid, signal.SIGKILL)
        return True

    def stop(self) -> list[str]:
        """Stop the worker, then the server; returns which were running."""
        return self._stop(note=True)

    def _stop(self, note: bool) -> list[str]:
        # `start` cleaning up after itself passes note=False: its own server that exited is no news.
        stopped = []
        if self._interrupt("worker", (signal.SIGINT, signal.SIGINT), note):
            stopped.append("worker")
        if self._interrupt("server", (signal.SIGINT,), note):
            stopped.append("server")
        return stopped

    def status(self) -> dict[str, object]:
        """`healthy` only where this workspace's server runs and answers: another server on its port (another
        workspace's) answered /health too, and read as this one's."""
        server_pid = self.pid("server")
        return {
            "api_url": self.api_url,
            "healthy": server_pid is not None and _healthy(self.api_url),
            "server_pid": server_pid,
            "worker_pid": self.pid("worker"),
        }
