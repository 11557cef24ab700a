"""The error a user fixes by doing something, as opposed to a bug.

A stage run before its inputs exist, a file that is not there, a store another process holds: the
message is one line that names the fix ("run `simulacra score`"), and the CLI prints it without a
traceback and exits with status 2 (pipeline/cli.py). Anything else is a bug and keeps its traceback.

And ctrl-C, in whichever form it reaches the code (DuckDB reports one as its own error): the CLI turns it
into one line and status 130, and code that routes around DuckDB's refusals must let it through.
"""


class UserFixableError(RuntimeError):
    """A problem the user can fix; the message names the fix in one line."""


def interrupted(exc: BaseException) -> bool:
    """ctrl-C, anywhere in the exception's chain: cleanup that runs after it can fail in turn (DuckDB
    refuses `unregister` in the transaction the interrupt aborted) and raise an error of its own, whose
    context holds the interrupt. Code that catches `duckdb.Error` to route around a refusal asks this
    first, or the interrupt is swallowed (DuckDB reports it as one of its errors)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if _is_interrupt(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


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
