"""The `world-model-pipeline` flow: every stage, in DAG order, from one config.

Deployed twice from deploy/prefect.yaml: manually from the UI (`world-model-pipeline`), and nightly
with the data stages only (`nightly-data-refresh`). `simulacra run` calls it directly. Its
parameters render as a form in the UI; the docstring's Args are their descriptions. Each has a
plain type and a default of that type, "empty" meaning "the config's": Prefect renders `X | None`
as a union the user must first switch from None, and shows no type or default for it.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from flows.dag import MaxSteps, StageOutcome, config_stages, resolve_config, run_stages
from flows.stored_parameters import pipeline_flow, redact_stored_overrides
from pipeline.config.orchestration import STAGE_ORDER

# Built from STAGE_ORDER at run time, for Prefect's parameter form; a str to the type checker.
if TYPE_CHECKING:
    StageName = str
else:
    StageName = Literal[STAGE_ORDER]


@pipeline_flow(name="world-model-pipeline", description="Ingest, filter, score, split and train a world model.")
def world_model_pipeline(
    config_path: str = "",
    workspace: str = "",
    stages: Sequence[StageName] = (),
    overrides: Sequence[str] = (),
    base_model: str = "",
    max_steps: MaxSteps = 0,
) -> list[StageOutcome]:
    """Run the pipeline's stages; a stage whose fingerprint already completed is skipped, one that
    failed part-way resumes from what it persisted.

    Args:
        config_path: Simulacra YAML config; a relative path is relative to the project folder the
            worker runs in (e.g. data/configs/demo.yaml). Empty: the defaults.
        workspace: Workspace folder the run reads and writes (`workspace.path`); `simulacra server
            start` sets its own, absolute. Empty: the config's.
        stages: Stages to run, always in DAG order. Empty: the config's `orchestration.stages` (fidelity
            only when `fidelity.enabled`).
        overrides: Config overrides as KEY.PATH=VALUE, e.g. `cpt.learning_rate=1e-4`, applied after the file.
        base_model: Hugging Face name or local path of the model training starts from (`model.base`).
            Empty: the config's.
        max_steps: Optimizer steps of every training stage (`cpt.max_steps`, ...), for quick runs.
            0: each stage's own from the config.
    """
    redact_stored_overrides()
    config = resolve_config(config_path, overrides, base_model, max_steps, workspace)
    return run_stages(config, config_stages(config, stages))
