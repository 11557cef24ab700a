"""Child processes that end with the process that started them."""

import signal
import sys


def die_with_parent() -> None:
    """In the child, before exec (`preexec_fn`): SIGTERM when the parent dies (Linux; elsewhere a no-op), so a
    killed run leaves no server or converter behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
