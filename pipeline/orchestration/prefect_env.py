"""Prefect's environment for this project, set before `prefect` is first imported.

Prefect reads its settings when it is imported, so every entry point that runs flows (`simulacra
run`, `simulacra server`) calls `configure` first. STACK.md ("Prefect 3.9"): Prefect's home (its
SQLite database, its results) lives in the workspace, and nothing is sent out: no telemetry, no
analytics. Values the user set in the environment win: a `PREFECT_API_URL` pointing at a team's
server sends `simulacra run` there instead of to a temporary local one.
"""

import os
import sqlite3
import sys
from contextlib import closing
from pathlib import Path

from pipeline.config.workspace import make_private
from pipeline.errors import UserFixableError

# A temporary server starts in about 8 s on an idle machine (STACK.md); Prefect's default of 20 s
# fails on a loaded 2-core runner, where we measured 18 s.
EPHEMERAL_STARTUP_TIMEOUT_S = 120


def prefect_environment(prefect_home: Path) -> dict[str, str]:
    """The variables `configure` sets, for child processes (server, worker) too."""
    return {
        "PREFECT_HOME": str(prefect_home),
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(EPHEMERAL_STARTUP_TIMEOUT_S),
    }


def configure(prefect_home: Path) -> None:
    """Create Prefect's home private to its owner, as Prefect itself would (0700, and so the
    workspace above it: its database holds the key of every Secret block), and set Prefect's
    environment for this process, keeping anything the user set explicitly."""
    make_private(prefect_home.parent)
    make_private(prefect_home)
    if "prefect" in sys.modules:
        # Too late to take effect (tests that import prefect first configure it themselves).
        return
    for name, value in prefect_environment(prefect_home).items():
        os.environ.setdefault(name, value)


# Where Prefect keeps its database unless one of these names another (a team's PostgreSQL, say).
DATABASE_URL_VARIABLES = ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL")


def check_prefect_database(prefect_home: Path) -> None:
    """Refuse, in one line, a Prefect database SQLite cannot read: Prefect's server then failed to start on every
    try, and `simulacra run` printed 29 tracebacks (3,309 lines) over two minutes before "Timed out while
    attempting to connect" (found by probing, 2026-12-06, with the file overwritten). The header and schema are
    read, not the whole file: a workspace's run history grows to hundreds of MB."""
    path = prefect_home / "prefect.db"
    if any(os.environ.get(name) for name in DATABASE_URL_VARIABLES) or not path.is_file() or not path.stat().st_size:
        return
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as database:
            database.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError as exc:
        raise UserFixableError(
            f"Prefect's database {path} cannot be read ({exc}): it holds Prefect's run history, not the store; "
            f"move it aside (`mv {path} {path}.unreadable`) and rerun: Prefect starts a new one"
        ) from None
