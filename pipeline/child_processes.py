"""Child processes of the project's own code: run from its root, and ended with the process that started them."""

import os
import signal
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def project_env() -> dict[str, str]:
    """This process's environment, with the project first on PYTHONPATH: a child's `python -m pipeline...` imports
    this checkout whatever its working folder and however the project was installed."""
    paths = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": paths}


def die_with_parent() -> None:
    """In the child, before exec (`preexec_fn`): SIGTERM when the parent dies (Linux; elsewhere a no-op), so a
    killed run leaves no server or converter behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
