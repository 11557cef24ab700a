"""The error a user fixes by doing something, as opposed to a bug.

A stage run before its inputs exist, a file that is not there, a store another process holds: the
message is one line that names the fix ("run `simulacra score`"), and the CLI prints it without a
traceback and exits with status 2 (pipeline/cli.py). Anything else is a bug and keeps its traceback.

And ctrl-C, in whichever form it reaches the code (DuckDB reports one as its own error): the CLI turns it
into one line and status 130, and code that routes around DuckDB's refusals must let it through. SIGTERM (what
`timeout`, a container's stop, a scheduler's cancel send) stops a command the same way, with its own line and
status 143.
"""

import errno
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TypeGuard

# What the CLI prints after the command's name when ctrl-C stopped it.
INTERRUPTED = "interrupted: rerun the same command to resume"
# And when SIGTERM stopped it.
TERMINATED = "terminated: rerun the same command to resume"
# Commands that serve until they are stopped: a signal is how they end, and they have nothing to resume.
SERVICES = frozenset({"serve", "openenv"})

_interrupts_received = 0
_last_signal = signal.SIGINT


class UserFixableError(RuntimeError):
    """A problem the user can fix; the message names the fix in one line."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where ctrl-C's KeyboardInterrupt would be: every path that lets an interrupt through (a
    transaction rolled back, DuckDB's own report of it recognised, Prefect's run recorded CRASHED) does the same
    for it, since it is one."""


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """The exception, then what it was raised from or while handling, each once (a chain can loop)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        yield exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__


def interrupted(exc: BaseException) -> bool:
    """ctrl-C, anywhere in the exception's chain: cleanup that runs after it can fail in turn (DuckDB
    refuses `unregister` in the transaction the interrupt aborted) and raise an error of its own, whose
    context holds the interrupt. Code that catches `duckdb.Error` to route around a refusal asks this
    first, or the interrupt is swallowed (DuckDB reports it as one of its errors)."""
    return any(_is_interrupt(current) for current in exception_chain(exc))


def user_fixable(exc: BaseException | None) -> bool:
    """A `UserFixableError`, or an error raised from one (a stage's failure wrapping it, `fixable` in its own
    words), anywhere in the chain."""
    return any(
        isinstance(current, UserFixableError) or getattr(current, "fixable", False) is True
        for current in exception_chain(exc)
    )


def _is_interrupt(exc: BaseException) -> bool:
    """Python's KeyboardInterrupt; DuckDB's own when the signal arrives while a query runs (a RuntimeError
    "Query interrupted", or its InterruptException); or DuckDB's report of a KeyboardInterrupt raised in the
    Python code it called while the query ran (scanning a registered Arrow or pandas object), which it wraps
    as another error: "counting the rows of the object registered as 'new_turns' failed: KeyboardInterrupt"."""
    if isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "InterruptException":
        return True
    if isinstance(exc, RuntimeError) and str(exc) == "Query interrupted":
        return True
    return type(exc).__module__.startswith(("duckdb", "_duckdb")) and "KeyboardInterrupt" in str(exc)


# How a full disk reaches the code: Python's OSError (ENOSPC, or EDQUOT over a quota); DuckDB's IO error, which quotes
# the OS's words; torch's checkpoint writer, whose short write says only "unexpected pos 693743040 vs 693742932" (seen
# when a demo filled this machine's disk mid-CPT, 2026-12-06).
_FULL_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_FULL_DISK_WORDS = ("No space left on device", "Disk quota exceeded", "unexpected pos ")


def out_of_space(exc: BaseException) -> TypeGuard[OSError]:
    """Python's own report of a full disk or quota: code that turns OSErrors into one-line refusals lets these
    through, so `full_disk` can name the free space."""
    return isinstance(exc, OSError) and exc.errno in _FULL_DISK_ERRNOS


def full_disk(exc: BaseException, where: Path) -> str | None:
    """One line naming the fix when a full disk (or quota) is what failed, anywhere in the exception's chain; None
    otherwise. The free space is measured at the file that failed where the error names it, else at `where` (the
    workspace), so the user sees how much to free and where."""
    for current in exception_chain(exc):
        if out_of_space(current):
            failed = current.filename2 or current.filename
            return _full_disk_line(Path(failed) if isinstance(failed, str) else where)
        if any(words in str(current) for words in _FULL_DISK_WORDS):
            return _full_disk_line(where)
    return None


def _full_disk_line(path: Path) -> str:
    measured = next((folder for folder in (path, *path.parents) if folder.is_dir()), None)
    free = f"{_size(shutil.disk_usage(measured).free)} free at {measured}" if measured else f"nothing found at {path}"
    return f"a write failed because the disk is full or over its quota ({free}): free space there"


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def watch_for_interrupts() -> None:
    """From now on ctrl-C raises KeyboardInterrupt, as Python's own handler does, and SIGTERM `Terminated`, where
    it ended the process on the spot with no word (status 143, a log that stops mid-line); each is counted
    (`interrupts_received`), so the CLI knows of one that a library ran the handler for and then dropped:
    DuckDB checks for signals while a query runs, and one ctrl-C in 27 ended `ingest` with status 0, the
    file read to its end (issue 29.3). A process started with ctrl-C ignored (`nohup`) keeps ignoring it, and
    one whose SIGTERM someone else handles keeps their handler."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(signum) in (default, _count_and_raise):
            signal.signal(signum, _count_and_raise)


def interrupts_received() -> int:
    """How many ctrl-Cs (or SIGTERMs) reached the handler `watch_for_interrupts` installed, whatever became of them."""
    return _interrupts_received


def stopped_by(command: str | None = None) -> tuple[str, int]:
    """What the CLI prints after the command's name when a signal stopped it, and the exit status: ctrl-C's 130,
    SIGTERM's 143 (128 + the signal, as a shell reports a process the signal ended). A server (SERVICES) was
    stopped, the way it ends, and is not told to resume (found by probing: `serve: terminated: rerun the same
    command to resume`)."""
    status = 128 + (signal.SIGTERM if _last_signal == signal.SIGTERM else signal.SIGINT)
    if command in SERVICES:
        return f"stopped ({signal.Signals(_last_signal).name})", status
    return (TERMINATED if _last_signal == signal.SIGTERM else INTERRUPTED), status


def _count_and_raise(signum, frame) -> None:
    global _interrupts_received, _last_signal
    _interrupts_received += 1
    _last_signal = signum
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
