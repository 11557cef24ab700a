"""The stages as Prefect tasks, run in DAG order, skipped or resumed by their fingerprints.

For each stage, in `STAGE_ORDER`:
1. its fingerprint is computed from the store as it is now (pipeline/orchestration/fingerprint.py);
2. if `stage_runs` holds a completed run with that fingerprint, the stage is skipped: a `skipped`
   row is recorded and the completed run's metrics are returned;
3. otherwise the stage runs as a Prefect task (between `started` and `completed`/`failed` rows),
   resuming from whatever an earlier, failed run persisted, and publishes its artifacts. With
   `orchestration.gpu_deployment` set, a GPU stage's training runs as a flow run of that deployment
   on a GPU pool, and the task prepares, waits and records (flows/gpu_stage.py).

The task is cached by Prefect under `<stage>-<fingerprint>` with its result persisted in the
workspace, so the UI shows a skipped stage as Cached. The cache is only read when `stage_runs`
already says the stage is done (`refresh_cache` otherwise): the store decides, not the cache
(PrefectHQ/prefect#21727; a cache entry also outlives a deleted store).
"""

import importlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

from prefect import get_run_logger, task
from pydantic import Field

from flows.artifacts import ProgressArtifact, publish_stage, stage_progress
from flows.concurrency import gpu_slot
from pipeline.config import SimulacraConfig, load_config, parse_override
from pipeline.config.orchestration import GPU_POOL_STAGES, OPTIONAL_STAGES, STAGE_ORDER
from pipeline.errors import UserFixableError, full_disk, interrupted
from pipeline.orchestration.fingerprint import stage_fingerprint
from pipeline.stage import StageResult
from pipeline.store import stage_runs
from pipeline.store.database import open_store


@dataclass
class StageOutcome:
    """What the flow reports for one stage: `ran` or `skipped` (a failure raises StageFailed)."""

    stage: str
    status: str
    fingerprint: str
    summary: str
    metrics: dict[str, Any] = field(default_factory=dict)
    output_path: str | None = None

    @classmethod
    def of(cls, status: str, fingerprint: str, result: StageResult) -> "StageOutcome":
        output = str(result.output_path) if result.output_path else None
        return cls(result.stage, status, fingerprint, result.summary, result.metrics, output)


class StageFailed(RuntimeError):
    """A stage raised; carries the outcomes of the stages before it, and whether the user fixes the cause by doing
    what the message names (a UserFixableError: a stage run before its inputs exist) rather than by rerunning.
    Args stay (message, outcomes, fixable) so that the exception pickles, as Prefect stores it with the failed
    state."""

    def __init__(self, message: str, outcomes: list[StageOutcome], fixable: bool = False):
        super().__init__(message, outcomes, fixable)

    @property
    def outcomes(self) -> list[StageOutcome]:
        return self.args[1]

    @property
    def fixable(self) -> bool:
        return self.args[2]

    def __str__(self) -> str:
        return self.args[0]


def training_sections() -> list[str]:
    """Config sections with a `max_steps` field: the stages the `max_steps` parameter applies to."""
    return [
        name
        for name, info in SimulacraConfig.model_fields.items()
        if "max_steps" in getattr(info.annotation, "model_fields", {})
    ]


# The flows' `max_steps` parameter: 0 (its default) leaves each stage's own.
MaxSteps = Annotated[int, Field(ge=0)]


def resolve_config(
    config_path: str, overrides: Sequence[str], base_model: str, max_steps: int, workspace: str = ""
) -> SimulacraConfig:
    """The config a flow run uses: the file, then `key=value` overrides, then the typed shortcuts.
    Empty (the parameters' defaults) leaves the config's value."""
    layers = [parse_override(text) for text in overrides]
    if workspace:
        layers.append({"workspace": {"path": workspace}})
    if base_model:
        layers.append({"model": {"base": base_model}})
    if max_steps:
        layers += [{section: {"max_steps": max_steps}} for section in training_sections()]
    return load_config(config_path or None, layers)


def stage_runner(stage: str):
    """`stages.<stage>.run`: stage modules are imported when their stage runs, not at flow import."""
    return importlib.import_module(f"stages.{stage}").run


def on_gpu_pool(config: SimulacraConfig, stage: str) -> bool:
    """Whether the stage is dispatched to the GPU pool's deployment (flows/gpu_stage.py), which
    takes the `gpu` slot itself, instead of running in this process."""
    return stage in GPU_POOL_STAGES and config.orchestration.gpu_deployment is not None


