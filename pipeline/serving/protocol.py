"""The requests `simulacra serve` accepts: OpenAI's chat completions, every standard field, or the
world model's structured fields (issues 12 and 19).

Two ways to ask for an observation:
- `messages`: the world-model conversation as the chat template expects it (system prompt, then
  user actions and assistant observations, ending with the user's action);
- structured: `domain`, `system` (the five parts), `turns` (the history), `action` and
  `control_instructions` ("inject an intermittent API error", "paginate the response"); the
  server renders them in the model's prompt format (pipeline/serving/prompt_formats.py).

Every field of OpenAI's chat completions request is accepted, so the openai client, litellm, TRL and
agent frameworks work unchanged. Those with a meaning for a world model are honoured: `stream`
(with `stream_options.include_usage`), `n`, `stop`, `seed`, `temperature` (1.0 when omitted, as
OpenAI's), `top_p`, `max_tokens` / `max_completion_tokens`, `presence_penalty`,
`frequency_penalty`, `logit_bias`, `logprobs` / `top_logprobs`; plus vLLM's `ignore_eos`. The
others are accepted and ignored, each for a reason (IGNORED_FIELDS). Messages: content is a string
or a list of text parts (joined with newlines, as vLLM joins them); `developer` is the system role
(OpenAI's newer name for it) and `tool` / `function` messages are observations (the tool's answer is
what the environment returned, the assistant role of training); a system message `name`d for a
system-prompt part (`domain`, `task_description`, ...) carries that part, and the server renders the
prompt from them and the request's `tools`, as the exported chat template does; `name` elsewhere,
`tool_calls` and the like on a message are ignored. Unknown fields are still refused, with their name: a misspelt `acton`
silently dropped would simulate the wrong step.

`chat_template_kwargs` is vLLM's: `{"enable_thinking": false}` asks for the direct answer (the
observation alone), `true` for the thinking one, as Qwen3's chat templates read it (issue 28); omitted,
the model answers in the format it was trained in. Its other keys are ignored, as vLLM passes them to
a template that may not read them; `enable_thinking` must be a boolean.
"""

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pipeline.store.schema import DOMAINS, SystemPrompt

# Accepted and ignored, with why (README, "Serving"). A world model simulates the environment: it
# never calls a tool itself, and the observation's format is the environment's, set by the prompt.
IGNORED_FIELDS = {
    "tools": "the world model simulates tools, it calls none; describe them in the system prompt's action space",
    "tool_choice": "no tool calls (see tools)",
    "parallel_tool_calls": "no tool calls (see tools)",
    "functions": "no tool calls (see tools)",
    "function_call": "no tool calls (see tools)",
    "response_format": "the observation's format is the environment's, which the system prompt sets",
    "user": "no per-user state or abuse monitoring here",
    "safety_identifier": "no per-user state or abuse monitoring here",
    "metadata": "nothing is stored",
    "store": "nothing is stored",
    "service_tier": "one tier",
    "prompt_cache_key": "no prompt cache across requests",
    "reasoning_effort": "the model thinks or not as `chat_template_kwargs.enable_thinking` asks, never by effort",
    "verbosity": "the observation is as long as the environment's",
    "modalities": "text only",
    "audio": "text only",
    "prediction": "no speculative decoding",
    "web_search_options": "no web access",
}


# No NaN nor infinity in any number (JSON has neither, Python's parser reads both): a NaN temperature was refused
# as "less than or equal to 2" (found by probing).
class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ContentPart(Lenient):
    type: str
    text: str | None = None


class Message(Lenient):
    """A chat message; fields other than role and content (name, tool_calls, tool_call_id, refusal,
    reasoning_content...) are accepted and ignored."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None  # on a system message, the system-prompt part it carries (SYSTEM_PART_NAMES)

    def world_model_role(self) -> str:
        return {"developer": "system", "tool": "assistant", "function": "assistant"}.get(self.role, self.role)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        kinds = {part.type for part in self.content} - {"text"}
        if kinds:
            raise ValueError(f"content parts of type {', '.join(sorted(kinds))}: a world model reads text parts only")
        return "\n".join(part.text or "" for part in self.content)


class SystemParts(Strict):
    task_description: str = ""
    action_space: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    initial_state: str | None = None
    demonstrations: str | None = None
    simulation_instructions: str | None = None

    def prompt(self) -> SystemPrompt:
        return SystemPrompt(**self.model_dump())


class Turn(Strict):
    action: str
    observation: str


class StreamOptions(Lenient):
    include_usage: bool = False


class ChatCompletionRequest(Strict):
    model: str | None = None
    messages: list[Message] | None = None
    domain: Literal[DOMAINS] | None = None  # type: ignore[valid-type]
    system: SystemParts | None = None
    turns: list[Turn] = Field(default_factory=list)
    action: str | None = None
    control_instructions: list[str] = Field(default_factory=list)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[int, float] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    ignore_eos: bool = Field(default=False, description="vLLM's: generate max_tokens, past the end token.")
    include_thinking: bool = Field(default=False, description="Put the thinking block in `content` too.")
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="vLLM's: `enable_thinking` chooses the thinking or the direct answer; other keys are ignored.",
    )
    # Accepted and ignored: IGNORED_FIELDS says why.
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    user: Any = None
    safety_identifier: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _enable_thinking_is_a_boolean(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        value = (kwargs or {}).get("enable_thinking")
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"enable_thinking must be true or false, not {json.dumps(value)}")
        return kwargs

    @model_validator(mode="after")
    def _one_way_to_ask(self) -> "ChatCompletionRequest":
        structured = self.action is not None or self.system is not None or self.turns or self.control_instructions
        if self.messages is not None and structured:
            raise ValueError("send either `messages` or the structured fields (system, turns, action), not both")
        if self.messages is None:
            if self.action is None:
                raise ValueError("missing action: send `messages` ending with a user message (the action), or `action`")
            if self.domain is None:
                raise ValueError(f"structured request without `domain` (one of {', '.join(DOMAINS)})")
        elif not self.messages or self.messages[-1].world_model_role() != "user":
            raise ValueError("missing action: the last message must be the user's action")
        return self

    # Field validators, not the model's: the error then names its field (`param`), as OpenAI's and vLLM's do.
    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_needs_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top and not info.data.get("logprobs"):  # OpenAI's rule, and vLLM's: silence here would drop them
            raise ValueError("set `logprobs` to true to get top log probabilities")
        return top

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences (OpenAI's limit)")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _biases_within_100(cls, biases: dict[int, float] | None) -> dict[int, float] | None:
        for token, bias in (biases or {}).items():
            if not -100 <= bias <= 100:
                raise ValueError(f"the bias of token {token} is outside [-100, 100]")
        return biases

    def enable_thinking(self) -> bool | None:
        """The answer format asked for: True thinking, False direct, None the model's trained one."""
        return (self.chat_template_kwargs or {}).get("enable_thinking")

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def stop_sequences(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [stop for stop in stops if stop]

    def sampling_temperature(self) -> float:
        """OpenAI's default when omitted is 1.0: sampling, not greedy."""
        return 1.0 if self.temperature is None else self.temperature
