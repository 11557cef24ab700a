"""Runs inside the sandbox: loads a turn's verifier code and calls `verify(prediction)` once.

Not imported by the project: `pipeline.rewards.rule` sends this file's text to the sandbox, which
runs it as `python -I -S -B program.py INPUT_DIR` with INPUT_DIR holding `verifier.py` and
`prediction.txt`, and this run's nonce on stdin. The verdict is one framed line on fd 3, written
only by this process (a child the verifier forks never writes one; a program it starts holds
neither fd 3 nor the nonce, which is read here before the verifier loads and never reaches a
file), then the process ends at once (`os._exit`: no atexit hook or buffered output of the
verifier's runs after it):

    NONCE pass|fail|error <reason on one line>

The host accepts exactly that line and nothing else on fd 3: a stray `pass ` written before it
(issue 20: it merged with the harness's `fail` line into one read as a pass) spoils the frame.
(No JSON: importing `json` costs every run an import of `re`.)

`pass` only when `verify` returns exactly `True`; a truthy non-bool is an error, not a pass.
"""

import os
import sys

VERDICT_FD = 3


def report(verdict: str, reason: str) -> None:
    if os.getpid() == HARNESS_PID:
        line = f"{NONCE} {verdict} {' '.join(reason.split())}\n"
        os.write(VERDICT_FD, line.encode("utf-8", "replace"))
    os._exit(0)


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def main() -> None:
    os.set_inheritable(VERDICT_FD, False)  # a program the verifier starts does not get it
    inputs = sys.argv[1]
    with open(os.path.join(inputs, "prediction.txt"), encoding="utf-8", errors="surrogatepass", newline="") as handle:
        prediction = handle.read()
    namespace = {"__name__": "verifier", "__builtins__": __builtins__}
    try:
        with open(os.path.join(inputs, "verifier.py"), encoding="utf-8") as handle:
            code = handle.read()
        exec(compile(code, "verifier.py", "exec"), namespace)
    except BaseException as error:  # noqa: BLE001 - whatever the untrusted code raises is its verdict
        report("error", f"verifier code failed to load: {describe(error)}")
    verify = namespace.get("verify")
    if not callable(verify):
        report("error", "verifier code defines no callable `verify`")
    try:
        result = verify(prediction)  # type: ignore[operator]  # not callable: report() above has exited
    except BaseException as error:  # noqa: BLE001
        report("error", f"verify raised {describe(error)}")
    if type(result) is not bool:
        report("error", f"verify returned {type(result).__name__}, not bool")
    report("pass" if result else "fail", "verify returned True" if result else "verify returned False")


def read_nonce() -> str:
    """The nonce from stdin, which is then /dev/null for the verifier and what it starts."""
    chunks = []
    while chunk := os.read(0, 4096):
        chunks.append(chunk)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return b"".join(chunks).decode("ascii")


HARNESS_PID = os.getpid()
NONCE = read_nonce()
main()
