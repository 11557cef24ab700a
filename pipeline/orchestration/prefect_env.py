"""Prefect's environment for this project, set before `prefect` is first imported.

Prefect reads its settings when it is imported, so every entry point that runs flows (`simulacra
run`, `simulacra server`) calls `configure` first. STACK.md ("Prefect 3.9"): Prefect's home (its
SQLite database, its results) lives in the workspace, and nothing is sent out: no telemetry, no
analytics. Values the user set in the environment win: a `PREFECT_API_URL` pointing at a team's
server sends `simulacra run` there instead of to a temporary local one.
"""

import os
import sys
from pathlib import Path

from pipeline.config.workspace import make_private

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