@contextmanager
def interrupts_crash() -> Iterator[None]:
    """ctrl-C as a KeyboardInterrupt, also where DuckDB caught it mid-query and raised an error of its own
    (pipeline/errors.py): Prefect records an Exception as FAILED and a KeyboardInterrupt as CRASHED, and an
    interrupted run is the second. ctrl-C mid-ingest under `simulacra run` left the flow run FAILED."""
    try:
        yield
    except Exception as exc:
        if interrupted(exc):
            raise KeyboardInterrupt(str(exc)) from exc
        raise


@task(persist_result=True)
def run_stage(config: SimulacraConfig, stage: str, fingerprint: str) -> StageOutcome:
    with interrupts_crash():
        return _execute(config, stage, fingerprint)


def _execute(config: SimulacraConfig, stage: str, fingerprint: str) -> StageOutcome:
    runner = stage_runner(stage)
    with open_store(config) as store:
        completed = stage_runs.completed_run(store, stage, fingerprint)
        if completed is not None:  # the cache was asked but missed: the store still decides
            return StageOutcome.of("skipped", fingerprint, completed.result())
        if on_gpu_pool(config, stage):
            from flows.gpu_stage import dispatch

            result = stage_runs.execute(store, stage, fingerprint, lambda: dispatch(config, store, stage))
        else:
            # Waiting for the `gpu` slot can take as long as another run's training: the store is let go meanwhile
            # (it reopens on first use), or every stage of every other run, the nightly refresh's too, would wait on
            # it (found by probing: the refresh failed after 120 s behind a run queued for the slot).
            store.close()
            with gpu_slot(config, stage), stage_progress(stage):
                completed = stage_runs.completed_run(store, stage, fingerprint)
                if completed is not None:  # the run that held the slot did the same work meanwhile
                    stage_runs.record_skip(store, completed)
                    return StageOutcome.of("skipped", fingerprint, completed.result())
                result = stage_runs.execute(store, stage, fingerprint, lambda: runner(config, store))
    publish_stage(stage, fingerprint, result)
    get_run_logger().info("%s: %s", stage, result.summary)
    return StageOutcome.of("ran", fingerprint, result)


def _run_one(config: SimulacraConfig, stage: str) -> StageOutcome:
    with open_store(config) as store:
        fingerprint = stage_fingerprint(config, store, stage)
        completed = stage_runs.completed_run(store, stage, fingerprint)
        if completed is not None:
            stage_runs.record_skip(store, completed)
    cached = run_stage.with_options(
        name=stage,
        cache_key_fn=lambda context, parameters: f"{stage}-{fingerprint}",
        result_storage=config.workspace.prefect_home / "results",
        refresh_cache=completed is None,
    )
    outcome = cached(config, stage, fingerprint)
    if completed is not None:
        get_run_logger().info("%s: skipped, fingerprint %s already completed", stage, fingerprint)
        return StageOutcome.of("skipped", fingerprint, completed.result())
    return outcome


def run_stages(config: SimulacraConfig, stages: Sequence[str]) -> list[StageOutcome]:
    """Run the named stages in DAG order; raises StageFailed at the first that fails."""
    unknown = sorted(set(stages) - set(STAGE_ORDER))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; stages are {', '.join(STAGE_ORDER)}")
    ordered = [name for name in STAGE_ORDER if name in stages]
    for name in ordered:
        stage_runner(name)  # every module exists before the first stage starts
    pipeline_progress = ProgressArtifact("pipeline-progress", f"stages done of {', '.join(ordered)}")
    pipeline_progress.report(0.0)
    outcomes: list[StageOutcome] = []
    for done, name in enumerate(ordered, start=1):
        try:
            with interrupts_crash():
                outcomes.append(_run_one(config, name))
        except Exception as exc:
            reason = full_disk(exc, config.workspace.root) or exc
            fixable = isinstance(exc, UserFixableError)
            raise StageFailed(f"stage {name!r} failed: {reason}", outcomes, fixable) from exc
        pipeline_progress.report(100.0 * done / len(ordered), force=True)
    return outcomes


def config_stages(config: SimulacraConfig, stages: Sequence[str] | None) -> list[str]:
    """The stages a run asked for, or else the config's `orchestration.stages` without the optional stages
    whose section is not `enabled` (fidelity: it serves every model and plays hundreds of episodes)."""
    if stages:
        return list(stages)
    return [
        stage for stage in config.orchestration.stages if stage not in OPTIONAL_STAGES or getattr(config, stage).enabled
    ]
