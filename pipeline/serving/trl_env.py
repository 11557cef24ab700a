"""The simulated environment for TRL's `GRPOTrainer(environment_factory=...)` (TRL 1.16, issue 19,
deliver 3): the policy acts by calling the `act` tool, the world model answers as the environment.

    factory = world_model_environment_factory("http://127.0.0.1:8000/v1", "simulacra-world-model-...", "terminal")
    trainer = GRPOTrainer(model=policy, args=GRPOConfig(...), train_dataset=episodes, environment_factory=factory)

TRL makes one instance per rollout and calls `reset(**example)` with the dataset row: each row is an
episode (`prompt` for the policy, `task`, the system-prompt parts by name, and any of `verifier`,
`success_pattern`, `max_steps`, `seed`: pipeline/serving/episode.py). `reset` returns the initial
state, which TRL appends to the policy's last user message. Every public method is a tool TRL shows
the policy, described from its signature and docstring: here only `act`. `get_reward` is the
episode's reward (1.0 when the task was done, else 0.0), which TRL adds as a reward source.
Without a `seed` column an episode's seed comes from the rollout's position, so rollouts of one
prompt sample different observations (a GRPO group needs that spread) and a rerun gives the same.
"""

import functools
import itertools
from typing import Any

from pipeline.serving.environment import WorldModelEnvironment
from pipeline.serving.episode import EpisodeSpec, checked_ends, judge, step_seed

_ROLLOUTS = itertools.count()
EPISODE_OVER = "The episode is over: no action has an effect now."


class WorldModelToolEnv:
    def __init__(
        self,
        base_url: str,
        model: str,
        domain: str,
        prompt_format: str | None = None,
        max_history_chars: int | None = None,
        max_tokens: int = 512,
        temperature: float = 1.0,
        api_key: str = "EMPTY",
        enable_thinking: bool | None = None,
    ):
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
        self._episode = EpisodeSpec("")
        self._seed = 0
        self._steps = 0
        self._reward = 0.0
        self._done = False

    def reset(self, **example: Any) -> str | None:
        # The row's other columns (`prompt`, the dataset's own) are TRL's and the user's: not refused as misspelt.
        self._episode = checked_ends(EpisodeSpec.from_mapping(example))
        seed = example.get("seed")
        self._seed = int(seed) if seed is not None else next(_ROLLOUTS)
        self._steps, self._reward, self._done = 0, 0.0, False
        initial = self._simulator.reset(self._episode.task, self._episode.system)
        return initial or None

    def act(self, action: str) -> str:
        """Take one action in the environment and return what the environment shows after it.

        Args:
            action: The action, written as the environment expects it (a shell command, a tool call, a game command).
        """
        if self._done:
            return EPISODE_OVER
        # Counted once answered: a request that failed (TRL shows the policy its error) is no step of the episode.
        steps = self._steps + 1
        observation = self._simulator.step(action, seed=step_seed(self._seed, steps))
        self._steps = steps
        outcome = judge(self._episode, observation, self._steps)
        self._reward += outcome.reward
        self._done = outcome.terminated or outcome.truncated
        return observation

    def get_reward(self) -> float:
        return self._reward


def world_model_environment_factory(base_url: str, model: str, domain: str, **options: Any):
    """The zero-argument factory `GRPOTrainer(environment_factory=...)` takes; `options` are
    WorldModelToolEnv's (prompt_format, max_history_chars, max_tokens, temperature, api_key, enable_thinking)."""
    return functools.partial(WorldModelToolEnv, base_url, model, domain, **options)
