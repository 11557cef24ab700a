"""A local Prefect server and process worker for one machine: `simulacra server start|stop|status`.

`start` runs the commands deploy/README.md documents, in order: `prefect server start` on 127.0.0.1
in the background, the work pools (those missing), the `gpu` global concurrency limit, `prefect
deploy --all` of deploy/prefect.yaml bound to the project folder and the workspace
(pipeline/orchestration/deployments.py), and a worker of the process pool (the GPU pools get their
workers on GPU hosts, deploy/README.md). Every `prefect` process runs in the project folder. The
server and the worker log to, and keep their pid files in, the workspace's Prefect home. `stop`
interrupts them: a worker needs two SIGINTs (STACK.md), the first only asks it to finish.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.workspace import make_private
from pipeline.errors import UserFixableError
from pipeline.orchestration.deployments import write_bound
from pipeline.orchestration.prefect_env import check_prefect_database, prefect_environment

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


def _alive(pid: int) -> bool:
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our own child, exited: reaped now
    except ChildProcessError:
        pass  # not our child (`simulacra server stop` runs in a later process)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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

    @classmethod
    def of_workspace(cls, home: Path) -> "LocalServer":
        """The server `start` recorded in this Prefect home (its port), or the default one."""
        url_file = home / "simulacra-server.url"
        if url_file.is_file():
            return cls(home, int(url_file.read_text().rsplit(":", 1)[1].split("/")[0]))
        return cls(home)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def pid_file(self, role: str) -> Path:
        return self.home / f"simulacra-{role}.pid"

    def log_file(self, role: str) -> Path:
        return self.home / f"simulacra-{role}.log"

    def pid(self, role: str) -> int | None:
        """The pid of a running server or worker this workspace started, if any."""
        file = self.pid_file(role)
        if not file.is_file():
            return None
        pid = int(file.read_text())
        return pid if _alive(pid) else None

    def environment(self) -> dict[str, str]:
        return {**os.environ, **prefect_environment(self.home), "PREFECT_API_URL": self.api_url}

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
        self.pid_file(role).write_text(str(process.pid))
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
                self.stop()
                raise ServerError(
                    f"the Prefect server did not come up on port {self.port}; see {self.log_file('server')}"
                )
            time.sleep(0.5)

    def start(self, workspace: Path, config_path: Path | None, gpu_slots: int = 1) -> None:
        """Start the server, create pools and the `gpu` limit, deploy, start the process worker.
        `workspace` and `config_path` (absolute) are what the deployments hand their flow runs."""
        if self.project is None:
            raise ServerError("no project folder to deploy from")
        if self.pid("server") is not None:
            raise ServerError(f"a server from this workspace is already running (pid {self.pid('server')})")
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
            self.stop()
            raise

    def _interrupt(self, role: str, signals: tuple[signal.Signals, ...]) -> bool:
        """Send the signals to the process group, a second apart; SIGKILL if it outlives the timeout.
        True when something was running."""
        pid = self.pid(role)
        self.pid_file(role).unlink(missing_ok=True)
        if pid is None:
            return False
        for number, sent in enumerate(signals):
            if number:
                time.sleep(1.0)
            if not _alive(pid):
                break
            os.killpg(pid, sent)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
        return True

    def stop(self) -> list[str]:
        """Stop the worker, then the server; returns which were running."""
        stopped = []
        if self._interrupt("worker", (signal.SIGINT, signal.SIGINT)):
            stopped.append("worker")
        if self._interrupt("server", (signal.SIGINT,)):
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
