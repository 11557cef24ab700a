"""The simulated environment served as OpenEnv clients expect (issue 19, deliver 3): an OpenEnv
`Environment` over any OpenAI-compatible endpoint serving a world model, served by OpenEnv's own
`create_app` (HTTP and WebSocket) and driven by its `EnvClient`.

    simulacra openenv --world-model http://127.0.0.1:8000/v1 --domain terminal --episode task.yaml

    with WorldModelEnvClient(base_url="http://127.0.0.1:8001").sync() as env:
        result = env.reset(seed=0)
        result = env.step(WorldModelAction(action="wc -l notes.txt"))
        result.observation.text, result.reward, result.done

An episode is pipeline/serving/episode.py's: the server's (`--episode`), or the fields `reset` is
given (`task`, the system-prompt parts by name, `verifier`, `success_pattern`, `max_steps`), which
replace it for that episode as gymnasium's `options` do; a misspelt field is refused, not ignored.
`reset(seed=...)` seeds the episode (step t's request seed derives from it), so the same seed and
actions give the same observations; without a seed each episode draws its own. The reset observation
is the initial state. A step's `reward` is 1.0 when it does the task, else 0.0; `done` is true when the
task is done or the step limit is reached, and `truncated` says it was the limit.

Sessions are OpenEnv's: each WebSocket (`/ws`, EnvClient's transport) gets its own environment, so
its own history, up to `max_sessions` at once (the world model batches their requests). OpenEnv's
HTTP `/reset` and `/step` build a fresh environment per request, so over HTTP a reset shows the
initial state and a step is refused (409) naming the WebSocket. Errors keep OpenEnv's shapes: a
malformed action is its VALIDATION_ERROR over the WebSocket (422 over HTTP); an unknown reset field, a
step before reset or after the end is an EXECUTION_ERROR naming the problem (400 / 409 over HTTP).
"""

import functools
import re
import secrets
import uuid
from pathlib import Path
from typing import Any

from pydantic import Field

from pipeline.errors import UserFixableError
from pipeline.serving.environment import WorldModelEnvironment
from pipeline.serving.episode import EPISODE_FIELDS, EpisodeSpec, judge, step_seed

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
except ModuleNotFoundError as exc:  # openenv itself, or one of the modules it imports (fastmcp, ...)
    missing = (exc.name or "openenv").split(".")[0]
    raise UserFixableError(f"OpenEnv is not installed (no module `{missing}`): pip install '.[openenv]'") from None

ENV_NAME = "simulacra_world_model"


