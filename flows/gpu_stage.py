"""GPU stages on a GPU work pool: the pipeline keeps the store, a GPU worker only trains.

With `orchestration.gpu_deployment` set (e.g. `gpu-stage/process-gpu`, deploy/prefect.yaml), the
pipeline flow runs each GPU stage in three steps instead of in its own process:

1. data side, where the pipeline runs: `stages.<stage>.prepare(config, store)` reads the store
   (scores check, Parquet snapshot, fingerprint), tokenises to Parquet and returns the plan, which
   is written next to the run's output (`plan.json`); the store is closed;
2. GPU side: `run_deployment` starts the `gpu-stage` flow on the GPU pool with the config (its
   workspace made absolute) and the plan's path, and waits for it. That flow takes a slot of the
   `gpu` concurrency limit and calls `stages.<stage>.train(config, plan)`, which reads the plan's
   files, trains (resuming from the last checkpoint of the run's folder) and writes the model and
   `metrics.json`. It never opens the DuckDB file: the store's single writer stays on the data side;
3. data side: `stages.<stage>.record(store, plan)` registers the checkpoint; the pipeline records
   the stage in `stage_runs` and publishes its artifacts, as for a stage run in-process.

A plan that is already trained skips step 2. A GPU run that fails fails the stage; retrying the
pipeline run dispatches a new GPU run, which resumes from the last checkpoint. Both sides must
reach the workspace at the same absolute path (one machine, or a shared filesystem), and relative
paths in the config are resolved on the data side only (step 1 reads them).

A GPU stage module provides `Plan` (with `write()` and `Plan.read(path)`), `prepare`, `train` and
`record` (stages/cpt.py).
"""

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prefect import flow, get_run_logger

from flows.artifacts import stage_progress
from flows.concurrency import connected_to_server, gpu_slot
from pipeline.config import SimulacraConfig
from pipeline.config.orchestration import GPU_POOL_STAGES
from pipeline.stage import StageResult
from pipeline.store.database import Store

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

# Built from the stage list at run time, for Prefect's parameter form; a str to the type checker.
if TYPE_CHECKING:
    GpuStageName = str
else:
    GpuStageName = Literal[tuple(sorted(GPU_POOL_STAGES))]
# How often the pipeline asks the server whether the GPU run has finished: one cheap API call.
POLL_INTERVAL_S = 2.0


class GpuRunFailed(RuntimeError):
    """The GPU stage's flow run on the GPU pool did not complete."""


def _stage_module(stage: str):
    return importlib.import_module(f"stages.{stage}")


@flow(
    name="gpu-stage",
    description="Train one GPU stage from the files the pipeline prepared (orchestration.gpu_deployment).",
)
def gpu_stage(stage: GpuStageName, config: dict[str, Any], plan: str) -> str:
    """Train one GPU stage on this worker from files only; the pipeline that dispatched it records the result.

    Args:
        stage: The GPU stage to train.
        config: The pipeline's resolved configuration, its workspace an absolute path.
        plan: The plan file the pipeline wrote (`runs/<stage>/<fingerprint>/plan.json`): the
            Parquet inputs, the output folder and the base model.
    """
    resolved = SimulacraConfig.model_validate(config)
    module = _stage_module(stage)
    planned = module.Plan.read(Path(plan))
    with gpu_slot(resolved, stage), stage_progress(stage):
        module.train(resolved, planned)
    get_run_logger().info("%s: trained into %s", stage, planned.output_dir)
    return str(planned.output_dir)


def _require_deployment(name: str) -> None:
    """Fail before any preparation when the server cannot dispatch to the deployment."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    if not connected_to_server():
        raise GpuRunFailed(f"orchestration.gpu_deployment ({name}) needs a Prefect server: set PREFECT_API_URL")
    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(name)
    except ObjectNotFound:
        raise GpuRunFailed(
            f"orchestration.gpu_deployment: the server has no deployment {name!r} (deploy deploy/prefect.yaml: "
            "`simulacra server start`)"
        ) from None


def dispatch(config: SimulacraConfig, store: Store, stage: str) -> StageResult:
    """The pipeline's side of a GPU stage on the GPU pool (module docstring, steps 1-3)."""
    from prefect.deployments import run_deployment

    deployment = config.orchestration.gpu_deployment
    assert deployment is not None  # flows/dag.py dispatches only when it is set
    _require_deployment(deployment)
    module = _stage_module(stage)
    plan = module.prepare(config, store)
    store.close()  # the GPU run may take hours; nightly ingestion keeps writing meanwhile
    if not plan.done:
        handed = config.model_dump(mode="json")
        handed["workspace"]["path"] = str(config.workspace.root)
        parameters = {"stage": stage, "config": handed, "plan": str(plan.write())}
        # Prefect's async_dispatch types the result `R | Coroutine`; called from sync code it is the FlowRun.
        run: FlowRun = run_deployment(  # type: ignore[assignment]
            deployment, parameters=parameters, timeout=None, poll_interval=POLL_INTERVAL_S
        )
        assert run.state is not None  # timeout=None: run_deployment returns once the run has a final state
        if not run.state.is_completed():
            raise GpuRunFailed(
                f"{stage}: flow run {run.name} ({run.id}) of deployment {deployment} ended "
                f"{run.state.type.value}: {run.state.message}"
            )
    return module.record(store, plan)
