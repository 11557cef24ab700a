"""Policy episodes in a simulator (issue 31, deliver 2): many at once against a served model, or one at a time
in a simulator that is not served.

- `play_together`: the episodes of one environment's tasks against `simulacra serve`, through the vector
  environment (pipeline/serving/vector_env.py), `width` of them stepping together so the server decodes their
  requests in one batch. A slot whose episode ends takes the next episode waiting (a reset of that slot alone,
  which sends no request) while the others go on. Each episode is exactly pipeline/fidelity/episodes.py's
  `run_episode` on that slot's `WorldModelEnv`: reset with the task's seed and `episode_options()`, the policy
  acting from the observations until the task's own check passes (`success`), the policy has nothing left to do
  (`stopped`), the environment ends it (`terminated`, `truncated`: the task's step limit travels in the options).
  A request that failed after its retries ends that episode only (`failed`, with the error): the simulator's
  endpoint failed, not the simulator, and the fidelity stage plays it again next run. A request the server
  refuses because the system prompt and the action alone pass the model's context length (`ContextExhausted`)
  ends it `context_exhausted`: the simulator cannot play that task at all, the same every run, an episode
  without success. When every request of a step fails the vector environment raises the first failure; a
  context one ends every episode in flight so (in practice one domain's prompts are all too long for a model,
  or none is), any other is raised: the server is down, and the stage stops there to resume. Once no episode waits, a
  slot whose episode ended is still stepped by the vector environment (gymnasium steps every sub-environment),
  every other step, its answer dropped: a few requests at the end, not a change to any episode.
- `SimulatorEnv`: any `Simulator` of pipeline/fidelity/simulators.py as a gymnasium environment with
  `WorldModelEnv`'s interface (the task in reset's options, text in and out, the step limit truncating), so a
  simulator that is not served, the retrieval baseline, plays the same episodes through `run_episode`.
"""

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gymnasium

from pipeline.environments.task import TaskSpec
from pipeline.evaluation.scoring import GENERATION_FAILED
from pipeline.fidelity.episodes import EpisodeRecord
from pipeline.fidelity.policies import Actor, Policy
from pipeline.fidelity.simulators import Simulator, SimulatorRequest
from pipeline.serving.environment import ContextExhausted
from pipeline.serving.episode import EpisodeSpec, judge
from pipeline.serving.gym_env import TextOf
from pipeline.store.schema import ScoredTurn

FAILED = "failed"  # how an episode whose request to the simulator failed ends
CONTEXT_EXHAUSTED = "context_exhausted"  # how one ends whose prompt the model's context cannot hold


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to play: a policy on task `seed` of an environment."""

    environment: str
    policy: Policy
    seed: int
    task: TaskSpec


@dataclass
class _Slot:
    job: EpisodeJob
    actor: Actor
    observation: str
    history: list[tuple[str, str]]


# Told of every episode as it ends: the job, its record, and the error of a failed request (else None).
EpisodeEnded = Callable[[EpisodeJob, EpisodeRecord, str | None], None]


def play_together(
    base_url: str,
    model: str,
    domain: str,
    jobs: Sequence[EpisodeJob],
    width: int,
    ended: EpisodeEnded,
    **env_options: Any,
) -> None:
    """Play `jobs` (all of `domain`) against the served `model`, at most `width` at once; `env_options` are
    `WorldModelEnv`'s (max_tokens, temperature, ...)."""
    from pipeline.serving.vector_env import EPISODES_OPTION, RESET_MASK_OPTION, WorldModelVectorEnv

    if not jobs:
        return
    waiting = deque(jobs)
    first = [waiting.popleft() for _ in range(min(width, len(jobs)))]
    envs = WorldModelVectorEnv(base_url, model, domain, [_spec(job) for job in first], **env_options)
    try:
        observations, _ = envs.reset(seed=[job.seed for job in first])
        slots: list[_Slot | None] = [_start(job, observation) for job, observation in zip(first, observations)]
        actions = [""] * len(slots)  # an emptied slot repeats its last action, whose answer is dropped

        def refill(i: int) -> None:
            """The next waiting episode in slot i, reset alone (no request); or the slot stays empty."""
            slots[i] = None
            if waiting:
                job = waiting.popleft()
                mask = [k == i for k in range(len(slots))]
                episodes: list[EpisodeSpec | None] = [_spec(job) if k == i else None for k in range(len(slots))]
                seeds: list[int | None] = [job.seed if k == i else None for k in range(len(slots))]
                observed, _ = envs.reset(seed=seeds, options={EPISODES_OPTION: episodes, RESET_MASK_OPTION: mask})
                slots[i] = _start(job, observed[i])

        while any(slots):
            for i in range(len(slots)):
                while (slot := slots[i]) is not None:
                    if len(slot.history) >= slot.job.task.max_steps:
                        ended(slot.job, _record(slot, "truncated"), None)
                    elif (action := slot.actor.act(slot.observation)) is None:
                        ended(slot.job, _record(slot, "stopped"), None)
                    else:
                        actions[i] = action
                        break
                    refill(i)
            if not any(slots):
                break
            try:
                observations, _, terminated, truncated, infos = envs.step(actions)
            except ContextExhausted as exc:  # every request failed, the first for the context: see the docstring
                for i, slot in enumerate(slots):
                    if slot is not None:
                        ended(slot.job, _record(slot, CONTEXT_EXHAUSTED), f"{type(exc).__name__}: {exc}")
                        refill(i)
                continue
            errors, failed = infos.get("error"), infos.get("_error")
            for i, slot in enumerate(slots):
                if slot is None:
                    continue
                if failed is not None and failed[i]:
                    error = str(errors[i])  # type: ignore[index]  # masked: set
                    refused = error.startswith(ContextExhausted.__name__)
                    ended(slot.job, _record(slot, CONTEXT_EXHAUSTED if refused else FAILED), error)
                    refill(i)
                    continue
                slot.observation = observations[i]
                slot.history.append((actions[i], observations[i]))
                ending = _end(slot, bool(terminated[i]), bool(truncated[i]))
                if ending is not None:
                    ended(slot.job, _record(slot, ending), None)
                    refill(i)
    finally:
        envs.close()


