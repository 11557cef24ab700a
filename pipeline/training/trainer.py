"""One training run with transformers' Trainer, shared by the training stages (CPT now; SFT and RL next).

A stage writes its token sequences to Parquet files (`input_ids` + `labels`, -100 where nothing
is learnt), then calls `train(config, job)` with a `TrainingJob` naming those files, its output
folders, its settings (a `TrainingSettings` section), the label of its progress bar and the stage
name its fault hook answers to. `train`:
1. loads the tokenizer and the base model (ChatML tokens added where missing) with the attention
   path packed rows need (`packed_attention_implementation`), and makes its forward return the
   summed token loss instead of logits (pipeline/training/token_loss.py);
2. packs the sequences into rows of `max_length` tokens (pipeline/training/packing.py), each row within
   one stratum under `row_order: stratified`, and trains them in the order `row_order` says
   (pipeline/training/row_order.py); the batch is `tokens_per_step` tokens, `micro_batch_rows` rows per
   device per forward pass;
3. resumes from the newest complete checkpoint in `job.trainer_dir` if there is one (checkpoints
   appear whole or not at all: pipeline/training/checkpoints.py); one already at `max_steps` is
   loaded without another step (`finish_without_training`);
4. measures the held-out cross-entropy at step 0 (a fresh run only: a resumed run finds it in the
   checkpoint's log history; and not at all when the run that trained the base model measured these
   very sequences after its last step, `heldout_ce.json` beside its model: SFT's held-out windows are
   CPT's, so SFT's "before" is CPT's "after"), trains `max_steps` optimizer steps, measures it again;
5. saves the model and tokenizer to `job.model_dir`, with `<|im_end|>` among the end-of-sequence ids
   so generation stops where a training turn ends; returns a `TrainingOutcome`.

Training loss: the mean over every labelled token of an optimizer step (`PackedTrainer.compute_loss`
says how). Held-out cross-entropy: the mean, over every labelled token of the eval files, of the
next-token cross-entropy; per token, not per batch, so long observations weigh by their length.
Each process reduces its rows to loss sums and label counts before the Trainer gathers them, so
no logits cross processes (nor exist in full anywhere).

Trainer settings the run fixes itself: cosine schedule, `save_total_limit` 2, logging every 1% of
the steps, no evaluation during training (step 0 and the end only), CPU when there is no
accelerator, bf16 autocast as the stage's `mixed_precision` says, else `model.mixed_precision` (auto: on a
GPU that supports it).
"""

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config.training import TrainingSettings
from pipeline.orchestration.faults import maybe_fail
from pipeline.progress import progress_bar
from pipeline.store.atomic_files import write_text_atomic
from pipeline.training.activation_checkpointing import activation_checkpointing_arguments
from pipeline.training.checkpoints import (
    AtomicCheckpoints,
    checkpoint_step,
    finish_without_training,
    resume_checkpoint,
    save_model_atomic,
)
from pipeline.training.divergence import refuse_diverged_weights
from pipeline.training.mask_epochs import mask_epochs_callback
from pipeline.training.models import (
    bf16_mixed_precision,
    ensure_chatml_tokens,
    load_causal_lm,
    load_tokenizer,
    mixed_precision_choice,
    packed_attention_implementation,
)
from pipeline.training.packing import PackedCollator, PackedSequences
from pipeline.training.row_order import StratifiedRowSampler
from pipeline.training.sequences import ParquetSequences
from pipeline.training.tiny_model import IM_END
from pipeline.training.token_loss import install_token_loss, resolve_loss_implementation

log = logging.getLogger(__name__)

# Beside a run's model folder: the held-out cross-entropy its model reached, and which sequences it is of.
HELDOUT_CE_FILE = "heldout_ce.json"


@dataclass(slots=True)
class TrainingJob:
    """What a stage asks of one training run."""

    stage: str  # the fault hook's stage name (`orchestration.fail_stage`)
    progress_label: str
    base_ref: str  # model name or folder training starts from
    train_files: Sequence[Path]
    eval_files: Sequence[Path]
    trainer_dir: Path  # checkpoints, the resume point
    model_dir: Path  # the final HF folder (model + tokenizer)
    settings: TrainingSettings
    # The rows the held-out sequences are packed into (None: `settings.max_length`). SFT's are CPT's windows,
    # which may be longer than the rows SFT trains on.
    eval_max_length: int | None = None
    # Extra Trainer callbacks (a benchmark's timer).
    callbacks: Sequence[Any] = field(default_factory=tuple)


