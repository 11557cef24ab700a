"""What the three real environments share as `gymnasium.Env[str, str]`: seeding, the episode's steps,
its success check and its step limit (issue 31, deliver 2).

    env = HouseholdEnv()
    observation, info = env.reset(seed=7)        # deals the corpus's game 7; info["task_spec"] is its TaskSpec
    observation, reward, terminated, truncated, info = env.step("go to countertop 1")

`reset(seed=s)` deals task `s` exactly as the demo corpus builder deals its trajectory `s` (a seed is
the builder's index), so seeds 0..N-1 are the tasks of the corpus's N trajectories of that domain and
later seeds continue the same draw; without a seed, the index is drawn from `np_random`. `options`
are refused: the task is the seed's. The initial observation is the task's initial state
(`system.initial_state`, "" where the corpus has none), as the simulator's `WorldModelEnv` returns it.
`step(action)` runs the action in the real engine and returns its real observation; the episode's
success check (`TaskSpec.success`) judges the history after every step: reward 1.0 and `terminated` on
the step that succeeds, `truncated` at `max_steps`. Actions and observations are text (`TextOf`, the
simulator's spaces).
"""

from abc import abstractmethod
from typing import Any

import gymnasium

from pipeline.environments.task import TaskSpec
from pipeline.serving.gym_env import TextOf

SUCCESS_REWARD = 1.0
# Without a seed, the task index is drawn from np_random in [0, MAX_DRAWN_INDEX): every index deals a task.
MAX_DRAWN_INDEX = 2**31


class RealEnvironment(gymnasium.Env[str, str]):
    metadata = {"render_modes": ["ansi"]}
    observation_space: TextOf

    def __init__(
        self, *, render_mode: str | None = None, max_action_chars: int = 4096, max_observation_chars: int = 1 << 20
    ):
        self.action_space = TextOf(max_length=max_action_chars)
        self.observation_space = TextOf(max_length=max_observation_chars)
        self.render_mode = render_mode
        self.task_spec: TaskSpec | None = None
        self.history: list[tuple[str, str]] = []

    @abstractmethod
    def deal(self, index: int) -> TaskSpec:
        """Deal task `index` as the corpus builder does, and set the engine up for it."""

    @abstractmethod
    def run(self, action: str) -> tuple[str, dict[str, Any]]:
        """The real observation of `action`, and what else the engine reports about it."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if options:
            raise ValueError(
                f"{type(self).__name__} deals its task from the seed; it takes no options ({sorted(options)})"
            )
        index = seed if seed is not None else int(self.np_random.integers(0, MAX_DRAWN_INDEX))
        self.task_spec = self.deal(index)
        self.history = []
        observation = (self.task_spec.system.initial_state or "")[: self.observation_space.max_length]
        return observation, {"index": index, "task": self.task_spec.task, "task_spec": self.task_spec}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task_spec is None:
            raise RuntimeError("step before reset: call reset(seed=...) first")
        observation, info = self.run(action)
        observation = observation[: self.observation_space.max_length]
        self.history.append((action, observation))
        succeeded = self.task_spec.success(self.history)
        truncated = not succeeded and len(self.history) >= self.task_spec.max_steps
        info["steps"] = len(self.history)
        return observation, SUCCESS_REWARD if succeeded else 0.0, succeeded, truncated, info

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.task_spec is None:
            return None
        lines = [f"task: {self.task_spec.task}"]
        for action, observation in self.history:
            lines += [f"> {action}", observation]
        return "\n".join(lines)
