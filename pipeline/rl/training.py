"""One GSPO run with TRL's GRPOTrainer: the settings, the dataset, resume, the saved model.

GSPO in TRL 1.16 (STACK.md): `importance_sampling_level="sequence"` (the ratio is the geometric mean
of the token ratios of a whole completion) with `loss_type="grpo"`, since the default "dapo" and
"dr_grpo" weight each sequence by its length when combined with sequence-level ratios (TRL issue
#3823); `beta` 0 and GSPO's clipping range 3e-4 / 4e-4 by default (pipeline/config/rl.py).

Settings the run fixes itself: a constant learning rate after the warm-up (RL has no data epoch
for a decay to follow), `save_total_limit` 2, one log entry per optimizer step (the per-step reward
curve), each reward standardised within its group before the 9:1 weights apply
(`multi_objective_aggregation="normalize_then_sum"` by default, issue 17 item 6: a reward that ties in
a group adds no contrast, the other keeps its weight; tests/test_rl_advantages.py), CPU when there is no accelerator, bf16 autocast
as `rl.mixed_precision` says, else `model.mixed_precision`. Checkpoints go through `AtomicCheckpoints` (pipeline/training/checkpoints.py): they
appear whole or not at all, and a rerun resumes from the newest complete one. TRL's fused LM head projects the
completion's positions only, on a CPU as on a GPU (pipeline/rl/labelled_positions.py).
"""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UserFixableError
from pipeline.progress import progress_bar
from pipeline.rl.labelled_positions import score_labelled_positions_only
from pipeline.rl.prompts import RLPrompt
from pipeline.training.activation_checkpointing import activation_checkpointing_arguments
from pipeline.training.checkpoints import (
    AtomicCheckpoints,
    checkpoint_step,
    finish_without_training,
    resume_checkpoint,
    save_model_atomic,
)
from pipeline.training.divergence import refuse_diverged_weights
from pipeline.training.models import bf16_mixed_precision, load_causal_lm, mixed_precision_choice
from pipeline.training.tiny_model import IM_END
from pipeline.training.trainer import run_callbacks

STAGE = "rl"

# transformers 5's deprecation warnings for the names TRL 1.16 still uses (`is_gradient_checkpointing`,
# `gradient_checkpointing_enable`, `gradient_checkpointing_disable`).
DEPRECATED_CHECKPOINTING_NAMES = r"`(is_gradient_checkpointing|gradient_checkpointing_(enable|disable))` is deprecated"


@dataclass(slots=True)
class GSPOOutcome:
    global_step: int
    first_step_this_run: int | None
    resumed_from_step: int | None
    history: list[dict[str, Any]]  # one entry per logged optimizer step (TRL's metrics), resumed runs included
    is_main_process: bool
    # Parameters whose values differ from the model RL started from (None: not measured, a resumed or
    # sharded run), and of how many measured.
    parameters_changed: int | None = None
    parameters_measured: int = 0
    # Prompts whose groups make one optimizer step, over all processes: the first and last steps' rewards
    # are of different prompts, so with few a step their difference says little about learning.
    prompts_per_step: int | None = None


class RLLearnedNothing(UserFixableError):
    """GSPO ran its steps and no weight moved: the stage fails rather than report a completed run."""


def parameter_signature(model) -> dict[str, tuple[float, float]]:
    """Per parameter, its float64 sum and sum of squares: any optimizer update changes them (exact
    equality after a step would need an update of exactly zero). Cheap, on the parameter's device,
    and no copy of the weights. Shards of a parameter a process does not hold (ZeRO-3) are skipped."""
    import torch

    signature = {}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.numel() == 0:
                continue
            values = parameter.detach().double()
            signature[name] = (float(values.sum()), float((values * values).sum()))
    return signature


def learned_nothing_reason(outcome: "GSPOOutcome") -> str | None:
    """Why a finished run taught nothing, or None. Issue 16: a completion budget shorter than the
    targets made every completion score alike, every group's advantages 0, every gradient 0, and the
    checkpoint equal to its start, while the stage said "completed"."""
    norms = [entry["grad_norm"] for entry in outcome.history if entry.get("grad_norm") is not None]
    flat = [
        entry.get("frac_reward_zero_std") for entry in outcome.history if entry.get("frac_reward_zero_std") is not None
    ]
    if outcome.parameters_changed == 0:
        why = f"no weight changed in {outcome.global_step} GSPO steps (of {outcome.parameters_measured} parameters)"
    elif norms and all(norm == 0 for norm in norms):
        why = f"every one of {len(norms)} GSPO steps had gradient norm 0"
    else:
        return None
    if flat and all(value == 1 for value in flat):
        why += ": every group's completions got the same reward (frac_reward_zero_std 1), so every advantage was 0"
    # What made every reward alike, where the logs say (found by probing: a thinking run whose completions never held
    # a thinking block was told to vary its temperature).
    untagged = [
        entry["completions/missing_tags_rate"] for entry in outcome.history if "completions/missing_tags_rate" in entry
    ]
    if untagged and all(rate == 1 for rate in untagged):
        why += (
            "; no completion was in the thinking format (completions/missing_tags_rate 1), so each scored 0: start RL "
            "from a checkpoint SFT trained to think, or set answers.thinking: false"
        )
    clipped = [entry["completions/clipped_ratio"] for entry in outcome.history if "completions/clipped_ratio" in entry]
    if clipped and all(ratio == 1 for ratio in clipped):
        why += "; every completion ran to rl.max_completion_length (completions/clipped_ratio 1)"
    return (
        why + "; give rl.num_generations or rl.temperature room to vary, check that rl.max_completion_length "
        "holds a whole answer, and that the reward can tell completions apart"
    )


