"""The run folder of a training stage (cpt, sft, rl): its plan, how the folder is claimed, and how its
model is registered.

Each training stage is `prepare` (data side: reads the store, writes files), `train` (any process,
files only; flows/gpu_stage.py may run it on a GPU pool) and `record` (data side again). The plan is
what crosses that boundary: the main process decides it, broadcasts it to the other training
processes, and writes it as JSON for a GPU worker elsewhere. A stage's own plan subclasses `RunPlan`
with what only it needs.
"""

import fcntl
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UserFixableError
from pipeline.orchestration.fingerprint import fingerprint_inputs, stage_fingerprint
from pipeline.store.atomic_files import write_text_atomic

PLAN_FILE = "plan.json"
FINGERPRINT_FILE = "fingerprint.json"
# The answer cache of a run's held-out predictions (SFT, RL), made where training runs, never in the store.
HELDOUT_CACHE = "heldout_cache.duckdb"


@dataclass(slots=True)
class RunPlan:
    output_dir: Path
    snapshot_dir: Path
    fingerprint: str
    base_ref: str
    done: bool
    # workspace.keep_resume_checkpoints: what `release_resume_checkpoints` does once the run is complete.
    keep_resume_checkpoints: bool = False

    @property
    def sequences_dir(self) -> Path:
        return self.output_dir / "sequences"

    @property
    def trainer_dir(self) -> Path:
        return self.output_dir / "trainer"

    @property
    def model_dir(self) -> Path:
        return self.output_dir / "model"

    def write(self) -> Path:
        """The plan as JSON in the run's folder, for a training process elsewhere (a GPU worker)."""
        path = self.output_dir / PLAN_FILE
        fields = {name: str(value) if isinstance(value, Path) else value for name, value in asdict(self).items()}
        write_text_atomic(path, json.dumps(fields, indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def read(cls, path: Path) -> "RunPlan":
        fields = json.loads(Path(path).read_text())
        return cls(**{**fields, "output_dir": Path(fields["output_dir"]), "snapshot_dir": Path(fields["snapshot_dir"])})


def claim_run_folder(config, store, stage: str, configured: str | Path | None) -> tuple[Path, str]:
    """(the run's folder, the stage's fingerprint). The folder is `<runs>/<stage>/<fingerprint>` unless
    the stage's `output_dir` names one; it records the fingerprint and its inputs, so a configured
    folder that holds another run's files is refused rather than resumed into."""
    fingerprint = stage_fingerprint(config, store, stage)
    output_dir = Path(configured or config.workspace.runs_dir / stage / fingerprint).expanduser().resolve()
    recorded = output_dir / FINGERPRINT_FILE
    if recorded.is_file() and (previous := json.loads(recorded.read_text())["fingerprint"]) != fingerprint:
        raise UserFixableError(
            f"{stage}.output_dir {output_dir} holds a run with other inputs (fingerprint {previous}, now {fingerprint}): "
            "remove it or choose another folder"
        )
    _refuse_lost_model(stage, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _hold_run_folder(output_dir)
    inputs = fingerprint_inputs(config, store, stage)
    # The sections the run reads, in full (the fingerprint holds their hashes only): the model card quotes the
    # settings a run trained with, whatever the config says when `export` runs.
    settings = {name: getattr(config, name).model_dump(mode="json") for name in inputs["config"]}
    write_text_atomic(
        recorded,
        json.dumps({"fingerprint": fingerprint, "inputs": inputs, "settings": settings}, indent=2, sort_keys=True)
        + "\n",
    )
    return output_dir, fingerprint


# Files a training run writes once its model is saved (`trained.json`: SFT's and RL's training done, their
# validation next; `metrics.json`: the run complete). Either one present means the run counts its model as there.
TRAINED_MARKERS = ("trained.json", "metrics.json")


def _refuse_lost_model(stage: str, output_dir: Path) -> None:
    """A run that finished, whose `model/` was then deleted or moved: `cpt` answered "already trained" and registered
    the missing folder again, and `sft` answered "none is registered: run `simulacra cpt` first", each sending the user
    to the other. Its validation answers and metrics belong to the lost weights, so the run is not trained again
    into the same folder behind them: the line names the folder to remove (or the model to put back)."""
    model_dir = output_dir / "model"
    if not any((output_dir / marker).is_file() for marker in TRAINED_MARKERS):
        return
    if (model_dir / "config.json").is_file() and any(model_dir.glob("*.safetensors")):
        return
    raise UserFixableError(
        f"{stage}'s run {output_dir} finished, but its model folder {model_dir} is gone or incomplete: put it back, "
        f"or remove {output_dir} and rerun `simulacra {stage}` to train it again"
    )


# The run folders this process holds (their lock file's descriptor), from claim until the run is recorded.
_HELD: dict[Path, int] = {}
RUN_LOCK = "run.lock"


def _hold_run_folder(output_dir: Path) -> None:
    """Take the run folder for this process, or refuse in one line: two `simulacra cpt` (two clicks on a
    deployment in the UI) trained the same run into the same folder at once, computing it twice and racing on its
    checkpoints. An exclusive `flock` on `run.lock`, held until `release_run_folder`; the system lets it go when the
    process ends however it ends, so a killed run leaves no stale lock. Not waited for: the waiting process would
    hold the store, which the other one needs to record its run."""
    if output_dir in _HELD:
        return
    handle = os.open(output_dir / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(handle, 64).decode(errors="replace").strip() or "unknown"
        os.close(handle)
        raise UserFixableError(
            f"{output_dir} is being trained by another process (pid {holder}): let it finish, then rerun "
            "(its model is then reused, not trained again), or stop it"
        ) from None
    os.ftruncate(handle, 0)
    os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
    _HELD[output_dir] = handle


def release_run_folder(output_dir: Path) -> None:
    """Let another process claim the run folder: its run is recorded."""
    handle = _HELD.pop(output_dir, None)
    if handle is not None:
        fcntl.flock(handle, fcntl.LOCK_UN)
        os.close(handle)


def model_words(ref: str) -> str:
    """A model a stage started from, as its summary line names it: `cpt run 726c0c7f` for a training stage's checkpoint
    (`runs/<stage>/<fingerprint>/model`), a local folder by its name, a hub id as given. SFT and RL start from the
    newest registered checkpoint of the stage before, which after an experiment need not be the run the config
    describes; the summary makes the lineage visible."""
    path = Path(ref)
    if path.name == "model" and path.parent.parent.parent.name == "runs":
        return f"{path.parent.parent.name} run {path.parent.name[:8]}"
    return path.name if path.is_dir() else ref


def register_checkpoint(store, stage: str, plan: RunPlan, metrics: dict[str, Any]) -> None:
    """The run's model in `checkpoints`, replacing an earlier registration of the same run."""
    checkpoint_id = f"{stage}-{plan.fingerprint}"
    with store.transaction() as tx:
        tx.execute("DELETE FROM checkpoints WHERE checkpoint_id = ?", [checkpoint_id])
        tx.execute(
            "INSERT INTO checkpoints (checkpoint_id, stage, fingerprint, path, base_model, created_at, metrics) "
            "VALUES (?, ?, ?, ?, ?, now(), ?)",
            [checkpoint_id, stage, plan.fingerprint, str(plan.model_dir), plan.base_ref, json.dumps(metrics)],
        )


def registered_checkpoint(store, stage: str) -> str | None:
    """The newest checkpoint of `stage` in the `checkpoints` table whose folder still holds a model."""
    rows = store.rows("SELECT path FROM checkpoints WHERE stage = ? ORDER BY created_at DESC, checkpoint_id", [stage])
    return next((row["path"] for row in rows if (Path(row["path"]) / "config.json").is_file()), None)


def newest_registered_path(store, stage: str) -> str | None:
    """The newest registration of `stage`, whether or not its folder is still there."""
    return store.scalar(
        "SELECT path FROM checkpoints WHERE stage = ? ORDER BY created_at DESC, checkpoint_id LIMIT 1", [stage]
    )


def run_across_processes(stage: str, prepare, train, record, config, store):
    """A training stage's three steps in this process and, under `accelerate launch` / torchrun, its
    peers: the main process prepares and records, every process trains from the plan's files."""
    import torch
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    from pipeline.stage import StageResult

    # cpu=True where there is no accelerator, as the Trainer will: processes started by torchrun on
    # CPUs then form one gloo group instead of each believing it is the main process.
    state = PartialState(cpu=not torch.accelerator.is_available())
    plan = None
    if state.is_main_process:
        plan = prepare(config, store)
        store.close()  # training never holds the store (STACK.md: one process per DuckDB file)
    plan = broadcast_object_list([plan])[0]
    state.wait_for_everyone()
    train(config, plan)
    if not state.is_main_process:
        return StageResult(stage=stage, output_path=plan.model_dir, summary="non-main training process")
    return record(store, plan)


def launch_from_command_line(stage: str, run, description: str, argv: list[str] | None = None) -> None:
    """`python -m stages.<stage> --config FILE [--set <stage>.max_steps=100 ...]`, also under
    `accelerate launch`. The main process records the run in `stage_runs` like a flow's run, so
    `simulacra run` and the flows then skip it."""
    import argparse

    import torch
    from accelerate import PartialState

    from pipeline.config import load_config, parse_override
    from pipeline.store import stage_runs
    from pipeline.store.database import open_store

    parser = argparse.ArgumentParser(prog=f"python -m stages.{stage}", description=description)
    parser.add_argument("--config", type=Path, default=None, help="Simulacra YAML config (defaults when omitted).")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help=f"Override, e.g. {stage}.max_steps=100."
    )
    options = parser.parse_args(argv)
    config = load_config(options.config, [parse_override(text) for text in options.set])
    store = open_store(config)  # opens lazily: processes other than the main one never touch the file
    try:
        if PartialState(cpu=not torch.accelerator.is_available()).is_main_process:
            fingerprint = stage_fingerprint(config, store, stage)
            result = stage_runs.execute(store, stage, fingerprint, lambda: run(config, store))
        else:
            result = run(config, store)
    finally:
        store.close()
    print(result.summary)


def complete_run(store, stage: str, plan: RunPlan, metrics: dict[str, Any], metrics_file: Path) -> None:
    """Register the run's model, then write its metrics: written last, atomically, their presence marks
    the run complete, so a rerun returns instead of retraining (a run found complete registers again).
    Then the resume checkpoints go, unless the workspace keeps them."""
    register_checkpoint(store, stage, plan, metrics)
    if not metrics_file.is_file():
        write_text_atomic(metrics_file, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    release_resume_checkpoints(plan, metrics_file)
    release_run_folder(plan.output_dir)


def release_resume_checkpoints(plan: RunPlan, metrics_file: Path) -> None:
    """Delete the run's resume checkpoints (`trainer/checkpoint-*`: weights, optimizer state, RNG) once the
    run is complete: only an unfinished run resumes from them. Called after the metrics file exists and
    the model is registered, so a kill at any moment leaves a complete run or one that resumes. A cut
    checkpoint set aside in `trainer/incomplete/` stays: the warning that named it said it is kept."""
    import shutil

    if plan.keep_resume_checkpoints or not metrics_file.is_file():
        return
    for checkpoint in sorted(plan.trainer_dir.glob("checkpoint-*")):
        shutil.rmtree(checkpoint, ignore_errors=True)
