"""Settings every training stage shares (CPT now; SFT and RL subclass it): optimisation and checkpoints.

The stage fixes the rest of the Trainer itself (pipeline/training/trainer.py): a cosine schedule,
`save_total_limit` 2, logging every 1% of the steps, evaluation only at step 0 and at the end.
"""

from typing import Literal

from pydantic import Field

from pipeline.config.base import Section
from pipeline.config.model import MixedPrecision


class TrainingSettings(Section):
    # -- data
    max_length: int = Field(
        default=1024,
        ge=32,
        description="Longest token sequence, and the length of a packed training row. CPT cuts a longer "
        "trajectory into windows that start at turn boundaries and repeat the system prompt (which may fill at "
        "most half a window: a longer one keeps its head). Agent trajectories are long: 4096+ on a GPU; the tiny "
        "model's tokenizer spends ~2 characters per token, so a tool list of 4k characters already needs 2048.",
    )
    row_order: Literal["shuffled", "stratified"] = Field(
        default="shuffled",
        description="The order of an epoch's packed rows (pipeline/training/row_order.py). shuffled: the Trainer's "
        "uniform shuffle of rows that mix environments; stratified: rows packed within one environment (or world "
        "knowledge) and spread so every stretch of the epoch holds each in its share of the pool. It matters under "
        "one epoch, where the order decides what is trained on at all (the demo's CPT covers 0.13 of one). On the "
        "demo's CPT at seeds 0, 1, 2, stratified scored 38.6, 32.7 and 38.1 on the validation pool where shuffled "
        "scored 46.0, 34.9 and 42.1: the environments' shares were not what the seed decides, so shuffled stays "
        "the default (docs/performance.md, 2026-12-06).",
    )
    # -- optimisation
    learning_rate: float = Field(default=5e-4, gt=0, description="Peak learning rate (cosine decay).")
    warmup_fraction: float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description="Share of `max_steps` spent warming the learning rate up from 0: a pretrained model's first "
        "steps on a new distribution are the ones most likely to overshoot.",
    )
    max_steps: int = Field(default=60, ge=1, description="Optimizer steps.")
    tokens_per_step: int = Field(
        default=16384,
        ge=1,
        description="Batch size in tokens: packed rows x `max_length` per optimizer step, over every device and "
        "micro-batch (pipeline/training/packing.py). Gradient accumulation makes up what `micro_batch_rows` "
        "rows per device do not hold: round(tokens_per_step / (micro_batch_rows x max_length x devices)) "
        "micro-batches, at least 1 (the figure reached is logged). 16k tokens: 8 rows of 2048, what one H200 "
        "trains a 0.6B model on at full speed (issue 9).",
    )
    micro_batch_rows: int = Field(
        default=8,
        ge=1,
        description="Packed rows of `max_length` tokens per device per forward pass: the memory knob. A 0.6B "
        "model at 2048 tokens with the fused loss needs about 23 GiB for 8 rows (STACK.md); more rows fit "
        "with `gradient_checkpointing`.",
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute each layer's activations in the backward pass instead of keeping them: about a "
        "third more compute for a fraction of the activation memory, so more or longer rows fit. Off: the "
        "default shapes fit without it.",
    )
    loss: Literal["auto", "liger", "chunked"] = Field(
        default="auto",
        description="How the next-token loss is computed without materialising [tokens x vocabulary] logits "
        "(pipeline/training/token_loss.py). auto: Liger-Kernel's fused linear cross-entropy on a CUDA GPU "
        "where `liger-kernel` is installed (the `gpu` extra), else chunked; liger: that, or an error; "
        "chunked: float32 logits a chunk of tokens at a time in plain PyTorch, everywhere.",
    )
    mixed_precision: MixedPrecision | None = Field(
        default=None,
        description="This stage's training arithmetic, as `model.mixed_precision` (auto, bf16, native-bf16, none); "
        "None: `model.mixed_precision`. The demo trains CPT in `native-bf16` (32 steps in the time float32 takes "
        "for 16; CPT so trained scored as well on validation) and SFT and RL in float32.",
    )
    seed: int = Field(
        default=0,
        description="Seed for the keep-ratio masks (drawn anew each epoch from it, the turn and the epoch), the mix, "
        "the order of packed rows and training.",
    )
    # -- checkpoints
    save_steps: int = Field(default=20, ge=1, description="Checkpoint every this many steps (resume point).")
