"""Prefect's temporary server for `simulacra run`, started in a process group of its own.

With no `PREFECT_API_URL`, Prefect runs a temporary API server (a uvicorn child process) in the command's own
process group. ctrl-C in a terminal signals the whole foreground group, so it stopped that server at the same
instant as the run. The crash, the last logs and events were then sent to an API that was gone, with retries:
measured on the demo's RL stage (2026-12-06, SIGINT to the group as a terminal sends it), `simulacra run` printed
its "interrupted" line 66 s after ctrl-C and exited 150 s after it.

Started here first, before the flow asks for it, in a process group of its own, the server does not see the
terminal's ctrl-C: it records the crash, and Prefect stops it at exit as before (`SubprocessASGIServer.stop`, at
exit). Like the project's other child servers it is told to die with this process, so a killed run leaves none
behind. Prefect's own client code then finds this instance (`SubprocessASGIServer()` is one instance per port,
and every caller asks for the default).
"""

import subprocess
from types import ModuleType
from typing import Any

from pipeline.child_processes import die_with_parent


class _PopenApart:
    """What `prefect.server.api.server` sees as its `subprocess` module while the server starts: the real module,
    except that Popen starts its child in a new process group that dies with this process."""

    def __init__(self, real: ModuleType):
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def Popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen:  # the name the module calls
        return self._real.Popen(*args, process_group=0, preexec_fn=die_with_parent, **kwargs)


def start_temporary_server() -> bool:
    """Start Prefect's temporary server apart from the terminal's process group, where Prefect would start one;
    False where it would not (a `PREFECT_API_URL` names a server, or ephemeral mode is off)."""
    from prefect.server.api import server as prefect_server
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        return False
    real = prefect_server.subprocess
    prefect_server.subprocess = _PopenApart(real)  # type: ignore[assignment]
    try:
        prefect_server.SubprocessASGIServer().start()
    finally:
        prefect_server.subprocess = real
    return True
