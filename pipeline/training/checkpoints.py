"""Trainer checkpoints a training stage can always resume from (issue 8.1).

transformers' Trainer writes `checkpoint-<step>` in place, file after file, and
`get_last_checkpoint` returns the highest-numbered folder whatever it holds: a process killed
during a save left a folder with only `config.json`, and every rerun then failed on it. Two
defences, each enough alone for a kill:

- `AtomicCheckpoints`, a Trainer mixin: the Trainer writes each checkpoint into
  `<output_dir>/staging/checkpoint-<step>`, and once every process has written its part the main
  process renames it to `<output_dir>/checkpoint-<step>` (pipeline/store/atomic_files.py). A
  `checkpoint-<step>` folder therefore exists whole or not at all.
- `resume_checkpoint`: the newest checkpoint that is *complete* (see `missing_parts`); anything
  else found there (a folder written before this mixin existed, or by another tool, a leftover of
  `staging/`) is moved under `<output_dir>/incomplete/` with a warning naming it, kept for
  inspection, neither deleted nor fatal.

Composition with other Trainer subclasses: put the mixin first, `class StageTrainer(AtomicCheckpoints,
Trainer)` or `(AtomicCheckpoints, SomeTrainerSubclass)`; it overrides only `_save_checkpoint` and
`_get_output_dir` and calls `super()` for both.
"""

import json
import logging
import os
import re
import shutil
import struct
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.store.atomic_files import publish_folder

if TYPE_CHECKING:  # the mixin's base for the type checker only: it is mixed into a Trainer (below)
    from transformers import Trainer as _MixedInto
else:
    _MixedInto = object

log = logging.getLogger(__name__)

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
STAGING = "staging"
INCOMPLETE = "incomplete"
TRAINER_STATE = "trainer_state.json"


