"""Configuration of `simulacra score`: the informativeness table of SPEC.md (Qwen-AgentWorld).

The thresholds and keep ratios default to the paper's. The paper leaves three things open, decided
here and explained in the README ("Turn informativeness"): which category wins when signatures
overlap (`precedence`), what a "short" observation is (`short_observation_chars`), and where Jaccard
enters (`echo_jaccard_min`). One category is the project's: `thought`, for the agent's thoughts
(ReAct's `think:`), which the paper's data does not have.
"""

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import Section
from pipeline.store.schema import THOUGHT

# The paper's categories, each a signature over the metrics, tried in `precedence` order.
Signature = Literal["echo", "boilerplate", "transform", "expansion", "retrieval", "action", "other"]
SIGNATURES: tuple[Signature, ...] = ("echo", "boilerplate", "transform", "expansion", "retrieval", "action", "other")
# A turn whose observation is, character for character, the one before it in its trajectory (kept turns
# only): the answer is in the context already, and copying it is all the label teaches.
REPEAT = "repeat"
# Every category a turn can get: the signatures; `thought` for a turn its adapter marked as the agent
# thinking aloud (schema.THOUGHT), and `repeat`, each whatever its metrics.
CATEGORIES: tuple[str, ...] = (*SIGNATURES, THOUGHT, REPEAT)


class KeepRatios(Section):
    """Fraction of an observation's tokens that count in the CPT loss, per category (paper's table)."""

    echo: float = Field(
        default=0.05, ge=0, le=1, description="Observation repeats the action: almost nothing to learn."
    )
    boilerplate: float = Field(default=0.10, ge=0, le=1, description="Mostly the action's words with fixed framing.")
    transform: float = Field(default=0.50, ge=0, le=1, description="A shorter rewrite of what the action said.")
    expansion: float = Field(default=1.00, ge=0, le=1, description="Builds on the action with much new content.")
    retrieval: float = Field(default=1.00, ge=0, le=1, description="Returns new content the action did not contain.")
    action: float = Field(default=1.00, ge=0, le=1, description="A short state change or acknowledgement.")
    other: float = Field(default=1.00, ge=0, le=1, description="No signature matched: keep everything.")
    thought: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="The agent thinking aloud (ReAct's `think:`, OpenHands' and tau-bench's think actions), answered "
        'with a fixed acknowledgement ("OK."), not by the environment: not the paper\'s, which has no such turns. 0: '
        "the answer stays in the context of later turns but is never a label, since predicting it teaches nothing "
        "about the environment.",
    )

    repeat: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="The observation equals the one before it in its trajectory, character for character (two "
        "silent commands in a row, a retried action answered alike): not the paper's. Below 1, such a label only "
        "teaches the model to copy its context, which a small model then does where the environment answers "
        "something new (docs/stages/score.md).",
    )

    def of(self, category: str) -> float:
        return float(getattr(self, category))


class ScoreConfig(Section):
    echo_overlap_min: float = Field(default=0.7, ge=0, le=1, description="echo: OL >= this (paper 0.7).")
    echo_novelty_max: float = Field(default=0.3, ge=0, le=1, description="echo: Nov < this (paper 0.3).")
    echo_jaccard_min: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Optional extra echo condition Jac >= this. Off by default: the paper defines Jaccard but "
        "uses it in no signature, so it is stored for analysis. OL >= 0.7 and Nov < 0.3 already imply Jac > 0.53; "
        "a higher bound (e.g. 0.8) reserves echo for observations whose word set nearly equals the action's.",
    )
    boilerplate_overlap_min: float = Field(default=0.5, ge=0, le=1, description="boilerplate: OL >= this (paper 0.5).")
    boilerplate_novelty_max: float = Field(default=0.5, ge=0, le=1, description="boilerplate: Nov < this (paper 0.5).")
    transform_novelty_max: float = Field(default=0.5, ge=0, le=1, description="transform: Nov < this (paper 0.5).")
    transform_ratio_max: float = Field(default=1.0, ge=0, description="transform: R < this (paper 1).")
    expansion_overlap_min: float = Field(default=0.5, ge=0, le=1, description="expansion: OL >= this (paper 0.5).")
    expansion_novelty_min: float = Field(default=0.5, ge=0, le=1, description="expansion: Nov >= this (paper 0.5).")
    expansion_ratio_min: float = Field(default=1.5, ge=0, description="expansion: R > this (paper 1.5).")
    retrieval_novelty_min: float = Field(default=0.6, ge=0, le=1, description="retrieval: Nov >= this (paper 0.6).")
    retrieval_ratio_min: float = Field(default=1.0, ge=0, description="retrieval: R > this (paper 1).")
    action_novelty_min: float = Field(default=0.5, ge=0, le=1, description="action: Nov >= this (paper 0.5).")
    action_ratio_max: float = Field(
        default=1.0, ge=0, description="action: R <= this (paper 1) or a short observation."
    )
    short_observation_chars: int = Field(
        default=80,
        ge=0,
        description="An observation of at most this many characters is 'short' for the action category: about "
        "one line of a terminal, the length of 'File created successfully at: /path/to/file.py'.",
    )
    precedence: list[Signature] = Field(
        default_factory=lambda: ["echo", "boilerplate", "transform", "expansion", "retrieval", "action", "other"],  # type: ignore[arg-type]  # each a Signature; mypy reads list[str]
        description="Order in which signatures are tried; the first that matches wins. Default: the paper's "
        "table order, which is also ascending keep ratio: every echo is also boilerplate, and a turn that is "
        "both boilerplate and transform is masked as boilerplate; among the keep-everything categories the "
        "more specific comes first (expansion before retrieval, retrieval before action). `other` matches "
        "everything, so categories after it are never chosen. Before any signature, a thought turn is `thought`, "
        "then a turn repeating the previous observation is `repeat`.",
    )
    keep_ratios: KeepRatios = Field(default_factory=KeepRatios, description="Keep ratio per category.")

    @model_validator(mode="after")
    def _precedence_is_a_permutation(self) -> "ScoreConfig":
        if sorted(self.precedence) != sorted(SIGNATURES):
            raise ValueError(f"precedence must list each of {', '.join(SIGNATURES)} exactly once")
        return self
