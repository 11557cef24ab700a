"""Which causal LM the training stages start from."""

from typing import Literal

from pydantic import Field

from pipeline.config.base import Section

# Training arithmetic (pipeline/training/models.py `bf16_mixed_precision`): `model.mixed_precision` for every
# training stage, a stage's own `mixed_precision` where it sets one.
MixedPrecision = Literal["auto", "bf16", "native-bf16", "none"]


class TinyModelConfig(Section):
    """A randomly initialised model built offline, for tests and the demo (no model hub here)."""

    architecture: Literal["qwen3", "llama"] = Field(
        default="qwen3",
        description="Qwen3 or Llama config. Not qwen2: its AutoTokenizer swaps in Qwen's own pre-tokenizer "
        "and silently changes token ids (STACK.md).",
    )
    vocab_size: int = Field(default=512, ge=64, description="Byte-level BPE vocabulary trained on local text.")
    hidden_size: int = Field(default=64, ge=8, description="Width; 64 trains a CPU step in milliseconds.")
    num_layers: int = Field(default=2, ge=1, description="Decoder layers.")
    num_heads: int = Field(default=4, ge=1, description="Attention heads (hidden_size must divide by it).")
    intermediate_size: int = Field(default=128, ge=8, description="MLP width.")
    max_position_embeddings: int = Field(default=4096, ge=64, description="Longest sequence the model accepts.")
    seed: int = Field(default=0, description="Seed of the random initialisation and tokenizer training order.")


class ModelConfig(Section):
    base: str | None = Field(
        default=None,
        description="Hugging Face model name or local path of any causal LM (e.g. Qwen/Qwen3-0.6B on a GPU). "
        "None builds the tiny offline model below into the workspace (`simulacra init-model`).",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Used when `base` is None.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Weights dtype for loading `base`; auto picks bfloat16 on a GPU that supports it, float32 on CPU.",
    )
    mixed_precision: MixedPrecision = Field(
        default="auto",
        description="Training arithmetic: `bf16` runs the matmuls of CPT, SFT and RL in bfloat16 under autocast "
        "while the weights and AdamW's state stay in `dtype`; `none`: no autocast, the arithmetic of `dtype`; "
        "`native-bf16`: bf16 where the hardware computes bfloat16 itself (a CUDA GPU that supports it, a CPU with "
        "AVX512-BF16 or AMX), `none` elsewhere. auto: bf16 on a CUDA GPU that supports it, `none` elsewhere. On a "
        "CPU with those instructions `bf16` makes a step of the demo's 135M model 2.35x faster "
        "(bench/cpu_training_step.py), but at `make learn`'s budgets SFT and RL trained so scored measurably lower "
        "on the validation pool (CPT did not); without them bfloat16 is emulated, 1.28x slower than float32. A "
        "stage's own `mixed_precision` (cpt, sft, rl) overrides this one. Never with float16 weights.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Passed to from_pretrained; off because model code from outside is untrusted."
    )
