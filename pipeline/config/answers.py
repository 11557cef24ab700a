"""Configuration of the answer format: thinking or direct (issue 28, SPEC.md Stage 2, hybrid thinking)."""

from typing import Literal

from pydantic import Field

from pipeline.config.base import Section


class AnswersConfig(Section):
    thinking: Literal["auto"] | bool = Field(
        default="auto",
        description="Whether SFT, RL, their validation and evaluation, the exported chat template's default and "
        "serving answer in the thinking format (`<think>...</think>` then the observation) or directly (the "
        "observation alone, as CPT trains). Thinking needs a teacher that can reason: where the only SFT generator "
        "is the model being trained, its own rationales teach a small model to write prose where an observation "
        "belongs (a 135M model's held-out score fell from 55 to 4). `auto`: thinking when an SFT generator is a "
        "model other than the checkpoint being trained (an `openai` endpoint, or a transformers endpoint naming its "
        "own `model`), direct otherwise (the offline demo). Like Qwen3's `enable_thinking`: a request to the "
        "served model may still ask for either format the model was trained in.",
    )


def resolve_thinking(config) -> bool:
    """`answers.thinking` with `auto` decided by the SFT generators (see the field's description)."""
    chosen = config.answers.thinking
    if chosen != "auto":
        return bool(chosen)
    return any(
        generator.kind == "endpoint"
        and (generator.endpoint.backend == "openai" or generator.endpoint.model is not None)
        for generator in config.sft.generators
    )
