"""A simulated environment over any OpenAI-compatible endpoint serving a world model: the client the
RL-facing environments (pipeline/serving/gym_env.py, trl_env.py) are built on.

    env = WorldModelEnvironment("http://127.0.0.1:8000/v1", model="simulacra-world-model-...", domain="terminal")
    observation = env.reset("Count the lines of notes.txt", SystemPrompt(action_space="bash commands"))
    observation = env.step("wc -l notes.txt", seed=7)

The environment keeps the trajectory (`history`), renders each request itself in the model's prompt
format (pipeline/serving/prompt_formats.py: system prompt from the five parts, history, action) and
sends it as chat messages, so it works against `simulacra serve` and against vLLM alike. The answer
format is the model's trained one unless `enable_thinking` asks for another it was trained in (issue 28;
sent as `chat_template_kwargs`, vLLM's field): direct, the answer is the observation, whole; thinking,
the thinking is separated here too (`last_thinking`), since a vLLM started without a reasoning parser
returns it inside the content. The prompt format, answer format and history budget are read from
`simulacra serve`'s model list; for vLLM pass them (`prompt_format`, `enable_thinking`,
`max_history_chars`, recorded in the export's `simulacra.json`).

The history sent is shortened exactly as training shortened it (issue 19: a long episode died at step
53 with `context_length_exceeded`): first the most recent whole turns within the model's
`max_history_chars` (pipeline/sft/queries.py's `kept_history`, the budget SFT and RL built their
queries with), then, while the server says the prompt and its token budget pass the context length,
the oldest kept turn is dropped, one at a time, as SFT samples drop theirs (pipeline/sft/samples.py).
`history` itself keeps every turn; `last_history_sent` says how many went into the last request.

An observation and its thinking are redacted here (pipeline/llm/credentials.py): an episode is an agent's
training sample, and vLLM's server, unlike `simulacra serve`, sends a recited key as the model wrote it.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from pipeline.llm.credentials import redact
from pipeline.serving.prompt_formats import prompt_format as named_format
from pipeline.serving.prompt_formats import world_model_messages
from pipeline.serving.thinking import split_thinking
from pipeline.store.schema import DOMAINS, SystemPrompt

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam


class ContextExhausted(RuntimeError):
    """Even without any history, the system prompt, the action and the token budget pass the context length."""


def _context_exceeded(exc: Exception) -> bool:
    """A 400 of the server meaning the prompt is too long: simulacra serve's code, or vLLM's wording."""
    body = getattr(exc, "body", None)
    error = body.get("error", body) if isinstance(body, dict) else {}
    code = error.get("code") if isinstance(error, dict) else None
    return code == "context_length_exceeded" or "context length" in str(exc).lower()


class WorldModelEnvironment:
    def __init__(
        self,
        base_url: str,
        model: str,
        domain: str,
        prompt_format: str | None = None,
        max_history_chars: int | None = None,
        api_key: str = "EMPTY",
        max_tokens: int = 512,
        temperature: float = 1.0,
        timeout: float = 120.0,
        enable_thinking: bool | None = None,
    ):
        from openai import OpenAI

        if domain not in DOMAINS:  # else a prompt for a domain the model never saw: "the termnal domain: ..."
            raise ValueError(f"unknown domain `{domain}`: the domain is one of {', '.join(DOMAINS)}")
        self.client = OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=2)
        self.model = model
        self.domain = domain
        served = {} if prompt_format else self._served()
        # Given a prompt format (vLLM), the model is taken at its word on the answer format too.
        self.format = (
            named_format(prompt_format, enable_thinking)
            if prompt_format
            else named_format(served["prompt_format"], served.get("thinking"))
        )
        self.thinking = self.format.answer_mode(enable_thinking)  # UntrainedAnswerFormat: a format it never learnt
        self.max_history_chars = max_history_chars if max_history_chars is not None else served.get("max_history_chars")
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.system = SystemPrompt()
        self.history: list[tuple[str, str]] = []
        self.last_thinking: str | None = None
        self.last_history_sent = 0

    def _served(self) -> dict[str, Any]:
        listed = self.client.models.list().data
        for entry in listed:
            described = (entry.model_extra or {}).get("simulacra")
            if entry.id == self.model and described:
                return described
        described_models = [entry.id for entry in listed if (entry.model_extra or {}).get("simulacra")]
        if described_models and self.model not in {entry.id for entry in listed}:
            # A misspelt or stale name at `simulacra serve`: said as such, not as a server that describes nothing
            # (found by probing).
            raise ValueError(
                f"model `{self.model}` is not served at {self.client.base_url}; it serves "
                f"{', '.join(f'`{name}`' for name in described_models)}"
            )
        raise ValueError(
            f"the endpoint does not say which prompt format {self.model} uses (not `simulacra serve`?): pass "
            "prompt_format, enable_thinking and max_history_chars, as recorded in the exported folder's "
            "simulacra.json (prompt_format, thinking, max_history_chars)"
        )

    def reset(self, task: str, system: SystemPrompt | Mapping[str, Any] | None = None) -> str:
        """Start a trajectory: `task` is the task description, `system` the other parts (action space,
        tools, initial state, demonstrations, simulation instructions). Returns the initial
        observation: the initial state, which the environment shows before any action."""
        parts = system if isinstance(system, SystemPrompt) else SystemPrompt(**dict(system or {}))
        self.system = replace(parts, task_description=task)
        self.history = []
        self.last_thinking = None
        self.last_history_sent = 0
        return self.system.initial_state or ""

    def kept_history(self) -> list[tuple[str, str]]:
        """The turns training would have kept for the next query: the character budget first."""
        if self.max_history_chars is None:
            return list(self.history)
        from pipeline.sft.queries import kept_history
        from pipeline.store.schema import ScoredTurn

        turns = [
            ScoredTurn(i, action, observation, "history", 1.0) for i, (action, observation) in enumerate(self.history)
        ]
        kept, _ = kept_history(turns, self.max_history_chars)
        return [(turn.action, turn.observation) for turn in kept]

    def step(self, action: str, control_instructions: Sequence[str] = (), seed: int | None = None) -> str:
        """The simulated observation of `action`, which joins the history. Control instructions
        ("inject an intermittent API error") apply to this step only; `seed` makes the sample reproducible."""
        from openai import BadRequestError

        history = self.kept_history()
        while True:
            messages = world_model_messages(
                self.format, self.domain, self.system, history, action, control_instructions, self.thinking
            )
            try:
                answer = self.client.chat.completions.create(
                    model=self.model,
                    messages=cast("list[ChatCompletionMessageParam]", messages),
                    max_tokens=self.max_tokens,
                    temperature=self.temperature,
                    seed=seed,
                    extra_body={"chat_template_kwargs": {"enable_thinking": self.thinking}},
                )
                break
            except BadRequestError as exc:
                if not _context_exceeded(exc):
                    raise
                if not history:
                    raise ContextExhausted(
                        f"the system prompt and the action with {self.max_tokens} answer tokens pass the model's "
                        f"context length even without history: {exc}"
                    ) from None
                history = history[1:]
        self.last_history_sent = len(history)
        message = answer.choices[0].message
        content = message.content or ""
        thinking = None  # a direct answer is the observation, whole
        if self.thinking:
            # `reasoning_content` from simulacra serve and vLLM's reasoning parsers (`reasoning` in newer vLLM).
            extra = message.model_extra or {}
            thinking = extra.get("reasoning_content", extra.get("reasoning"))
            if thinking is None:
                thinking, content = split_thinking(content)
        # vLLM's server sends what the model wrote; `simulacra serve` has redacted it already (a no-op then).
        content = redact(content)
        self.last_thinking = redact(thinking) if thinking is not None else None
        self.history.append((action, content))
        return content
