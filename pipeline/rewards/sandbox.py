"""Run untrusted Python in a sandbox: separate process, namespaces, resource limits (issues 11, 20).

Verifier code comes with the data. `run_sandboxed` runs a Python program (trusted or not) with
text inputs and returns how it ended, never raising for anything the program does:

- isolation (built by `sandbox_child.py`, see its docstring for the steps), as root or as any
  user: a user namespace holding new mount, network, PID, IPC and UTS namespaces; no network at
  all (a fresh network namespace has only a loopback, down); a root of its own that holds only the
  interpreter and its libraries, read-only, and the scratch (a fresh tmpfs on /tmp; `/tmp/work`:
  cwd and HOME): nothing of the workspace, the project, /proc or the host's sockets; a uid of its
  own (as root: two per run, allocated from the launcher's pid, never shared by two live runs),
  no capabilities and no new privileges; a seccomp filter that refuses the memory no resource
  limit counts (memfd, SysV IPC), the calls that reach into another process, and the kernel
  keyrings; an environment of HOME and TMPDIR only; `python -I -S` (no site, no user paths, no
  PYTHON* variables);
- limits: wall time (here: the whole sandbox is killed), CPU seconds, address space, processes,
  scratch size (`SandboxConfig`);
- where the kernel refuses a namespace (user namespaces disabled, a container's seccomp policy, a
  namespace limit) nothing runs and the result says `refused` with the kernel's error.

Inputs travel through stdin to the sandbox's own side and become files under /tmp/input: never
argv or the environment; the job's `stdin` bytes reach the program on its stdin (the rule reward's
per-run nonce travels so). The program reports on fd 3 (`report`), a pipe apart from its stdout and
stderr (`output`, kept only for diagnosis): nothing it prints can pass for a report. The host reads
each pipe up to its cap and then closes it, so a flood costs the host nothing past the cap (the
program's next write fails with EPIPE).
"""

import marshal
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.config.sandbox import SandboxConfig

CHILD = Path(__file__).with_name("sandbox_child.py")
# Where the host's root allocates each run's two uids (and gids): base + 2 x the launcher's pid and
# the next (pids stay below 2^22), so two live runs never share one. Above systemd's container
# range (524288-1879048191) and below 2^31, where no account or file belongs.
UID_RANGE = (2_000_000_000, 2_000_000_000 + 2**24)
STDIN_BYTES = 4096  # a job's stdin is written whole into a pipe before the program starts
REPORT_BYTES = 64 * 1024  # a program's report beyond this is cut (a verdict is a short JSON line)
OUTPUT_BYTES = 4 * 1024  # stdout + stderr kept for diagnosis; the rest is read and dropped
NAMESPACE_END_S = 10.0  # how long the host waits for a killed sandbox's namespace to be gone
KILL_GRACE_S = 2.0  # after the timeout's SIGTERM, how long to wait for the launcher before SIGKILL

Status = Literal["exited", "signalled", "timeout", "refused", "setup_failed"]


@dataclass(frozen=True)
class SandboxResult:
    """How one sandboxed run ended.

    `exited`: the program ran and exited with `exit_code`; `signalled`: it was killed by `signal`
    (SIGXCPU at the CPU limit, SIGKILL one second later, SIGSEGV...); `timeout`: the wall timeout
    killed the sandbox; `refused`: the kernel refused a namespace and nothing ran; `setup_failed`:
    the sandbox could not be built (the reason says why) and nothing ran.
    """

    status: Status
    reason: str
    report: bytes
    output: str
    exit_code: int | None = None
    signal: int | None = None
    wall_s: float = 0.0


@dataclass(frozen=True)
class SandboxJob:
    program: str  # Python source, run as `python -I -S -B /tmp/program.py /tmp/input` in /tmp/work
    inputs: dict[str, str]  # file name -> text, readable (not writable) under /tmp/input, UTF-8
    # with `surrogatepass`
    stdin: bytes = b""  # the program's stdin, then EOF (at most STDIN_BYTES)


def _interpreter() -> tuple[str, str]:
    """The base interpreter (not a venv's symlink: under -I -S a venv adds nothing) and its prefix."""
    prefix = os.path.realpath(sys.base_prefix)
    executable = os.path.realpath(sys.executable)
    if not executable.startswith(prefix + os.sep):
        raise RuntimeError(f"interpreter {executable} is not under its prefix {prefix}")
    return executable, prefix


def run_sandboxed(job: SandboxJob, config: SandboxConfig) -> SandboxResult:
    """Run one program in a fresh sandbox and wait for it (at most the wall timeout)."""
    for name in job.inputs:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"sandbox input name {name!r}: expected a plain file name")
    if len(job.stdin) > STDIN_BYTES:
        raise ValueError(f"sandbox stdin of {len(job.stdin)} bytes: at most {STDIN_BYTES}")
    executable, prefix = _interpreter()
    started = time.monotonic()
    request = {
        "uid_base": UID_RANGE[0],
        "stdin": job.stdin,
        "prefix": prefix,
        "executable": executable,
        "program": job.program,
        # Bytes, through `surrogatepass`: any Python string (a model's output may hold a lone
        # surrogate) reaches the program unchanged when it reads the file back the same way.
        "inputs": {name: text.encode("utf-8", "surrogatepass") for name, text in job.inputs.items()},
        "memory_bytes": config.memory_bytes,
        "cpu_time_s": config.cpu_time_s,
        "max_processes": config.max_processes,
        "scratch_bytes": config.scratch_bytes,
    }
    result = _launch(marshal.dumps(request), config.wall_timeout_s)
    return _interpret(result, config, time.monotonic() - started)


