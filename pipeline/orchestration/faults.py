"""The fault hook that resume tests and failure drills use.

`orchestration.fail_stage: NAME` makes stage NAME raise once, at a point after it has persisted
part of its work, so a rerun (from the CLI, or a retry from the Prefect UI with the same
parameters) must resume from what was persisted. "Once" is per workspace: a marker file records
that the fault fired, so the retry is not failed again.

`orchestration.fail_how: kill` makes the same point a SIGKILL of the process instead: nothing runs after
it (no `finally`, no exit handler, no rollback), which is what an out-of-memory kill or a preempted node
does, and a test that kills the process from outside cannot aim at a point that passes in milliseconds.
"""

import os
import signal

from pipeline.config import SimulacraConfig


class InjectedFault(RuntimeError):
    """Raised by the fault hook; never raised unless `orchestration.fail_stage` names the stage."""


def maybe_fail(config: SimulacraConfig, stage: str, where: str) -> None:
    if config.orchestration.fail_stage != stage:
        return
    marker = config.workspace.root / "faults" / f"{stage}.fired"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(where)
    if config.orchestration.fail_how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFault(f"injected fault in stage {stage!r} {where} (orchestration.fail_stage)")
