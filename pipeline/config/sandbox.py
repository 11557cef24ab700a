"""Limits of the sandbox that runs untrusted verifier code (issues 11, 20, `pipeline/rewards/sandbox.py`).

Embedded by the `rl` section: the rule reward runs every verifier under these limits.
"""

from pydantic import Field

from pipeline.config.base import Section

MIB = 1024 * 1024


class SandboxConfig(Section):
    wall_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds of wall time before the whole sandbox (every process in it) is killed: reward 0, "
        "reason `timeout`. Catches verifiers that sleep or block, which use no CPU. A real verifier checks one "
        "observation in milliseconds; 10 s leaves room for a loaded machine and Python's start-up.",
    )
    cpu_time_s: int = Field(
        default=5,
        ge=1,
        description="CPU seconds per process (RLIMIT_CPU; SIGXCPU at this, SIGKILL one second later). Stops an "
        "endless loop before the wall timeout and without waiting for it on a busy machine.",
    )
    memory_bytes: int = Field(
        default=256 * MIB,
        ge=64 * MIB,
        description="Address space per process (RLIMIT_AS). Python starts in about 30 MB and a verifier "
        "imports only the standard library (no site-packages: `python -I -S`); a huge allocation fails at once "
        "with MemoryError (verify raises: reward 0). Per process: a sandbox holds at most "
        "max_processes x memory_bytes (2 GiB by default) plus its scratch; the memory no address space counts "
        "(memfd_create, SysV shared memory and message queues, a tmpfs of a nested namespace) is refused.",
    )
    max_processes: int = Field(
        default=8,
        ge=1,
        description="Processes and threads the verifier may hold (RLIMIT_NPROC). The kernel counts them per "
        "uid within the run's own user namespace, so the count is this run's alone; a fork bomb hits the limit "
        "and fails. A verifier needs one; the limit also bounds the sandbox's memory and CPU (per-process limits).",
    )
    scratch_bytes: int = Field(
        default=16 * MIB,
        ge=1 * MIB,
        description="Size of the fresh tmpfs that is the verifier's working directory and HOME, its only "
        "writable place; also the largest file it may write (RLIMIT_FSIZE). It vanishes with the sandbox.",
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Verifications run at once by the batch API; null = the machine's CPU count (each "
        "verification is two short Python processes, bound by CPU).",
    )