class EpisodeError(ValueError):
    """A reset or step the episode cannot take; `status` is its HTTP answer on OpenEnv's stateless routes."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class WorldModelAction(Action):
    action: str = Field(
        min_length=1,
        description="The agent's action, written as the environment expects it: a "
        "shell command, a tool call, a game command. Never empty: training drops empty-action turns.",
    )
    control_instructions: list[str] = Field(
        default_factory=list,
        description="Controls for this step only, "
        "e.g. 'inject an intermittent API error' (SPEC's simulation instructions).",
    )


class WorldModelObservation(Observation):
    text: str = Field(
        default="",
        description="What the environment shows: the initial state after reset, the "
        "simulated observation after a step.",
    )
    thinking: str | None = Field(
        default=None,
        description="A thinking model's reasoning about the step, kept out "
        "of `text` (the agent sees only the observation); None for a direct answer.",
    )
    truncated: bool = Field(
        default=False,
        description="The step limit ended the episode before the task was "
        "done (gymnasium's `truncated`); `done` is true as well.",
    )
    reason: str = Field(default="", description="Why the step earned its reward and whether it ended the episode.")
    history_sent: int = Field(
        default=0,
        description="Earlier turns the world model saw for this step: the "
        "history is shortened as training shortened it.",
    )


class WorldModelState(State):
    task: str = Field(default="", description="The episode's task description.")
    seed: int | None = Field(default=None, description="The episode's seed: reset with it to replay the episode.")
    done: bool = Field(default=False, description="The episode has ended: reset to start another.")
    turns: list[dict[str, str]] = Field(
        default_factory=list, description="The trajectory so far, each turn `{action, observation}`."
    )


def _episode(options: dict[str, Any], default: EpisodeSpec | None) -> EpisodeSpec:
    unknown = sorted(set(options) - set(EPISODE_FIELDS))
    if unknown:
        raise EpisodeError(
            f"unknown episode field(s) {', '.join(unknown)}: an episode takes "
            f"{', '.join(EPISODE_FIELDS)} (and reset a seed and an episode_id)"
        )
    try:
        episode = EpisodeSpec.from_mapping(options) if options else default
    except (TypeError, ValueError) as exc:
        raise EpisodeError(f"a bad episode field: {exc}") from None
    if episode is None or not episode.task:
        raise EpisodeError(
            "no task: pass `task` (and the episode's other fields) to reset, or start the server with --episode FILE"
        )
    if episode.success_pattern:
        try:
            re.compile(episode.success_pattern)
        except re.error as exc:
            raise EpisodeError(
                f"success_pattern {episode.success_pattern!r} is not a regular expression: {exc}"
            ) from None
    return episode


class WorldModelOpenEnv(Environment[WorldModelAction, WorldModelObservation, WorldModelState]):
    # Each session has its own WorldModelEnvironment (its own history); the endpoint serves them all.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        base_url: str,
        model: str,
        domain: str,
        prompt_format: str,
        max_history_chars: int | None,
        episode: EpisodeSpec | None = None,
        max_tokens: int = 512,
        temperature: float = 1.0,
        api_key: str = "EMPTY",
        enable_thinking: bool | None = None,
    ):
        super().__init__()
        self._simulator = WorldModelEnvironment(
            base_url,
            model,
            domain,
            prompt_format,
            max_history_chars,
            api_key,
            max_tokens,
            temperature,
            enable_thinking=enable_thinking,
        )
        self._default = episode
        self._episode: EpisodeSpec | None = None
        self._seed = 0
        self._state = WorldModelState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **options: Any) -> WorldModelObservation:
        self._episode = _episode(options, self._default)
        self._seed = int(seed) if seed is not None else secrets.randbits(62)
        initial = self._simulator.reset(self._episode.task, self._episode.system)
        self._state = WorldModelState(
            episode_id=episode_id or str(uuid.uuid4()), task=self._episode.task, seed=self._seed
        )
        return WorldModelObservation(text=initial, reason="the episode starts")

    def step(self, action: WorldModelAction, timeout_s: float | None = None, **kwargs: Any) -> WorldModelObservation:
        # `timeout_s` (OpenEnv's HTTP step only): the world-model client's own timeout and retries bound a step.
        if self._episode is None:
            raise EpisodeError(
                "no episode: reset first. Over HTTP every request gets a fresh environment; an "
                "episode lives in a WebSocket session (/ws, OpenEnv's EnvClient)",
                status=409,
            )
        if self._state.done:
            raise EpisodeError("the episode is over: reset to start another", status=409)
        steps = self._state.step_count + 1
        text = self._simulator.step(action.action, action.control_instructions, seed=step_seed(self._seed, steps))
        outcome = judge(self._episode, text, steps)
        self._state.step_count = steps
        self._state.done = outcome.terminated or outcome.truncated
        self._state.turns = [*self._state.turns, {"action": action.action, "observation": text}]
        return WorldModelObservation(
            text=text,
            thinking=self._simulator.last_thinking,
            truncated=outcome.truncated,
            reason=outcome.reason,
            history_sent=self._simulator.last_history_sent,
            reward=outcome.reward,
            done=self._state.done,
        )

    @property
    def state(self) -> WorldModelState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=ENV_NAME,
            description=f"{self._simulator.model}, a language world model "
            f"simulating the {self._simulator.domain} domain",
        )

    def close(self) -> None:
        self._simulator.client.close()


class WorldModelEnvClient(EnvClient[WorldModelAction, WorldModelObservation, WorldModelState]):
    """OpenEnv's client, typed for this environment (OpenEnv's GenericEnvClient works as well, with dicts)."""

    def _step_payload(self, action: WorldModelAction) -> dict[str, Any]:
        return action.model_dump(exclude_defaults=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[WorldModelObservation]:
        observation = WorldModelObservation(
            **payload.get("observation", {}), reward=payload.get("reward"), done=payload.get("done", False)
        )
        return StepResult(
            observation, reward=payload.get("reward"), done=payload.get("done", False), metadata=payload.get("metadata")
        )

    def _parse_state(self, payload: dict[str, Any]) -> WorldModelState:
        return WorldModelState(**payload)


def read_episode(path: Path) -> EpisodeSpec:
    """The server's episode from a YAML (or JSON) mapping of the fields `reset` takes."""
    import yaml

    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UserFixableError(f"cannot read the episode {path}: {exc}") from None
    if not isinstance(values, dict) or not (values.get("task") or values.get("task_description")):
        raise UserFixableError(f"{path} is not a mapping of episode fields with a `task` ({', '.join(EPISODE_FIELDS)})")
    try:
        return _episode(values, None)
    except EpisodeError as exc:
        raise UserFixableError(f"{path}: {exc}") from None


