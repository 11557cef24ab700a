"""Configuration of the validation pool's measurement: the score every training stage reports before and
after, and that `export` ships by (issue 28)."""

from pydantic import Field

from pipeline.config.base import Section
from pipeline.config.sft import JudgeConfig


class ValidationConfig(Section):
    max_queries: int = Field(
        default=32,
        ge=0,
        description="Validation-pool target turns (a seeded choice, the same for every stage) that each training "
        "stage asks its starting and its trained model, greedily, in each one's own answer format, and scores with "
        "`judge`. The same set for cpt, sft and rl, so their scores compare and `export` can ship the best. 0 skips "
        "it (and `export` then ships the last stage's model). Each target is a 1/n step of the mean: 32 keep one "
        "answer to about 3 points of 100.",
    )
    seed: int = Field(default=0, description="Seed of the choice of validation targets.")
    max_tokens: int = Field(
        default=512,
        ge=1,
        description="Most tokens of a validation answer: the observation, and a thinking block in the thinking "
        "format. Checked against the p95 of the targets' observations in the model's tokenizer.",
    )
    max_history_chars: int = Field(
        default=24_000,
        ge=0,
        description="History shown with a validation query: the most recent whole turns within this many "
        "characters, as the stages build their queries. The same for every stage, so the prompts differ only by "
        "format.",
    )
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig,
        description="Scores a validation answer against the real observation (0-100: (raw - 1) / 4 x 100 of the "
        "judge's 1-5, as evaluation reports). The offline similarity judge by default, so no endpoint is needed.",
    )
