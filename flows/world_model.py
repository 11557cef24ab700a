"""The `world-model-pipeline` flow: every stage, in DAG order, from one config.

Deployed twice from deploy/prefect.yaml: manually from the UI (`world-model-pipeline`), and nightly
with the data stages only (`nightly-data-refresh`). `simulacra run` calls it directly. Its
parameters render as a form in the UI; the docstring's Args are their descriptions.
"""

from typing import Literal

from prefect import flow

from flows.dag import StageOutcome, config_stages, resolve_config, run_stages
from pipeline.config.orchestration import STAGE_ORDER

StageName = Literal[STAGE_ORDER]


@flow(name="world-model-pipeline", description="Ingest, filter, score, split and train a world model.")
def world_model_pipeline(
    config_path: str | None = None,
    stages: list[StageName] | None = None,
    overrides: list[str] | None = None,
    base_model: str | None = None,
    max_steps: int | None = None,
) -> list[StageOutcome]:
    """Run the pipeline's stages; a stage whose fingerprint already completed is skipped, one that
    failed part-way resumes from what it persisted.

    Args:
        config_path: Simulacra YAML config, relative to the project folder the worker runs in
            (e.g. data/configs/demo.yaml). Empty: the defaults.
        stages: Stages to run, always in DAG order. Empty: the config's `orchestration.stages`.
        overrides: Config overrides as KEY.PATH=VALUE, e.g. `cpt.learning_rate=1e-4`, applied after the file.
        base_model: Hugging Face name or local path of the model training starts from (`model.base`).
        max_steps: Optimizer steps of every training stage (`cpt.max_steps`, ...), for quick runs.
    """
    config = resolve_config(config_path, overrides, base_model, max_steps)
    return run_stages(config, config_stages(config, stages))