@dataclass(slots=True)
class TrainingOutcome:
    eval_ce_before: float | None
    eval_ce_after: float | None
    # Counted by the evaluation itself, gathered from every process: equals the eval files' label
    # count unless a sample was dropped or scored twice.
    eval_tokens_scored: int | None
    global_step: int
    epochs: float  # epochs over the packed rows, as the Trainer counts them
    mask_epochs: list[int]  # the epochs this run drew keep-ratio masks for (a resumed run: from its own)
    first_step_this_run: int | None
    resumed_from_step: int | None
    tokens_seen: int  # non-padding tokens trained on, every process together
    loss_curve: list[tuple[int, float]]
    is_main_process: bool
    attention: str  # the attention implementation packed rows ran with
    loss: str  # liger or chunked
    tokens_per_step: int  # packed row tokens per optimizer step reached (tokens_per_step, rounded)


def load_tokenizer_with_chatml(config, base_ref: str):
    """The base model's tokenizer and the ChatML tokens that had to be added to it."""
    tokenizer = load_tokenizer(base_ref, config.model.trust_remote_code)
    return tokenizer, ensure_chatml_tokens(tokenizer)


def observation_cross_entropy(prediction) -> dict[str, float]:
    """Held-out cross-entropy per token: summed token losses over the number of labelled tokens.
    `PackedTrainer.prediction_step` hands over each row's loss sum as the "prediction" and its label
    count as the "label", gathered from every process."""
    count = int(prediction.label_ids.sum())
    return {"observation_ce": float(prediction.predictions.sum()) / count, "observation_tokens": count}