def _spec(job: EpisodeJob) -> EpisodeSpec:
    return EpisodeSpec.from_mapping(job.task.episode_options())


def _start(job: EpisodeJob, observation: str) -> _Slot:
    return _Slot(job, job.policy.start(job.task, job.seed), observation, [])


def _end(slot: _Slot, terminated: bool, truncated: bool) -> str | None:
    """How the episode ends after its last step, in `run_episode`'s order: the check first."""
    if slot.job.task.success(slot.history):
        return "success"
    if terminated or truncated:
        return "terminated" if terminated else "truncated"
    return None


def _record(slot: _Slot, end: str) -> EpisodeRecord:
    history = tuple(slot.history)
    return EpisodeRecord(slot.job.policy.name, slot.job.seed, end == "success", len(history), end, history)


class SimulatorEnv(gymnasium.Env[str, str]):
    """A `Simulator` as a text gymnasium environment of one domain. `reset(seed=..., options=...)` takes the
    episode as `WorldModelEnv` does (`TaskSpec.episode_options()`: the task description, the system parts, the
    step limit); each step asks the simulator the action with the episode's history so far. A failed generation
    raises, as a failed request does in `WorldModelEnv`."""

    metadata = {"render_modes": []}
    observation_space: TextOf  # gymnasium declares a Space; this one has a max_length

    def __init__(self, simulator: Simulator, domain: str, max_observation_chars: int = 1 << 20):
        self.simulator = simulator
        self.domain = domain
        self.action_space = TextOf(max_length=4096)
        self.observation_space = TextOf(max_length=max_observation_chars)
        self.episode = EpisodeSpec("")
        self.history: list[tuple[str, str]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if options:
            self.episode = EpisodeSpec.from_mapping(options)
        self.history = []
        return (self.episode.system.initial_state or "")[: self.observation_space.max_length], {
            "task": self.episode.task
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        system = replace(self.episode.system, task_description=self.episode.task)
        history = tuple(ScoredTurn(i, a, o, "history", 1.0) for i, (a, o) in enumerate(self.history))
        request = SimulatorRequest("episode", len(history), self.domain, system, None, history, action)
        [prediction] = self.simulator.observations([request])
        if prediction.status == GENERATION_FAILED:
            raise RuntimeError(f"{self.simulator.name}: the generation failed: {prediction.error}")
        observation = (prediction.observation or "")[: self.observation_space.max_length]
        self.history.append((action, observation))
        outcome = judge(self.episode, observation, len(self.history))
        return observation, outcome.reward, outcome.terminated, outcome.truncated, {"reason": outcome.reason}
