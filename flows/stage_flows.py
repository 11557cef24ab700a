"""One flow per stage, for rerunning a single stage from the UI (deploy/prefect.yaml deploys each).

A stage flow is the pipeline flow restricted to that stage: the same fingerprints, the same skip and
resume. A new stage adds one line here and one deployment in deploy/prefect.yaml.
"""

from collections.abc import Sequence

from prefect import Flow

from flows.dag import MaxSteps, StageOutcome, resolve_config, run_stages
from flows.stored_parameters import pipeline_flow, redact_stored_overrides


def stage_flow(stage: str) -> Flow:
    @pipeline_flow(
        name=stage, description=f"Run the {stage} stage alone (skipped if its fingerprint already completed)."
    )
    def run_one_stage(
        config_path: str = "",
        workspace: str = "",
        overrides: Sequence[str] = (),
        base_model: str = "",
        max_steps: MaxSteps = 0,
    ) -> list[StageOutcome]:
        """Run one stage of the pipeline.

        Args:
            config_path: Simulacra YAML config; a relative path is relative to the project folder the
                worker runs in (e.g. data/configs/demo.yaml). Empty: the defaults.
            workspace: Workspace folder the run reads and writes (`workspace.path`); `simulacra server
                start` sets its own, absolute. Empty: the config's.
            overrides: Config overrides as KEY.PATH=VALUE, e.g. `cpt.learning_rate=1e-4`, applied after the file.
            base_model: Hugging Face name or local path of the model training starts from (`model.base`).
                Empty: the config's.
            max_steps: Optimizer steps of every training stage (`cpt.max_steps`, ...), for quick runs.
                0: each stage's own from the config.
        """
        redact_stored_overrides()
        return run_stages(resolve_config(config_path, overrides, base_model, max_steps, workspace), [stage])

    return run_one_stage


ingest_flow = stage_flow("ingest")
filter_flow = stage_flow("filter")
score_flow = stage_flow("score")
split_flow = stage_flow("split")
cpt_flow = stage_flow("cpt")
sft_flow = stage_flow("sft")
rl_flow = stage_flow("rl")
evaluate_flow = stage_flow("evaluate")
fidelity_flow = stage_flow("fidelity")
export_flow = stage_flow("export")
