"""The simulated environment as a `gymnasium.Env` (issue 19, deliver 3): what gymnasium-based agent
RL code (and `gymnasium.utils.env_checker.check_env`) expects.

    env = WorldModelEnv("http://127.0.0.1:8000/v1", "simulacra-world-model-...", "terminal",
                        EpisodeSpec("Count the lines of notes.txt", SystemPrompt(action_space="bash"),
                                    success_pattern=r"^\\s*3\\b", max_steps=20))
    observation, info = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("wc -l notes.txt")

Observations and actions are text (`TextOf`: any string up to a length, where gymnasium's `Text`
admits only its sampling alphabet). `reset(seed=..., options=...)`: the seed seeds `np_random`, from
which the episode's seed is drawn, so the same seed gives the same episode (pipeline/serving/episode.py);
`options` may replace the episode (`task`, the system parts by name, `verifier`, `success_pattern`,
`max_steps`). The initial observation is the initial state. `enable_thinking` asks for the thinking or
the direct answer (default: the model's trained format; a direct answer has no thinking). `info` holds
the thinking of a thinking answer (None for a direct one), the outcome's reason and how many history
turns the request carried (the history is shortened as training shortened it,
pipeline/serving/environment.py).
"""

from typing import Any

import gymnasium
from gymnasium import spaces

from pipeline.serving.environment import WorldModelEnvironment
from pipeline.serving.episode import EpisodeSpec, checked_ends, episode_fields, judge, step_seed


class TextOf(spaces.Text):
    """Any text of at most `max_length` characters. Sampling (for checkers and random agents) draws from
    gymnasium's default alphanumeric alphabet; membership admits every character, since observations
    are whatever the environment prints."""

    def __init__(self, max_length: int, **options: Any):
        # From no character up, where gymnasium's Text starts at one: `mkdir x` prints nothing, and an episode
        # without an initial state starts from nothing (issue 29.7: check_env failed on reset's "").
        super().__init__(max_length, **{"min_length": 0, **options})

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


class WorldModelEnv(gymnasium.Env[str, str]):
    metadata = {"render_modes": ["ansi"]}
    observation_space: TextOf  # gymnasium declares a Space; these have a max_length
    action_space: TextOf

    def __init__(
        self,
        base_url: str,
        model: str,
        domain: str,
        episode: EpisodeSpec,
        *,
        prompt_format: str | None = None,
        max_history_chars: int | None = None,
        max_tokens: int = 512,
        temperature: float = 1.0,
        max_action_chars: int = 4096,
        max_observation_chars: int = 1 << 20,
        render_mode: str | None = None,
        api_key: str = "EMPTY",
        enable_thinking: bool | None = None,
    ):
        self.simulator = WorldModelEnvironment(
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
        self.episode = checked_ends(episode)
        self.action_space = TextOf(max_length=max_action_chars)
        self.observation_space = TextOf(max_length=max_observation_chars)
        self.render_mode = render_mode
        self._episode_seed = 0
        self._steps = 0
        self._reset_done = False  # a step before the first reset has no episode to belong to
        self._ended: str | None = None  # how the episode ended, once it has: a step after it is refused

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if options:
            self.episode = episode_fields(options)  # a misspelt field is refused, not an episode without it
        self._episode_seed = int(self.np_random.integers(0, 2**62))
        self._steps = 0
        self._reset_done = True
        self._ended = None
        observation = self.simulator.reset(self.episode.task, self.episode.system)
        return observation[: self.observation_space.max_length], {"task": self.episode.task}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._reset_done:
            raise gymnasium.error.ResetNeeded("step before reset: call reset() to start an episode")
        if self._ended is not None:  # as OpenEnv's 409 and TRL's EPISODE_OVER; a vector env resets first itself
            raise gymnasium.error.ResetNeeded(
                f"the episode is over ({self._ended} at step {self._steps}): call reset() to start another"
            )
        if not self.action_space.contains(action):  # else the server's 400 about `messages.3.content.str`
            raise ValueError(
                f"the action must be text of at most {self.action_space.max_length} characters, "
                f"not {type(action).__name__}" + (f" of {len(action)}" if isinstance(action, str) else "")
            )
        # Counted once answered: a failed request (the server down, a timeout) is no step, and retrying it
        # asks with the same seed.
        steps = self._steps + 1
        observation = self.simulator.step(action, seed=step_seed(self._episode_seed, steps))
        self._steps = steps
        observation = observation[: self.observation_space.max_length]
        outcome = judge(self.episode, observation, self._steps)
        if outcome.terminated or outcome.truncated:
            self._ended = "terminated" if outcome.terminated else "truncated"
        info = {
            "thinking": self.simulator.last_thinking,
            "reason": outcome.reason,
            "history_sent": self.simulator.last_history_sent,
            "steps": self._steps,
        }
        return observation, outcome.reward, outcome.terminated, outcome.truncated, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        lines = [f"task: {self.episode.task}"]
        for action, observation in self.simulator.history:
            lines += [f"> {action}", observation]
        return "\n".join(lines)
