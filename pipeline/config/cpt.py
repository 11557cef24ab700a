"""Configuration of the continual-pretraining stage (SPEC.md, Stage 1)."""

from pathlib import Path

from pydantic import Field

from pipeline.config.training import TrainingSettings


class CPTConfig(TrainingSettings):
    """Data of the CPT stage; optimisation and checkpoint settings come from TrainingSettings."""

    world_knowledge: list[str] = Field(
        default_factory=list,
        description="World-knowledge corpus: text files, JSONL (a `text` field), folders or `hf://` datasets.",
    )
    world_knowledge_token_ratio: float = Field(
        default=0.2,
        ge=0,
        le=10,
        description="World-knowledge loss tokens per trajectory loss token in the training mix (0 disables the "
        "corpus). Loss tokens, not input tokens: a document is fully labelled while a trajectory is mostly context "
        "(on the demo ~30% labelled), so an input-token ratio of 0.09 was already 24% of the loss (issue 13). "
        "0.2: world knowledge is a sixth of the gradient, the observations the rest. A corpus smaller than the "
        "ratio asks is used whole, once, and the summary line says the ratio it reached.",
    )
    domain_balance: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="How the pool's domains (environment kinds) share the trajectory tokens CPT trains on: each in "
        "proportion to its own token count to this power. 1: the pool's own shares, nothing repeated; 0: every "
        "domain alike; between, temperature sampling (XLM-R's 0.3). Smaller domains are repeated, whole windows with "
        "their own keep-ratio masks; no window is left out. Choose it on the validation pool: at 1, the demo's text "
        "games (13% of its trajectory tokens) got about 4 of `make learn`'s 32 rows (pipeline/training/domain_mix.py).",
    )
    outcome_head_tokens: int = Field(
        default=4,
        ge=0,
        description="The first N tokens of every observation are labels whatever its keep ratio; the ratio thins "
        "the rest. They say which outcome the action had: after `put X in/on Y` a success echoes the action "
        "(echo, keep 0.05) and a failure does not (`Nothing happens.`, keep 1), so thinning from the first token "
        "taught the model that puts fail. 0: SPEC.md's plain per-token keep ratio.",
    )
    eval_max_sequences: int = Field(
        default=64,
        ge=1,
        description="Validation-pool windows scored for the before/after observation cross-entropy (CPT's and SFT's) "
        "(every observation token of them, keep ratio 1).",
    )
    output_dir: Path | None = Field(
        default=None, description="Where the checkpoint goes; None: `<workspace>/runs/cpt/<fingerprint>`."
    )