def _sequences_digest(sequences: ParquetSequences) -> str:
    """What a held-out cross-entropy is of: the sequences' tokens, labels and mask spans."""
    import hashlib

    payload = json.dumps(sequences.table.to_pydict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def _measured_by_base(base_ref: str, digest: str) -> float | None:
    """The held-out cross-entropy the base model's own run measured on the same sequences, if it did."""
    record = Path(base_ref).parent / HELDOUT_CE_FILE
    if not Path(base_ref).is_dir() or not record.is_file():
        return None
    measured = json.loads(record.read_text())
    return measured["observation_ce"] if measured.get("eval_sequences") == digest else None


def _packed_trainer_class():
    import torch
    from transformers import Trainer

    class PackedTrainer(AtomicCheckpoints, Trainer):
        """transformers' Trainer on packed rows with the model's forward from `install_token_loss`, and
        checkpoints that appear whole or not at all (pipeline/training/checkpoints.py)."""

        # compute_loss already divides by the whole step's label count (see there).
        loss_is_scaled_for_ga = True

        def __init__(self, *args, row_order: str = "shuffled", **kwargs):
            self.row_order = row_order
            super().__init__(*args, **kwargs)
            # The Trainer counts a step's labels (`shift_labels` != -100, summed over its micro-batches and
            # gathered from every device) only for models it believes normalise by that count; ours does.
            self.model_accepts_loss_kwargs = True

        def _get_train_sampler(self, train_dataset=None):
            dataset = self.train_dataset if train_dataset is None else train_dataset
            if self.row_order == "stratified" and isinstance(dataset, PackedSequences):
                seed = self.args.seed if self.args.data_seed is None else self.args.data_seed
                return StratifiedRowSampler(dataset.row_strata, seed)
            return super()._get_train_sampler(train_dataset)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            # The loss of an optimizer step is the mean over every labelled token of the step: all its
            # micro-batches, on all devices. Not a mean per micro-batch: keep ratios (0.05 to 1) and
            # sequence lengths make the number of labelled tokens vary a lot between micro-batches, and a
            # per-batch mean would make a token of a sparse batch weigh more than one of a dense batch. So
            # each micro-batch contributes its summed token losses divided by the step's label count; DDP
            # and FSDP then average gradients over the devices, which the device count undoes.
            if num_items_in_batch is None:  # outside a training step: this batch alone
                loss = outputs["loss_sum"] / outputs["label_count"].clamp(min=1)
            else:
                loss = outputs["loss_sum"] / num_items_in_batch
                if self.args.average_tokens_across_devices and self.args.world_size > 1:
                    loss = loss * self.args.world_size
            return (loss, outputs) if return_outputs else loss

        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            inputs = self._prepare_inputs(inputs)
            with torch.no_grad(), self.compute_loss_context_manager():
                outputs = model(**inputs, per_row=True)
            sums, counts = outputs["row_loss_sums"], outputs["row_label_counts"]
            return (sums.sum() / counts.sum().clamp(min=1)).detach(), sums.detach(), counts.detach()

    return PackedTrainer


def run_callbacks(config, stage: str, advance: Callable[[int], None]):
    """The callbacks every training stage's Trainer gets (CPT and SFT here, RL's GRPOTrainer too): the
    step a run began at, steps to the progress bar, and the fault drill. Returns (run start, callbacks)."""
    from transformers import TrainerCallback

    class RunStart(TrainerCallback):
        """Records the global step this process's training began at (0, or the resumed checkpoint's)."""

        first_step: int | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            if self.first_step is None:
                self.first_step = state.global_step

    class Progress(TrainerCallback):
        """Optimizer steps to the project's progress bar (and through it to the Prefect UI)."""

        def on_step_end(self, args, state, control, **kwargs):
            advance(1)

    class FaultHook(TrainerCallback):
        """`orchestration.fail_stage: <stage>` fails once, when the first checkpoint is on disk (on_save
        runs after the save), so the rerun must resume from it."""

        def on_save(self, args, state, control, **kwargs):
            maybe_fail(config, stage, f"after the checkpoint of step {state.global_step}")

    start = RunStart()
    return start, [start, Progress(), FaultHook()]


def _callbacks(config, job: TrainingJob, advance: Callable[[int], None], train_rows: PackedSequences):
    start, callbacks = run_callbacks(config, job.stage, advance)
    # Packed rows forward `set_epoch` to the sequences, which draw that epoch's keep-ratio masks.
    masks = mask_epochs_callback(train_rows)
    return start, masks, [*callbacks, masks, *job.callbacks]


def accumulation_steps(settings: TrainingSettings, devices: int) -> int:
    """Micro-batches per optimizer step that bring the step closest to `tokens_per_step` tokens."""
    return max(1, round(settings.tokens_per_step / (settings.micro_batch_rows * settings.max_length * devices)))


def _training_arguments(config, job: TrainingJob, fresh: bool, has_eval: bool, accumulation: int):
    import torch
    from transformers import TrainingArguments

    settings = job.settings
    return TrainingArguments(
        **activation_checkpointing_arguments(TrainingArguments, settings.gradient_checkpointing),
        output_dir=str(job.trainer_dir),
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.micro_batch_rows,
        per_device_eval_batch_size=settings.micro_batch_rows,
        gradient_accumulation_steps=accumulation,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=settings.warmup_fraction,
        save_strategy="steps",
        save_steps=settings.save_steps,
        save_total_limit=2,
        logging_steps=max(1, settings.max_steps // 100),
        eval_strategy="no",
        # Step-0 cross-entropy, once: a resumed run finds it in the checkpoint's log history.
        eval_on_start=fresh and has_eval,
        seed=settings.seed,
        data_seed=settings.seed,
        use_cpu=not torch.accelerator.is_available(),
        bf16=bf16_mixed_precision(mixed_precision_choice(config, settings), config.model.dtype),
        include_num_input_tokens_seen="non_padding",
        remove_unused_columns=False,
        report_to="none",
        disable_tqdm=True,  # pipeline.progress draws the bar, and tells the Prefect UI
    )


def train(config, job: TrainingJob) -> TrainingOutcome:
    """Train (or resume) the run `job` describes and save its model; see the module docstring."""
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-save shard bars; pipeline.progress reports the steps

    settings = job.settings
    tokenizer, added = load_tokenizer_with_chatml(config, job.base_ref)
    resume = resume_checkpoint(job.trainer_dir)
    resumed_from = checkpoint_step(resume)
    stratified = settings.row_order == "stratified"
    train_rows = PackedSequences(
        ParquetSequences(list(job.train_files)), settings.max_length, settings.seed, by_stratum=stratified
    )
    eval_width = job.eval_max_length or settings.max_length
    held_out = PackedSequences(ParquetSequences(list(job.eval_files)), eval_width, settings.seed)
    devices = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun / accelerate launch
    accumulation = accumulation_steps(settings, devices)
    digest = _sequences_digest(held_out.sequences) if len(held_out) else None
    known_before = _measured_by_base(job.base_ref, digest) if digest else None
    # Built before the model: under `accelerate launch` with ZeRO-3 it switches from_pretrained to
    # sharded loading.
    args = _training_arguments(
        config,
        job,
        fresh=resume is None,
        has_eval=len(held_out) > 0 and known_before is None,
        accumulation=accumulation,
    )
    attention = packed_attention_implementation()
    loss = resolve_loss_implementation(settings.loss)
    model = load_causal_lm(job.base_ref, config.model.dtype, config.model.trust_remote_code, attention)
    if added:
        model.resize_token_embeddings(len(tokenizer))
    install_token_loss(model, loss)
    tokens_per_step = settings.micro_batch_rows * settings.max_length * devices * accumulation
    log.info(
        "%s: %d packed rows of %d tokens, attention %s, loss %s, %d micro-batch(es) of %d row(s) x %d device(s) "
        "= %d tokens per step",
        job.stage,
        len(train_rows),
        settings.max_length,
        attention,
        loss,
        accumulation,
        settings.micro_batch_rows,
        devices,
        tokens_per_step,
    )
    with progress_bar(job.progress_label, total=settings.max_steps, done=resumed_from or 0) as advance:
        start, masks, callbacks = _callbacks(config, job, advance, train_rows)
        trainer = _packed_trainer_class()(
            row_order=settings.row_order,
            model=model,
            args=args,
            train_dataset=train_rows,
            eval_dataset=held_out if len(held_out) else None,
            data_collator=PackedCollator(
                tokenizer.pad_token_id, settings.max_length, eval_width if eval_width > settings.max_length else None
            ),
            processing_class=tokenizer,
            compute_metrics=observation_cross_entropy,
            callbacks=callbacks,
        )
        # The loss history lands in the stage's metrics and loss curve; printing each log dict to
        # stdout would bury the stage's own report.
        trainer.remove_callback(PrinterCallback)
        if resumed_from is not None and resumed_from >= settings.max_steps:
            finish_without_training(trainer, resume)  # type: ignore[arg-type]  # resume: set with resumed_from. Killed after its last checkpoint: nothing left to train
        else:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    after = trainer.evaluate() if len(held_out) else {}
    # Generation must stop where observations end in training.
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    model.generation_config.eos_token_id = eos if im_end in eos else eos + [im_end]
    refuse_diverged_weights(trainer, job.stage, settings.learning_rate)
    save_model_atomic(trainer, job.model_dir)
    if after and trainer.is_world_process_zero():
        write_text_atomic(
            job.model_dir.parent / HELDOUT_CE_FILE,
            json.dumps({"eval_sequences": digest, "observation_ce": after["eval_observation_ce"]}) + "\n",
        )

    history = trainer.state.log_history
    before = (
        known_before
        if known_before is not None
        else next((h["eval_observation_ce"] for h in history if "eval_observation_ce" in h), None)
    )
    return TrainingOutcome(
        eval_ce_before=before,
        eval_ce_after=after.get("eval_observation_ce"),
        eval_tokens_scored=after.get("eval_observation_tokens"),
        global_step=trainer.state.global_step,
        epochs=trainer.state.epoch,
        mask_epochs=masks.epochs,
        first_step_this_run=start.first_step,
        resumed_from_step=resumed_from,
        tokens_seen=trainer.state.num_input_tokens_seen,
        loss_curve=[(h["step"], h["loss"]) for h in history if "loss" in h],
        is_main_process=trainer.is_world_process_zero(),
        attention=attention,
        loss=loss,
        tokens_per_step=tokens_per_step,
    )