def _safetensors_whole(path: Path) -> bool:
    """The header parses and the file is as long as the tensors it declares (a cut file is shorter)."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        return path.stat().st_size == 8 + length + end
    except (OSError, ValueError, struct.error, KeyError, TypeError):
        return False


def _torch_file_whole(path: Path) -> bool:
    """torch.save writes a zip archive whose directory sits at the end: a cut file has none."""
    return zipfile.is_zipfile(path)


def _json_whole(path: Path) -> bool:
    try:
        json.loads(path.read_bytes())
        return True
    except (OSError, ValueError):
        return False


def _whole(path: Path) -> bool:
    if path.is_dir():  # DeepSpeed's global_step*/ and FSDP's sharded folders: whole if not empty
        return any(path.iterdir())
    if path.suffix == ".safetensors":
        return _safetensors_whole(path)
    if path.suffix == ".json":
        return _json_whole(path)
    return _torch_file_whole(path)


def _shards_whole(index: Path) -> bool:
    """A sharded save: the index parses and every shard it names is whole."""
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, AttributeError):
        return False
    return all(_whole(index.parent / shard) for shard in shards)


# What the Trainer reads back to resume (Trainer._load_from_checkpoint, _load_optimizer_and_scheduler,
# _load_rng_state, TrainerState.load_from_json), each part as the file patterns that can hold it:
# plain, sharded, PEFT adapter, DeepSpeed (global_step*/) and FSDP layouts. A part is present when
# one pattern matches and every file it matches is whole.
PARTS: dict[str, tuple[str, ...]] = {
    "weights": (
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
        "adapter_model.safetensors",
        "adapter_model.bin",
        "global_step*/*model_states.pt",
        "pytorch_model_fsdp*",
    ),
    "optimizer": ("optimizer.pt", "optimizer.bin", "global_step*/*optim_states.pt", "optimizer_0"),
    "scheduler": ("scheduler.pt",),
    "rng state": ("rng_state.pth", "rng_state_*.pth"),
    "trainer state": (TRAINER_STATE,),
}


def _part_present(folder: Path, patterns: tuple[str, ...]) -> bool:
    for pattern in patterns:
        matches = sorted(folder.glob(pattern))
        if matches:
            return all(_shards_whole(m) if m.name.endswith(".index.json") else _whole(m) for m in matches)
    return False


def missing_parts(folder: Path) -> list[str]:
    """The parts of a checkpoint the Trainer needs to resume that `folder` lacks or holds cut short:
    weights, optimizer, scheduler, RNG state, trainer state. Empty means complete.

    DeepSpeed keeps the scheduler inside its own files, so no `scheduler.pt` is expected beside a
    `global_step*/` folder."""
    folder = Path(folder)
    deepspeed = any(p.is_dir() for p in folder.glob("global_step*"))
    return [
        part
        for part, patterns in PARTS.items()
        if not (part == "scheduler" and deepspeed) and not _part_present(folder, patterns)
    ]


def set_aside(folder: Path, reason: str) -> Path:
    """Move `folder` to `<its trainer folder>/incomplete/<name>-<UTC time>` and warn, naming both.

    Outside the `checkpoint-*` names, so neither resumption nor the Trainer's rotation of old
    checkpoints (which globs `checkpoint-*` and deletes) ever touches it again."""
    folder = Path(folder)
    trainer_dir = folder.parent.parent if folder.parent.name == STAGING else folder.parent
    target = trainer_dir / INCOMPLETE / f"{folder.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    suffix = 0
    while target.exists():
        suffix += 1
        target = target.with_name(f"{target.name.rsplit('.', 1)[0]}.{suffix}")
    target.parent.mkdir(parents=True, exist_ok=True)
    folder.rename(target)
    log.warning("set aside %s (%s): moved to %s; training resumes without it", folder, reason, target)
    return target


def _step(folder: Path) -> int:
    matched = CHECKPOINT.match(folder.name)
    assert matched is not None, folder  # callers pass checkpoint-<step> folders only
    return int(matched.group(1))


def newest_complete_checkpoint(trainer_dir: Path) -> Path | None:
    """The highest-numbered complete `checkpoint-<step>` under `trainer_dir`, after setting aside
    every incomplete one and every leftover of `staging/`. Run it in one process only (it moves
    folders): `resume_checkpoint` does that for a distributed run."""
    trainer_dir = Path(trainer_dir)
    if not trainer_dir.is_dir():
        return None
    staging = trainer_dir / STAGING
    for leftover in sorted(staging.iterdir()) if staging.is_dir() else []:
        set_aside(leftover, "a checkpoint write that did not finish")
    checkpoints = sorted(
        (p for p in trainer_dir.iterdir() if p.is_dir() and CHECKPOINT.match(p.name)), key=_step, reverse=True
    )
    newest = None
    for checkpoint in checkpoints:
        missing = missing_parts(checkpoint)
        if missing:
            set_aside(checkpoint, f"missing or cut short: {', '.join(missing)}")
        elif newest is None:
            newest = checkpoint
    return newest


def resume_checkpoint(trainer_dir: Path) -> Path | None:
    """The checkpoint to resume from, the same in every process; call it from all of them at once.

    The main process checks and sets aside; the others wait for it, then take the newest folder
    left, which is complete. Needs accelerate's state initialised first (the stage's
    `PartialState(cpu=...)`), as the Trainer itself does."""
    from accelerate import PartialState

    state = PartialState()
    newest = newest_complete_checkpoint(trainer_dir) if state.is_main_process else None
    state.wait_for_everyone()
    if not state.is_main_process and trainer_dir.is_dir():
        found = [p for p in trainer_dir.iterdir() if p.is_dir() and CHECKPOINT.match(p.name)]
        newest = max(found, key=_step, default=None)
    return newest


def checkpoint_step(folder: Path | None) -> int | None:
    """The global step a `checkpoint-<step>` folder was saved at; None for no folder."""
    return _step(Path(folder)) if folder is not None else None


def finish_without_training(trainer, checkpoint: Path) -> None:
    """Make `trainer` what `train` would have left had it stopped at `checkpoint`, the run's last step.

    Resumed from a checkpoint already at `max_steps`, transformers' loop still runs one optimizer
    step (it checks the limit after a step, not before): a kill between the last checkpoint and the
    stage's completion file would make every rerun train one step more. So the stage does not call
    `train` then: the checkpoint's weights (`_load_from_checkpoint`: plain, sharded and adapter
    layouts) and its trainer state (global step, log history) are loaded instead, and the stage
    goes on to evaluate and save as after training."""
    from transformers import TrainerState

    trainer._load_from_checkpoint(str(checkpoint))
    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / TRAINER_STATE))


class AtomicCheckpoints(_MixedInto):
    """Trainer mixin: each checkpoint is written under `staging/` and renamed into place when whole.

    The Trainer's own `_save_checkpoint` does all the writing (weights, optimizer, scheduler,
    scaler, RNG, trainer state, on every process as it needs); this only points it at the staging
    folder through `_get_output_dir`, then publishes the result and rotates old checkpoints in the
    real folder, where the Trainer's own rotation (run inside the staging folder) never looks.
    Assumes the processes share the output filesystem, as the stages already do for their data.
    """

    _staging_checkpoint = False

    def _get_output_dir(self, trial):
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING) if self._staging_checkpoint else run_dir

    def _save_checkpoint(self, model, trial):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

        run_dir = Path(self._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staged, final = run_dir / STAGING / name, run_dir / name
        if self.is_world_process_zero() and staged.exists():
            set_aside(staged, "a checkpoint write that did not finish")
        self.accelerator.wait_for_everyone()
        self._staging_checkpoint = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_checkpoint = False
        self.accelerator.wait_for_everyone()  # every process's part (RNG state, shards) is on disk
        if self.is_world_process_zero():
            self._point_best_checkpoint_at(run_dir, staged)
            if final.exists():
                set_aside(final, f"replaced by the new save of step {self.state.global_step}")
            publish_folder(staged, final)
            rotate_checkpoints(
                output_dir=str(run_dir),
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        self.accelerator.wait_for_everyone()

    def _point_best_checkpoint_at(self, run_dir: Path, staged: Path) -> None:
        """The Trainer recorded the best checkpoint (when it tracks one) under the staging folder;
        point it at the published name, in memory and in the trainer state about to be published."""
        best = self.state.best_model_checkpoint
        if best and Path(best).parent == run_dir / STAGING:
            self.state.best_model_checkpoint = str(run_dir / Path(best).name)
            self.state.save_to_json(str(staged / TRAINER_STATE))


def save_model_atomic(trainer, model_dir: Path) -> None:
    """`trainer.save_model` into `<model_dir>.partial`, published as `model_dir` once whole: the
    stage's output folder counts as done by its presence (stage_runs skips a run whose output exists).
    Every process calls it (ZeRO-3 and FSDP gather the weights collectively)."""
    model_dir = Path(model_dir)
    staged = model_dir.with_name(f"{model_dir.name}.partial")
    if trainer.is_world_process_zero():
        shutil.rmtree(staged, ignore_errors=True)  # a save cut short by a kill: stale files would stay
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staged))
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        publish_folder(staged, model_dir)
    trainer.accelerator.wait_for_everyone()
