"""Configuration of how `simulacra run` and the Prefect flows chain the stages.

`STAGE_ORDER` is the DAG (DESIGN.md, "Data flow"); a new stage joins it here, declares its inputs in
pipeline/orchestration/fingerprint.py, and is a module `stages/<name>.py` with `run(config, store) -> StageResult`.
"""

from typing import Literal

from pydantic import Field, field_validator

from pipeline.config.base import Section

STAGE_ORDER = ("ingest", "filter", "score", "split", "cpt", "sft", "rl", "evaluate", "fidelity", "export")
# Stages `simulacra run` leaves out of `orchestration.stages` unless their section's `enabled` is on; named in
# `--stages` (or run by their own flow) they run regardless.
OPTIONAL_STAGES = frozenset({"fidelity"})
# Stages that train or generate with a model: they hold a slot of the `gpu` concurrency limit.
GPU_STAGES = frozenset({"cpt", "sft", "rl", "evaluate", "fidelity"})
# The GPU stages `gpu_deployment` hands to a GPU pool (prepare / train / record, flows/gpu_stage.py).
# Not evaluate and fidelity: they commit their rows to the store as they produce them, so they run where the
# store is, holding a `gpu` slot (a served checkpoint, `evaluate.predictor.backend: openai`, needs no GPU there).
GPU_POOL_STAGES = frozenset({"cpt", "sft", "rl"})


class OrchestrationConfig(Section):
    stages: list[str] = Field(
        default_factory=lambda: list(STAGE_ORDER),
        description="Stages `simulacra run` executes; they always run in DAG order. A stage left out is not "
        "run; its downstream stages still read whatever the store holds. An optional stage (fidelity) listed "
        "here runs only when its section's `enabled` is on.",
    )
    gpu_concurrency_limit: str | None = Field(
        default="gpu",
        description="Prefect global concurrency limit whose slots GPU stages take, one each, so runs never "
        "oversubscribe the GPUs (`simulacra server start` creates it). Ignored without a Prefect server "
        "(one run at a time anyway); None disables it.",
    )
    gpu_deployment: str | None = Field(
        default=None,
        description="Prefect deployment (`flow/deployment`, e.g. `gpu-stage/process-gpu` from deploy/prefect.yaml) "
        "that trains each GPU stage on a GPU work pool: the pipeline prepares the stage's files where the data "
        "stages run, waits for that deployment's run, then records the result, so only training holds a GPU "
        "and the store never leaves the data side. Needs a Prefect server and a workspace both workers reach "
        "at the same path. None: GPU stages train in the pipeline's own process (the demo, one machine).",
    )
    fail_stage: str | None = Field(
        default=None,
        description="Fault hook for resume tests and drills: the named stage raises once per workspace, after "
        "persisting part of its work. Never set it in production.",
    )
    fail_how: Literal["raise", "kill"] = Field(
        default="raise",
        description="How `fail_stage` fails: `raise` an error the run records and a retry resumes from, or "
        "`kill` the stage's process with SIGKILL at that point (no cleanup, as an out-of-memory kill or a "
        "preempted node), for drills of resuming after a hard kill at a known point.",
    )

    @field_validator("stages", "fail_stage")
    @classmethod
    def _known_stages(cls, value: list[str] | str | None) -> list[str] | str | None:
        names = [value] if isinstance(value, str) else value or []
        unknown = [name for name in names if name not in STAGE_ORDER]
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; stages are {', '.join(STAGE_ORDER)}")
        return value
