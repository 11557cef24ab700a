"""Attacks on the verifier sandbox (issue 20): each ended in a pass, a held resource or a reach into
the host before the fix. Limits are small so that each attack is cheap."""

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.config.sandbox import SandboxConfig
from pipeline.rewards.rule import rule_reward
from pipeline.rewards.sandbox import UID_RANGE

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacks are run as root (an unprivileged run is one case)"
)
REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
# 128 MiB a process, 2 processes: any route that holds 256 MiB got past the sandbox's bound.
SMALL = SandboxConfig(wall_timeout_s=60, cpu_time_s=5, memory_bytes=128 * MIB, max_processes=2)
HELD = 256 * MIB


def code(source: str) -> str:
    return textwrap.dedent(source).strip() + "\n"


def sandbox_uids() -> set[int]:
    uids = set()
    for entry in Path("/proc").iterdir():
        try:
            uid = int((entry / "status").read_text().split("\nUid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
        if UID_RANGE[0] <= uid < UID_RANGE[1]:
            uids.add(uid)
    return uids


# Item 1: the workspace (the store, Prefect's database with the Secret blocks' key) was there to read.
def test_the_workspace_is_not_in_the_sandbox():
    folder = Path(tempfile.mkdtemp(prefix=".sandbox-test-workspace-", dir=REPO))  # where ./simulacra-workspace is
    try:
        folder.chmod(0o755)
        store = folder / "simulacra.duckdb"
        store.write_text("trajectories")
        store.chmod(0o644)  # even open to every user
        read = code(f"""
            def verify(p):
                return open({str(store)!r}).read() == "trajectories"
        """)
        outcome = rule_reward(read, "x", SMALL)
        assert outcome.reward == 0.0 and "No such file or directory" in outcome.reason, outcome
    finally:
        store.unlink()
        folder.rmdir()


# Item 2: memory held where the address-space limit does not see it. Each verifier returns True
# only once it holds HELD bytes, so a pass is an escape.
MEMORY_ROUTES = {
    "SysV shared memory, detached": f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        def verify(p):
            for _ in range({HELD // (32 * MIB)}):
                segment = libc.shmget(0, {32 * MIB}, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
                if segment < 0:
                    raise OSError(ctypes.get_errno(), "shmget")
                address = libc.shmat(segment, None, 0)
                ctypes.memset(address, 1, {32 * MIB})
                libc.shmdt(ctypes.c_void_p(address))
            return True
    """,
    "memfd_create, unmapped": f"""
        import os
        def verify(p):
            kept = []
            for _ in range({HELD // (8 * MIB)}):
                fd = os.memfd_create("held")
                os.write(fd, b"x" * {8 * MIB})
                kept.append(fd)
            return True
    """,
    "a tmpfs of its own in a nested user namespace": f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        def verify(p):
            uid = os.getuid()
            if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
                raise OSError(ctypes.get_errno(), "unshare")
            with open("/proc/self/uid_map", "w") as handle:  # so that it may own files in there
                handle.write(f"0 {{uid}} 1")
            os.makedirs("held", exist_ok=True)
            if libc.mount(b"tmpfs", b"held", b"tmpfs", 0, b"size=1g") != 0:
                raise OSError(ctypes.get_errno(), "mount")
            with open("held/file", "wb") as handle:
                for _ in range({HELD // MIB}):
                    handle.write(b"x" * {MIB})
            return True
    """,
    "the scratch beyond its size": f"""
        def verify(p):
            with open("big", "wb") as handle:
                for _ in range({HELD // MIB}):
                    handle.write(b"x" * {MIB})
            return True
    """,
}


# Where each is stopped: the seccomp filter (EPERM), the namespace limit and the scratch's size (ENOSPC).
STOPPED = {
    "SysV shared memory, detached": "PermissionError: [Errno 1] shmget",
    "memfd_create, unmapped": "PermissionError: [Errno 1]",
    "a tmpfs of its own in a nested user namespace": "[Errno 28] unshare",
    "the scratch beyond its size": "[Errno 28] No space left on device",
}


@pytest.mark.parametrize("route", MEMORY_ROUTES)
def test_memory_beyond_the_bound_is_refused(route):
    outcome = rule_reward(code(MEMORY_ROUTES[route]), "x", SMALL)
    assert (outcome.reward, outcome.status) == (0.0, "error") and STOPPED[route] in outcome.reason, outcome


# Item 3: the prediction forges a pass through a process the verifier starts.
PTRACE_CHILD = code("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    harness = os.getppid()
    attached = libc.ptrace(16, harness, 0, 0)  # PTRACE_ATTACH
    if attached == 0:  # once the harness has stopped, PTRACE_DETACH, so that it goes on
        os.waitpid(harness, 0x40000000)  # __WALL
        libc.ptrace(17, harness, 0, 0)
    print(attached)
""")
FORGERS = {
    # A child writes an unterminated `pass ` on every descriptor it inherited: before the fix the
    # launcher's duplicate of the verdict pipe was one, and the harness's `fail` line completed it.
    "through an inherited descriptor": """
        import subprocess, sys
        CHILD = "import os\\nfor fd in range(3, 256):\\n    try:\\n        os.write(fd, b'pass ')\\n    except OSError:\\n        pass\\n"
        def verify(p):
            subprocess.run([sys.executable, "-c", CHILD], close_fds=False, check=True)
            return False
    """,
    # Whoever reaches the verdict channel: an unterminated `pass ` must not merge into the verdict.
    "by an unterminated pass before the verdict": """
        import os
        def verify(p):
            os.write(3, b"pass ")
            return False
    """,
    # A child attaches to the harness (same uid): it could then write any verdict through it.
    "by attaching to the harness": f"""
        import subprocess, sys
        CHILD = {PTRACE_CHILD!r}
        def verify(p):
            attached = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
            return attached.stdout.strip() == "0"  # PTRACE_ATTACH succeeded
    """,
}


# The status each ends in: the verifier ran to its own `False`, or the frame caught the stray bytes.
FORGED = {
    "through an inherited descriptor": "fail",
    "by an unterminated pass before the verdict": "error",
    "by attaching to the harness": "fail",
}


@pytest.mark.parametrize("route", FORGERS)
def test_a_forged_pass_is_never_a_pass(route):
    outcome = rule_reward(code(FORGERS[route]), "x", SMALL)
    assert (outcome.reward, outcome.status) == (0.0, FORGED[route]), outcome


# Item 4: two ranks seed `random` alike (transformers' set_seed), and their sandboxes ran under one uid.
RANK = """
import random, sys
from pipeline.config.sandbox import SandboxConfig
from pipeline.rewards.rule import rule_reward
random.seed(0)
outcome = rule_reward("import time\\ndef verify(p):\\n    time.sleep(4)\\n    return True\\n", "x", SandboxConfig(wall_timeout_s=60))
print(outcome.status)
"""


def test_identically_seeded_processes_get_distinct_uids():
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK], env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    seen: set[int] = set()
    most_at_once = 0
    while any(rank.poll() is None for rank in ranks):
        now = sandbox_uids()
        seen |= now
        most_at_once = max(most_at_once, len(now))
        time.sleep(0.05)
    assert [rank.stdout.read().strip() for rank in ranks] == ["pass", "pass"]
    # Each sandbox holds two uids (its set-up and its verifier); the two ran at the same time.
    assert most_at_once == 4, (most_at_once, seen)


def test_a_key_one_sandbox_writes_is_not_there_for_the_next():
    keys = """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        ADD_KEY, REQUEST_KEY = 248, 249  # x86_64
        SESSION, USER = -3, -4  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING
        def verify(p):
            if p == "write":
                for ring in (SESSION, USER):
                    libc.syscall(ADD_KEY, b"user", b"simulacra-sandbox-test", b"left behind", 11, ring)
                return True
            return libc.syscall(REQUEST_KEY, b"user", b"simulacra-sandbox-test", None, 0) > 0
    """
    if os.uname().machine != "x86_64":
        pytest.skip("the key syscalls' numbers here are x86_64's")
    random.seed(0)  # as a rank seeded alike would: before the fix, the same uid and its keyring
    rule_reward(code(keys), "write", SMALL)
    random.seed(0)
    assert rule_reward(code(keys), "read", SMALL).status == "fail"


# Item 5: a unix socket and a FIFO in a host folder outside the covered ones (here the project's).
def test_no_host_socket_or_fifo_is_reachable():
    folder = Path(tempfile.mkdtemp(prefix=".sandbox-test-", dir=REPO))
    folder.chmod(0o755)  # as a daemon's folder is: anyone may reach its socket
    socket_path, fifo_path = folder / "s", folder / "f"
    os.mkfifo(fifo_path)
    fifo_path.chmod(0o666)
    fifo = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(socket_path))
            socket_path.chmod(0o777)
            server.listen()
            server.setblocking(False)
            reach = code(f"""
                import os, socket
                def verify(p):
                    with socket.socket(socket.AF_UNIX) as client:
                        client.connect({str(socket_path)!r})
                        client.sendall(p.encode())
                    fifo = os.open({str(fifo_path)!r}, os.O_WRONLY | os.O_NONBLOCK)
                    os.write(fifo, p.encode())
                    return True
            """)
            outcome = rule_reward(reach, "reached", SMALL)
            assert outcome.reward == 0.0 and "No such file or directory" in outcome.reason, outcome
            with pytest.raises(BlockingIOError):
                server.accept()
        assert os.read(fifo, 100) == b""  # no writer ever opened it
    finally:
        os.close(fifo)
        for path in (socket_path, fifo_path):
            path.unlink(missing_ok=True)
        folder.rmdir()


# Item 6: a flood of output costs the host what it reads; the host stops reading at its cap.
def test_the_host_stops_reading_a_flood_at_its_cap():
    flood = code("""
        import sys
        def verify(p):
            written = 0
            try:
                while written < 512 * 1024 * 1024:
                    written += sys.stdout.write("x" * 65536)
                    sys.stdout.flush()
            except BrokenPipeError:
                return written < 1024 * 1024  # the host's cap and a pipe's buffer, nothing more
            return False
    """)
    outcome = rule_reward(flood, "x", SMALL)
    assert outcome.status == "pass", outcome


# Item 7: an unprivileged user (nobody here) gets rule rewards too. The system interpreter, which
# nobody can run, with the project's packages (its venv is of the same Python version).
UNPRIVILEGED = """
import json
from pipeline.config.sandbox import SandboxConfig
from pipeline.rewards.rule import rule_reward
config = SandboxConfig(wall_timeout_s=60)
outcomes = [rule_reward("def verify(p):\\n    return p == '3'\\n", p, config) for p in ("3", "4")]
print(json.dumps([[o.status, o.reason] for o in outcomes]))
"""


def test_an_unprivileged_user_gets_rule_rewards():
    system = Path("/usr/bin/python3.11")
    packages = Path(sys.prefix) / "lib" / "python3.11" / "site-packages"
    if sys.version_info[:2] != (3, 11) or not system.is_file():
        pytest.skip("needs the system's python3.11 beside the project's Python 3.11")
    completed = subprocess.run(
        [str(system), "-c", UNPRIVILEGED],
        env={"PYTHONPATH": f"{REPO}:{packages}", "PATH": "/usr/bin:/bin"},
        user=65534,
        group=65534,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    (passed, passed_reason), (failed, failed_reason) = json.loads(completed.stdout)
    assert (passed, failed) == ("pass", "fail"), (passed_reason, failed_reason)