@dataclass
class _Streams:
    """What came back from one run: the three pipes (each cut at its limit) and whether the wall
    timeout killed it."""

    report: bytes = b""
    output: bytes = b""
    status: bytes = b""
    timed_out: bool = False


def _launch(request: bytes, wall_timeout_s: float) -> _Streams:
    report_r, report_w = os.pipe()
    status_r, status_w = os.pipe()
    output_r, output_w = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", str(CHILD), str(report_w), str(status_w)],
            stdin=subprocess.PIPE,
            stdout=output_w,
            stderr=output_w,
            pass_fds=(report_w, status_w),
            env={},
            start_new_session=True,  # one process group to kill on timeout
        )
    finally:
        for fd in (report_w, status_w, output_w):
            os.close(fd)
    closed: set[int] = set()
    try:
        try:
            assert process.stdin is not None  # stdin=subprocess.PIPE
            process.stdin.write(request)
            process.stdin.close()
        except BrokenPipeError:  # the launcher died before reading: its status says why
            pass
        limits = {report_r: REPORT_BYTES, status_r: REPORT_BYTES, output_r: OUTPUT_BYTES}
        kept, timed_out = _collect(process, limits, wall_timeout_s, closed)
        return _Streams(kept[report_r], kept[output_r], kept[status_r], timed_out)
    finally:
        for fd in {report_r, status_r, output_r} - closed:
            os.close(fd)
        if process.poll() is None:
            _kill(process)
        process.wait()
        _await_namespace_end(process.pid)


def _stop(process: subprocess.Popen) -> None:
    """Ask the launcher to kill the namespace and reap its PID 1 (then it exits)."""
    try:
        process.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the launcher and PID 1; the namespace dies with PID 1
    except ProcessLookupError:
        pass


def _await_namespace_end(group: int) -> None:
    """Return only once nothing of the sandbox's process group is left. Reaping the launcher is not
    enough after a kill: the namespace's PID 1 (the launcher's child, in its group) is reparented to
    the host's init and ends only when the kernel has killed and reaped every process of the
    namespace, which under load took seconds after the launcher was gone. Bounded: a process stuck
    in the kernel must not hold training."""
    deadline = time.monotonic() + NAMESPACE_END_S
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        except PermissionError:  # the group's processes are another uid's now: still there
            pass
        time.sleep(0.01)


def _collect(
    process: subprocess.Popen, limits: dict[int, int], wall_timeout_s: float, closed: set[int]
) -> tuple[dict[int, bytes], bool]:
    """Read every pipe to its end or to its limit, where it is closed (issue 20: reading and
    dropping a flood cost the host 4-5 CPU-seconds a sample; closed, the writer gets EPIPE), or
    until the wall timeout kills the sandbox. Returns what was kept per pipe and whether the
    timeout struck. The caller closes the pipes this did not."""
    kept = {fd: bytearray() for fd in limits}
    deadline = time.monotonic() + wall_timeout_s
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in limits:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if timed_out:  # the pipes outlived the kill's grace: stop reading
                    break
                timed_out = True
                _stop(process)
                deadline = time.monotonic() + KILL_GRACE_S
                continue
            for key, _ in selector.select(remaining):
                room = limits[key.fd] - len(kept[key.fd])
                chunk = os.read(key.fd, min(room, 65536))
                kept[key.fd] += chunk
                if not chunk or len(kept[key.fd]) >= limits[key.fd]:
                    selector.unregister(key.fd)
                    os.close(key.fd)
                    closed.add(key.fd)
    return {fd: bytes(data) for fd, data in kept.items()}, timed_out


def _interpret(streams: _Streams, config: SandboxConfig, wall_s: float) -> SandboxResult:
    output = streams.output.decode("utf-8", "replace")
    status_lines = streams.status.decode("utf-8", "replace").strip().splitlines()
    kind, _, detail = (status_lines[0] if status_lines else "").partition(" ")
    common: dict[str, Any] = {"report": streams.report, "output": output, "wall_s": wall_s}
    if streams.timed_out:
        reason = f"wall timeout: still running after {config.wall_timeout_s:g} s, killed"
        return SandboxResult("timeout", reason, **common)
    if kind == "refused":
        return SandboxResult("refused", f"sandbox refused by the kernel, verifier not run: {detail}", **common)
    if kind == "setup":
        return SandboxResult("setup_failed", f"sandbox setup failed, verifier not run: {detail}", **common)
    if kind == "exit":
        code = int(detail)
        return SandboxResult("exited", f"exited with code {code}", exit_code=code, **common)
    if kind == "signal":
        number = int(detail)
        return SandboxResult("signalled", _signal_reason(number, config), signal=number, **common)
    reason = f"sandbox ended without a status (launcher output: {output[:200]!r})"
    return SandboxResult("setup_failed", reason, **common)


def _signal_reason(number: int, config: SandboxConfig) -> str:
    if number == signal.SIGXCPU:
        return f"CPU time limit ({config.cpu_time_s} s) exceeded: killed by SIGXCPU"
    if number == signal.SIGKILL:
        return f"killed by SIGKILL (the hard CPU limit, {config.cpu_time_s + 1} s, or the kernel)"
    try:
        return f"killed by {signal.Signals(number).name}"
    except ValueError:
        return f"killed by signal {number}"


def run_many(jobs: Sequence[SandboxJob], config: SandboxConfig) -> list[SandboxResult]:
    """Run many programs, `config.concurrency` at a time (default: one per CPU), results in order.
    Each run waits on its child in a thread: the work itself happens in the sandboxes."""
    workers = config.concurrency or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: run_sandboxed(job, config), jobs))
