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
import secrets
import socket
import uuid
from typing import Any

from pydantic import Field

from pipeline.errors import UserFixableError
from pipeline.serving.environment import WorldModelEnvironment
from pipeline.serving.episode import EpisodeError, EpisodeSpec, episode_from_options, judge, step_seed
from pipeline.serving.openenv_preflight import OPENENV_MISSING, ServedWorldModel

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
except ModuleNotFoundError as exc:  # openenv itself, or one of the modules it imports (fastmcp, ...)
    missing = (exc.name or "openenv").split(".")[0]
    raise UserFixableError(OPENENV_MISSING.format(module=missing)) from None

ENV_NAME = "simulacra_world_model"


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
        self._episode = episode_from_options(options, self._default)
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


def build_app(
    served: ServedWorldModel,
    domain: str,
    episode: EpisodeSpec | None = None,
    *,
    max_sessions: int = 8,
    max_tokens: int = 512,
    temperature: float = 1.0,
    api_key: str = "EMPTY",
):
    """OpenEnv's FastAPI app over the world model `served` describes (`probe_world_model`: its name, prompt
    and answer format and history budget, read from the endpoint once, not per session)."""
    factory = functools.partial(
        WorldModelOpenEnv,
        served.url,
        served.model,
        domain,
        served.prompt_format,
        served.max_history_chars,
        episode,
        max_tokens,
        temperature,
        api_key,
        enable_thinking=served.thinking,
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


def serve(
    served: ServedWorldModel,
    domain: str,
    episode: EpisodeSpec | None,
    sock: socket.socket,
    host: str,
    **options: Any,
) -> None:
    """Serve on `sock`, bound to `host` and its port before the command's slower refusals
    (pipeline/serving/listening.py)."""
    import uvicorn

    from pipeline.serving.listening import bound_port

    port = bound_port(sock)  # the one asked for, or the system's pick for --port 0
    app = build_app(served, domain, episode, **options)
    print(
        f"serving the {domain} world model at {served.url} as an OpenEnv environment: http://{host}:{port} "
        f"(WebSocket ws://{host}:{port}/ws)",
        flush=True,
    )
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run(sockets=[sock])