def grpo_arguments(config, trainer_dir: Path, reward_weights: Sequence[float]):
    import torch
    from trl import GRPOConfig

    rl = config.rl
    gpu = rl.gpu
    vllm = {}
    if gpu.use_vllm:
        vllm = {
            "use_vllm": True,
            "vllm_mode": gpu.vllm_mode,
            "vllm_gpu_memory_utilization": gpu.vllm_gpu_memory_utilization,
            "vllm_tensor_parallel_size": gpu.vllm_tensor_parallel_size,
        }
        if gpu.vllm_server_base_url:
            vllm["vllm_server_base_url"] = gpu.vllm_server_base_url
    return GRPOConfig(
        output_dir=str(trainer_dir),
        # GSPO (module docstring)
        importance_sampling_level="sequence",
        loss_type="grpo",
        beta=rl.beta,
        epsilon=rl.epsilon,
        epsilon_high=rl.epsilon_high,
        num_iterations=rl.num_iterations,
        # rollouts
        num_generations=rl.num_generations,
        max_completion_length=rl.max_completion_length,
        temperature=rl.temperature,
        steps_per_generation=rl.steps_per_generation,
        # rewards: by default each standardised in its group, then weighted (config: reward.aggregation);
        # scale_rewards applies to `sum_then_normalize` only
        reward_weights=list(reward_weights),
        multi_objective_aggregation=rl.reward.aggregation,
        scale_rewards="group",
        # optimisation
        per_device_train_batch_size=rl.per_device_batch_size,
        gradient_accumulation_steps=rl.gradient_accumulation_steps,
        learning_rate=rl.learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=rl.warmup_fraction,
        max_steps=rl.max_steps,
        seed=rl.seed,
        data_seed=rl.seed,
        # checkpoints and logs
        save_strategy="steps",
        save_steps=rl.save_steps,
        save_total_limit=2,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,  # pipeline.progress draws the bar, and tells the Prefect UI
        log_completions=False,
        # devices and memory
        use_cpu=not torch.accelerator.is_available(),
        bf16=bf16_mixed_precision(mixed_precision_choice(config, rl), config.model.dtype),
        **activation_checkpointing_arguments(GRPOConfig, gpu.gradient_checkpointing),
        use_liger_kernel=gpu.liger_layer_kernels,
        remove_unused_columns=False,
        **vllm,
    )


def _dataset(prompts: Sequence[RLPrompt]):
    from datasets import Dataset

    # Columns beyond `prompt` reach every reward function as keyword lists (one per completion).
    return Dataset.from_list([{"prompt": p.messages, "prompt_index": p.prompt_index} for p in prompts])


def train_gspo(
    config, base_ref: str, tokenizer, prompts: Sequence[RLPrompt], rewards, trainer_dir: Path, model_dir: Path
) -> GSPOOutcome:
    """Train (or resume) GSPO on `prompts` and save the model to `model_dir`."""
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOTrainer

    hf_logging.disable_progress_bar()

    class GSPOTrainer(AtomicCheckpoints, GRPOTrainer):
        """GRPOTrainer with checkpoints that appear whole or not at all."""

    resume = resume_checkpoint(trainer_dir)
    resumed_from = checkpoint_step(resume)
    args = grpo_arguments(config, trainer_dir, rewards.weights)
    score_labelled_positions_only()
    model = load_causal_lm(base_ref, config.model.dtype, config.model.trust_remote_code)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    with progress_bar("rl training steps", total=config.rl.max_steps, done=resumed_from or 0) as advance:
        start, callbacks = run_callbacks(config, STAGE, advance)
        trainer = GSPOTrainer(
            model=model,
            reward_funcs=rewards.functions(),
            args=args,
            train_dataset=_dataset(prompts),
            processing_class=tokenizer,
            callbacks=callbacks,
        )
        trainer.remove_callback(PrinterCallback)
        # Measured from the start only: a resumed run's starting weights are the checkpoint's, not the base's.
        before = parameter_signature(trainer.model) if resume is None else None
        if resumed_from is not None and resumed_from >= config.rl.max_steps:
            finish_without_training(trainer, resume)  # type: ignore[arg-type]  # resume: set with resumed_from. Killed after its last checkpoint: nothing left to train
        else:
            with warnings.catch_warnings():
                # TRL 1.16 reads and toggles activation checkpointing by transformers' old names around each
                # generation, and transformers 5 answers each read with a FutureWarning that the user can do
                # nothing about (three in the demo's log). Only those three names are silenced.
                warnings.filterwarnings("ignore", message=DEPRECATED_CHECKPOINTING_NAMES, category=FutureWarning)
                trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    changed = None
    if before is not None:
        after = parameter_signature(trainer.model)
        changed = sum(1 for name, values in before.items() if after.get(name) != values)
    # Generation must stop where an observation ends, as after SFT.
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    eos = trainer.model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    trainer.model.generation_config.eos_token_id = eos if im_end in eos else eos + [im_end]
    refuse_diverged_weights(trainer, STAGE, config.rl.learning_rate)
    save_model_atomic(trainer, model_dir)
    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    args = trainer.args
    completions = (
        args.per_device_train_batch_size * args.gradient_accumulation_steps * trainer.accelerator.num_processes
    )
    return GSPOOutcome(
        trainer.state.global_step,
        start.first_step,
        resumed_from,
        history,
        trainer.is_world_process_zero(),
        changed,
        len(before or {}),
        completions // args.num_generations,
    )