def _served_model(simulator_url: str, api_key: str) -> str:
    from openai import OpenAI

    with OpenAI(base_url=simulator_url, api_key=api_key, max_retries=2) as client:
        names = [entry.id for entry in client.models.list().data]
    if len(names) != 1:
        raise UserFixableError(f"{simulator_url} serves {len(names)} models ({', '.join(names)}): pass --model")
    return names[0]


def build_app(
    world_model_url: str,
    domain: str,
    episode: EpisodeSpec | None = None,
    *,
    model: str | None = None,
    prompt_format: str | None = None,
    max_history_chars: int | None = None,
    max_sessions: int = 8,
    max_tokens: int = 512,
    temperature: float = 1.0,
    api_key: str = "EMPTY",
    enable_thinking: bool | None = None,
):
    """OpenEnv's FastAPI app over the world model at `world_model_url`. The model name (when the endpoint
    serves one), prompt format, answer format (`enable_thinking`, else the trained one) and history budget
    are read from it once, here, not per session."""
    import openai

    try:
        model = model or _served_model(world_model_url, api_key)
        probe = WorldModelEnvironment(
            world_model_url, model, domain, prompt_format, max_history_chars, api_key, enable_thinking=enable_thinking
        )
    except openai.APIConnectionError:
        raise UserFixableError(
            f"no world model answers at {world_model_url}: start one with `simulacra serve DIR` "
            "(or vLLM) and pass its /v1 URL as --world-model"
        ) from None
    except ValueError as exc:  # not `simulacra serve` and no prompt format given, or an untrained answer format
        raise UserFixableError(str(exc)) from None
    probe.client.close()
    factory = functools.partial(
        WorldModelOpenEnv,
        world_model_url,
        model,
        domain,
        probe.format.name,
        probe.max_history_chars,
        episode,
        max_tokens,
        temperature,
        api_key,
        enable_thinking=probe.thinking,
    )
    app = create_app(
        factory,
        WorldModelAction,
        WorldModelObservation,
        env_name=ENV_NAME,
        max_concurrent_envs=max_sessions,
        state_cls=WorldModelState,
    )

    from fastapi.responses import JSONResponse

    @app.exception_handler(EpisodeError)
    async def episode_error(request, exc: EpisodeError):  # FastAPI's error shape, as OpenEnv's own 422s
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    return app


def serve(world_model_url: str, domain: str, episode: EpisodeSpec | None, host: str, port: int, **options: Any) -> None:
    import uvicorn

    app = build_app(world_model_url, domain, episode, **options)
    print(
        f"serving the {domain} world model at {world_model_url} as an OpenEnv environment: http://{host}:{port} "
        f"(WebSocket ws://{host}:{port}/ws)",
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")
