"""What a stage asks of a model and what it gets back."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[dict[str, str], ...]  # {"role": ..., "content": ...}
    # The k-th sample of the same prompt: part of the cache key, so k samples are k answers, and
    # added to the configured seed, so seeded samples differ.
    sample_index: int = 0
    # The OpenAI `response_format` object, sent as is (e.g. {"type": "json_schema", "json_schema":
    # {"name": ..., "schema": {...}}}) where the endpoint supports structured output; the transformers
    # backend does not constrain decoding and ignores it.
    response_format: dict | None = None
    # Budget forcing (s1, Muennighoff et al. 2025), for a local model asked for the thinking format:
    # the transformers backend opens the answer with `<think>`, lets the model think for at most this
    # many tokens (or until it closes the block itself), closes the block and lets it write the
    # observation after its own thinking. A small model then always answers in the format, and what it
    # predicts follows from what it thought. Part of the cache key; None: the model writes freely. An
    # OpenAI-compatible endpoint cannot be steered so, and the openai backend refuses it.
    thinking_budget: int | None = None


@dataclass
class ChatAnswer:
    key: str  # the cache key (pipeline/llm/cache.py)
    text: str | None  # None when the request failed
    error: str | None  # why it failed after its retries: "<kind>: <detail>", the API key redacted
    cached: bool  # answered from the store without a request
    prompt_tokens: int | None  # as the endpoint reported them; None where it reports no usage
    completion_tokens: int | None


@dataclass(frozen=True)
class Completion:
    """One answer as a backend returns it."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
