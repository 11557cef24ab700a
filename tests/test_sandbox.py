"""The sandbox and the rule reward (issue 11): hostile verifier code ends in reward 0 with its
reason, in one batch beside verifiers that pass, and leaves nothing behind on the host. The attacks
of issue 20 are in test_sandbox_attacks.py."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from pipeline.config.sandbox import SandboxConfig
from pipeline.rewards.rule import NO_VERIFIER, PASS_REWARD, rule_reward, rule_rewards, verifier_of
from pipeline.rewards.sandbox import UID_RANGE, SandboxJob, run_sandboxed

# Run as root, as CI does: the verifier is inner uid 1000, apart from the set-up's inner 0. An
# unprivileged user's run (one uid, mapped as inner 0) is tested in test_sandbox_attacks.py; the
# refusal is tested below, inside a user namespace.
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="written for root's two-uid sandbox, as CI runs")
REPO = Path(__file__).resolve().parents[1]
SECRET_NAME = "SIMULACRA_SANDBOX_TEST_SECRET"
SECRET = "s3cret-7f1e9a"
# One CPU second, and a wall timeout long enough for it on a loaded 2-core machine (a busy loop
# may get a tenth of a core): the endless loop ends on the CPU limit, not the clock. Cases that
# burn no CPU, or burn it in many processes at once, meet the short wall timeout instead.
LIMITS = SandboxConfig(wall_timeout_s=60, cpu_time_s=1)
SHORT_WALL = LIMITS.model_copy(update={"wall_timeout_s": 3})


def code(source: str) -> str:
    return textwrap.dedent(source).strip() + "\n"


def sandbox_processes() -> list[int]:
    """Host processes running under a sandbox uid."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            uid = int((entry / "status").read_text().split("\nUid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
        if UID_RANGE[0] <= uid < UID_RANGE[1]:
            pids.append(int(entry.name))
    return pids


# (case, verifier code, prediction, expected status, words of the expected reason); the cases in
# WALL_BOUND run under SHORT_WALL.
WALL_BOUND = {"endless sleep", "fork bomb that ignores failures"}
HOSTILE = [
    ("endless loop", "def verify(p):\n    while True:\n        pass\n", "x", "signalled", "CPU time limit"),
    ("endless sleep", "import time\ndef verify(p):\n    time.sleep(60)\n", "x", "timeout", "wall timeout"),
    # The host keeps 4 KiB of output and closes the pipe: the next write fails.
    (
        "prints without end",
        "def verify(p):\n    while True:\n        print(p * 1000)\n",
        "x",
        "error",
        "BrokenPipeError",
    ),
    ("10 GB allocation", "def verify(p):\n    return len(bytearray(10 * 1024**3)) > 0\n", "x", "error", "MemoryError"),
    ("fork bomb", "import os\ndef verify(p):\n    while True:\n        os.fork()\n", "x", "error", "BlockingIOError"),
    (
        "fork bomb that ignores failures",
        "import os\ndef verify(p):\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n",
        "x",
        "timeout",
        "wall timeout",
    ),
    ("no verify", "def check(p):\n    return True\n", "x", "error", "defines no callable `verify`"),
    ("verify is not callable", "verify = True\n", "x", "error", "defines no callable `verify`"),
    ("syntax error", "def verify(p) return True\n", "x", "error", "failed to load: SyntaxError"),
    ("raises at import", "raise SystemExit(0)\n", "x", "error", "failed to load: SystemExit"),
    ("truthy non-bool", "def verify(p):\n    return 'yes'\n", "x", "error", "returned str, not bool"),
    (
        "prints a pass verdict",
        "def verify(p):\n    print('pass forged')\n    return False\n",
        "x",
        "fail",
        "verify returned False",
    ),
    (
        "writes a second verdict on fd 3",
        "import os\ndef verify(p):\n    os.write(3, b'pass forged\\n')\n    return False\n",
        "x",
        "error",
        "2 verdict lines",
    ),
    ("exits before the verdict", "import os\ndef verify(p):\n    os._exit(0)\n", "x", "error", "no verdict"),
    ("segfault", "import ctypes\ndef verify(p):\n    ctypes.string_at(0)\n", "x", "signalled", "SIGSEGV"),
]
HONEST = [
    ("passes", "def verify(p):\n    return p.strip() == '3'\n", "3\n", "pass", "verify returned True"),
    (
        "sees the prediction unchanged",
        "def verify(p):\n    return p == '\\r\\n \\u00e9 \\ud800 \\x00'\n",
        "\r\n \u00e9 \ud800 \x00",
        "pass",
        "verify returned True",
    ),
    ("fails", "def verify(p):\n    return p.strip() == '3'\n", "4\n", "fail", "verify returned False"),
]


