"""`simulacra serve` of an exported folder, started in a subprocess on 127.0.0.1 for as long as a block needs it:
what measures a served world model from inside the pipeline (the fidelity stage's simulated episodes, issue 31)
and the tests of what is built on the server use.

    with served_folder(folder, log=run_dir / "serve.log") as server:
        env = WorldModelEnv(server.base_url, server.model, "terminal", episode)

The server listens on a free port of the loopback interface, which it picks itself (`--port 0`) and names in its
"serving ... at http://127.0.0.1:PORT/v1" line: a port chosen here and handed to it could be taken by another
process in between. It is ready when `/v1/models` answers. Its output goes to `log` (a pipe nobody reads would fill
and stall it), whose tail is in the error when it does not start.
On leaving the block it is terminated, and killed if it does not stop. On Linux it is also told to stop when
the process that started it dies (`PR_SET_PDEATHSIG`), so a stage killed with SIGKILL leaves no server behind
holding a port and a model's memory.
"""

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.child_processes import PROJECT_ROOT, die_with_parent, project_env
from pipeline.serving.export_folder import read_metadata

# Importing torch and transformers and loading a model: about 15 s on 2 idle cores, minutes on a loaded one.
STARTUP_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0


class ServerDidNotStart(RuntimeError):
    """`simulacra serve` exited, or did not answer within the timeout."""


@dataclass(frozen=True)
class ServedModel:
    base_url: str  # http://127.0.0.1:PORT/v1
    model: str  # the served name: the export's `model_name`


# The line `simulacra serve` prints once the model is loaded and the port bound (pipeline/serving/server.py).
_SERVING_AT = re.compile(rb"^serving .* at http://127\.0\.0\.1:(\d+)/v1$", re.MULTILINE)


def _announced_port(log: Path, offset: int) -> int | None:
    """The port this server's serving line names, read from `offset` on: the log is appended to, and an earlier
    server's line names an earlier port."""
    try:
        with open(log, "rb") as output:
            output.seek(offset)
            found = _SERVING_AT.search(output.read())
    except OSError:
        return None
    return int(found.group(1)) if found else None


def _ready(base_url: str) -> bool:
    import httpx

    try:
        httpx.get(f"{base_url}/models", timeout=2).raise_for_status()
        return True
    except httpx.HTTPError:
        return False


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextmanager
def served_folder(
    folder: Path,
    *,
    log: Path,
    max_tokens: int = 1024,
    max_batch: int | None = None,
    device: str | None = None,
    extra_options: tuple[str, ...] = (),
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
) -> Iterator[ServedModel]:
    """`simulacra serve folder` until the block ends. `max_tokens`, `max_batch` and `device` are the command's
    options (its defaults where None); `extra_options` go to it as they are."""
    model = read_metadata(Path(folder))["model_name"]
    command = [sys.executable, "-m", "pipeline.cli", "serve", str(folder), "--host", "127.0.0.1", "--port", "0"]
    command += ["--max-tokens", str(max_tokens), *extra_options]
    command += ["--max-batch", str(max_batch)] if max_batch is not None else []
    command += ["--device", device] if device is not None else []
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as output:
        offset = output.tell()  # this server's lines start here
        process = subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            env=project_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
    base_url = None
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if base_url is None and (port := _announced_port(log, offset)) is not None:
                base_url = f"http://127.0.0.1:{port}/v1"
            if base_url is not None and _ready(base_url):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                how = f"exited with status {process.returncode}" if process.poll() is not None else "did not answer"
                raise ServerDidNotStart(f"simulacra serve {folder} {how} (log {log}):\n{_tail(log)}")
            time.sleep(0.5)
        yield ServedModel(base_url, model)
    finally:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
