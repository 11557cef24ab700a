"""What Prefect's log prints on the terminal when a stage fails for a reason the user can fix.

Prefect logs a failed flow or task run at ERROR with its traceback. Under `simulacra run` with a source path
that is not there, the terminal showed 40 lines of it before the command's own line, "stage 'ingest' failed:
/data/...: no such file, folder or glob match" (found by probing, 2026-12-06). For such a failure (a
`UserFixableError` anywhere in the exception's chain) the terminal keeps Prefect's line and drops the
traceback; Prefect's stored log (the API handler, what the UI shows) keeps it whole. Any other failure keeps its
traceback on the terminal too: there it is what a bug report needs.
"""

import logging

from pipeline.errors import user_fixable


class FixableWithoutTraceback(logging.Filter):
    """On a console handler: a record of a user-fixable failure without its traceback. The record is the one every
    handler gets, and the root's console handler is called after the flow and task loggers' API handlers."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and user_fixable(record.exc_info[1]):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_fixable_tracebacks() -> None:
    """Fit the filter to Prefect's console handlers (on the root logger, where Prefect's logging config puts
    them); once, however often it is called."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(
            isinstance(existing, FixableWithoutTraceback) for existing in handler.filters
        ):
            handler.addFilter(FixableWithoutTraceback())