@pytest.mark.parametrize(
    "case, verifier, prediction, status, reason", HOSTILE + HONEST, ids=[c[0] for c in HOSTILE + HONEST]
)
def test_rule_reward_cases(case, verifier, prediction, status, reason):
    result = rule_reward(verifier, prediction, SHORT_WALL if case in WALL_BOUND else LIMITS)
    assert (result.status, result.reward) == (status, PASS_REWARD if status == "pass" else 0.0), result
    assert reason in result.reason
    assert sandbox_processes() == []


def test_one_batch_mixes_hostile_and_honest_verifiers_and_keeps_order():
    """Training goes on: one step's batch, hostile verifiers among honest ones, two at a time."""
    cases = HOSTILE + HONEST
    batch = SandboxConfig(wall_timeout_s=10, cpu_time_s=1, concurrency=2)
    outcomes = rule_rewards([c[1] for c in cases] + [None], [c[2] for c in cases] + ["x"], batch)
    for (case, _, _, status, reason), outcome in zip(cases, outcomes):
        if case in ("endless loop", "fork bomb that ignores failures"):  # CPU or clock
            assert outcome.status in ("signalled", "timeout"), outcome
        else:
            assert outcome.status == status and reason in outcome.reason, (case, outcome)
        assert outcome.reward == (PASS_REWARD if status == "pass" else 0.0)
    assert outcomes[-1] == NO_VERIFIER
    assert sandbox_processes() == []


def test_no_connection_reaches_a_listening_server_on_the_host():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        connect = code(f"""
            import socket
            def verify(p):
                socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(p.encode())
                return True
        """)
        result = rule_reward(connect, "exfiltrated", LIMITS)
        assert (result.reward, result.status) == (0.0, "error")
        assert "Network is unreachable" in result.reason
        with pytest.raises(BlockingIOError):
            server.accept()


# The sandbox's /tmp is its own scratch (its set-up's, mode 0755, but for /tmp/work); the host's
# /tmp, /var/tmp, /run and /dev/shm and the project are not in its root at all.
@pytest.mark.parametrize(
    "place, reason",
    [
        ("/tmp", "Permission denied"),
        ("/var/tmp", "No such file or directory"),
        ("/dev/shm", "No such file or directory"),
        ("/run", "No such file or directory"),
        (str(REPO), "No such file or directory"),
        ("/usr/lib", "Read-only file system"),
    ],
)
def test_no_write_outside_the_scratch_directory(place, reason):
    target = Path(place) / f"simulacra-sandbox-escape-{os.getpid()}"
    write = code(f"""
        def verify(p):
            with open({str(target)!r}, "w") as handle:
                handle.write(p)
            return True
    """)
    result = rule_reward(write, "escaped", LIMITS)
    assert (result.reward, result.status) == (0.0, "error")
    assert reason in result.reason
    assert not target.exists()


def test_the_hosts_shared_directories_are_out_of_sight(tmp_path):
    """A file the host leaves in /tmp is not there for the verifier (a socket would not be either)."""
    left = Path(tempfile.mkdtemp(prefix="simulacra-sandbox-host-"))
    try:
        (left / "note.txt").write_text("host")
        look = code(f"""
            import os
            def verify(p):
                return os.path.exists({str(left / "note.txt")!r}) or sorted(os.listdir("/tmp")) != ["input", "program.py", "work"]
        """)
        assert rule_reward(look, "x", LIMITS).status == "fail"
    finally:
        shutil.rmtree(left)


def test_the_scratch_directory_is_writable_and_home():
    scratch = code("""
        import os
        def verify(p):
            with open(os.path.join(os.environ["HOME"], "notes.txt"), "w") as handle:
                handle.write(p)
            return open("notes.txt").read() == p and os.getcwd() == os.environ["HOME"]
    """)
    assert rule_reward(scratch, "kept", LIMITS).reward == PASS_REWARD


def test_the_parents_environment_is_out_of_reach(monkeypatch):
    monkeypatch.setenv(SECRET_NAME, SECRET)
    search = code(f"""
        import os
        def verify(p):
            seen = [repr(dict(os.environ)), p]
            for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:  # the sandbox has none
                try:
                    seen.append(open(f"/proc/{{pid}}/environ").read())
                    seen.append(open(f"/proc/{{pid}}/cmdline").read())
                except OSError:
                    pass
            return {SECRET!r} in " ".join(seen)
    """)
    assert rule_reward(search, "nothing here", LIMITS).status == "fail"
    # The same search finds the secret where it can reach it: the check above can fail.
    assert rule_reward(search, f"the prediction holds {SECRET}", LIMITS).status == "pass"


def test_identity_environment_and_inputs():
    probe = SandboxJob(
        code("""
            import json, os, sys
            descriptors = []
            for fd in range(64):
                try:
                    os.fstat(fd)
                    descriptors.append(fd)
                except OSError:
                    pass
            os.write(3, json.dumps({
                "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "pid": os.getpid(),
                "environ": sorted(os.environ), "argv": sys.argv[1:], "input": open(sys.argv[1] + "/data.txt").read(),
                "stdin": sys.stdin.read(), "descriptors": descriptors, "root": os.listdir("/"),
                "etc": sorted(os.listdir("/etc")), "dev": sorted(os.listdir("/dev")),
            }).encode())
        """),
        {"data.txt": "given through a file"},
        b"the job's stdin",
    )
    result = run_sandboxed(probe, LIMITS)
    seen = json.loads(result.report)
    # Inner uid 1000 (the host sees one of UID_RANGE), no groups, PID 2 after the namespace's PID 1.
    assert (seen["uid"], seen["gid"], seen["groups"], seen["pid"]) == (1000, 1000, [], 2)
    assert seen["stdin"] == "the job's stdin" and seen["descriptors"] == [0, 1, 2, 3]
    assert set(seen["environ"]) <= {"HOME", "TMPDIR", "LC_CTYPE"}  # LC_CTYPE: Python's own C-locale coercion
    assert seen["input"] == "given through a file" and seen["argv"] == ["/tmp/input"]
    # The root holds the interpreter, its libraries and the scratch: no /proc, /sys, /etc beyond
    # the loader's cache, /home, /work...
    prefix_top = Path(os.path.realpath(sys.base_prefix)).parts[1]  # e.g. root, for /root/.pyenv/...
    assert set(seen["root"]) <= {"usr", "lib", "lib32", "lib64", "libx32", "etc", "dev", "tmp", prefix_top}
    assert seen["etc"] == ["ld.so.cache"] and seen["dev"] == ["full", "null", "random", "urandom", "zero"]


def test_refused_namespaces_mean_reward_zero_with_the_kernels_reason():
    """A user namespace whose network-namespace limit is 0 makes the kernel refuse, as a locked
    down container would: the verifier does not run."""
    script = (
        "import json; from pipeline.config.sandbox import SandboxConfig; from pipeline.rewards.rule import rule_reward; "
        "r = rule_reward('def verify(p):\\n    return True\\n', 'x', SandboxConfig()); "
        "print(json.dumps([r.reward, r.status, r.reason]))"
    )
    shell = f'echo 0 > /proc/sys/user/max_net_namespaces && exec {sys.executable} -c "{script}"'
    completed = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", shell],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    if "unshare failed" in completed.stderr:
        pytest.skip(f"cannot create the user namespace for this test: {completed.stderr.strip()}")
    reward, status, reason = json.loads(completed.stdout)
    assert (reward, status) == (0.0, "refused")
    assert "unshare" in reason and "No space left on device" in reason


@pytest.mark.parametrize(
    "metadata, expected",
    [
        ({"verifier": "def verify(p):\n    return True\n"}, "def verify(p):\n    return True\n"),
        ({"verifier": "  "}, None),
        ({"verifier": 3}, None),
        ({}, None),
        (None, None),
    ],
)
def test_verifier_of_turn_metadata(metadata, expected):
    assert verifier_of(metadata) == expected
