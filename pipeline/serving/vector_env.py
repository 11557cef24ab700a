"""Many simulated episodes stepped together (issue 31, deliver 4): a `gymnasium.vector.VectorEnv` of
`WorldModelEnv`s (pipeline/serving/gym_env.py) whose `step` sends the sub-environments' requests to the server at
once, one thread each, so `simulacra serve` decodes them in one batch (continuous batching,
pipeline/llm/batching.py), where episodes run one at a time keep its batch one row wide.

    envs = WorldModelVectorEnv("http://127.0.0.1:8000/v1", "simulacra-world-model-...", "terminal",
                               [EpisodeSpec("Count the lines of notes.txt", ...), EpisodeSpec("Find ...", ...)])
    observations, infos = envs.reset(seed=0)  # sub-environment i seeded 0 + i
    observations, rewards, terminated, truncated, infos = envs.step(["wc -l notes.txt", "ls -1 logs"])

- Spaces. A sub-environment's are `WorldModelEnv`'s (`single_observation_space`, `single_action_space`: text);
  the batched ones are gymnasium's batching of text, a `Tuple` of `num_envs` of them: observations come as a
  tuple of strings, actions go as any sequence of `num_envs` strings. Rewards, terminations and truncations are
  arrays of shape (num_envs,); infos a dict of arrays, each key with its `_key` mask (gymnasium's convention).
- Seeds. `reset(seed=s)` seeds sub-environment i with s + i (as gymnasium's SyncVectorEnv does), or takes a list
  of one seed per sub-environment. Each sub-environment is a `WorldModelEnv` with its own history, seed and
  episode, so its episodes are exactly that environment's with the same seed and actions, the autoreset ones
  after the first included (tested against the server).
- Episodes. One `EpisodeSpec` per sub-environment at construction (`num_envs` is how many). `reset(options=...)`
  takes `WorldModelEnv`'s options, one episode for every sub-environment; or `episodes`, one per sub-environment
  (a mapping of the episode's fields, an `EpisodeSpec`, or None to keep the one it has); and gymnasium's
  `reset_mask`, which resets only the sub-environments it marks (to start the next task in a slot whose episode
  ended while the others run on).
- Autoreset: `NEXT_STEP`, gymnasium's default (`metadata["autoreset_mode"]`). The step after a sub-episode ends
  resets that sub-environment instead of stepping it: its action is ignored, its observation is the new
  episode's first (the initial state: a reset sends no request), its reward 0, terminated and truncated False,
  its info the reset's (`task`).
- A failed request ends its sub-episode and no other: the others' steps are returned as usual, and the failed
  one is reported truncated, reward 0, its observation the one before (nothing was simulated), `infos["error"]`
  the failure's type and message; it is autoreset at the next step like any ended episode. Only when every
  request of a step fails (the server is down) does the step raise, the first failure, as `WorldModelEnv` would:
  then no sub-environment has stepped or been reset, so nothing is lost, and a training loop does not spin on
  episodes that cannot run.
"""

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from pipeline.serving.episode import EpisodeSpec, checked_ends, episode_fields
from pipeline.serving.gym_env import WorldModelEnv

# What `reset(options=...)` reads itself; every other key is an episode field for every sub-environment.
EPISODES_OPTION = "episodes"
RESET_MASK_OPTION = "reset_mask"


class WorldModelVectorEnv(VectorEnv[tuple[str, ...], Sequence[str], np.ndarray]):
    metadata = {"render_modes": ["ansi"], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, base_url: str, model: str, domain: str, episodes: Sequence[EpisodeSpec], **env_options: Any):
        """One sub-environment per episode; `env_options` are `WorldModelEnv`'s keyword arguments (max_tokens,
        temperature, enable_thinking, ...), the same for every sub-environment."""
        if not episodes:
            raise ValueError("a vector environment needs one episode at least")
        self.envs = [WorldModelEnv(base_url, model, domain, episode, **env_options) for episode in episodes]
        self.num_envs = len(self.envs)
        self.render_mode = self.envs[0].render_mode
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._observations = [""] * self.num_envs
        self._ended = np.zeros(self.num_envs, dtype=np.bool_)  # autoreset at the next step
        # A thread per sub-environment: each waits on its own request, so all are in flight together.
        self._requests = ThreadPoolExecutor(max_workers=self.num_envs, thread_name_prefix="world-model-request")

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        seeds = self._seeds(seed)
        options = dict(options or {})
        mask = self._reset_mask(options.pop(RESET_MASK_OPTION, None))
        # Every episode checked before any sub-environment resets: a bad third one left the first two reset and
        # the call failed, half done.
        episodes = [self._checked(episode) for episode in self._episodes(options)]
        infos: dict[str, Any] = {}
        for i in map(int, np.flatnonzero(mask)):
            self._observations[i], info = self._reset_one(i, seeds[i], episodes[i])
            infos = self._add_info(infos, info, i)
        self._ended[mask] = False
        return tuple(self._observations), infos

    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = tuple(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions for {self.num_envs} sub-environments: give one each")
        stepping = [i for i in range(self.num_envs) if not self._ended[i]]
        requests = {i: self._requests.submit(self.envs[i].step, actions[i]) for i in stepping}
        stepped: dict[int, tuple[str, float, bool, bool, dict[str, Any]]] = {}
        failed: dict[int, Exception] = {}
        for i, request in requests.items():  # every request finishes before anything is returned or raised
            try:
                stepped[i] = request.result()
            except Exception as exc:  # noqa: BLE001 - one episode's failure is reported in its info (docstring)
                failed[i] = exc
        if stepping and len(failed) == len(stepping):
            raise failed[stepping[0]]
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            if self._ended[i]:
                self._observations[i], info = self.envs[i].reset()
            elif i in failed:
                truncated[i] = True
                error = f"{type(failed[i]).__name__}: {failed[i]}"
                info = {"error": error, "reason": f"the request failed, which ends the episode: {error}"}
            else:
                self._observations[i], rewards[i], terminated[i], truncated[i], info = stepped[i]
            infos = self._add_info(infos, info, i)
        self._ended = terminated | truncated
        return tuple(self._observations), rewards, terminated, truncated, infos

    def render(self) -> tuple[str, ...] | None:
        """Each sub-environment's `WorldModelEnv.render`: in "ansi" mode its task and trajectory as text."""
        if self.render_mode != "ansi":
            return None
        return tuple(env.render() or "" for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        self._requests.shutdown(wait=True)
        for env in self.envs:
            env.simulator.client.close()
            env.close()

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, int):
            return [seed + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"{len(seed)} seeds for {self.num_envs} sub-environments: give one each, or one int")
        return list(seed)

    def _reset_mask(self, mask: Any) -> np.ndarray:
        if mask is None:
            return np.ones(self.num_envs, dtype=np.bool_)
        mask = np.asarray(mask)
        if mask.dtype != np.bool_ or mask.shape != (self.num_envs,):
            raise ValueError(
                f"options['{RESET_MASK_OPTION}'] must be {self.num_envs} booleans (one per sub-environment), "
                f"got {mask.dtype} of shape {mask.shape}"
            )
        return mask

    def _episodes(self, options: dict[str, Any]) -> list[EpisodeSpec | Mapping[str, Any] | None]:
        """Each sub-environment's next episode: None keeps the one it has."""
        episodes = options.pop(EPISODES_OPTION, None)
        if episodes is None:
            return [options or None] * self.num_envs  # WorldModelEnv's options, for every sub-environment
        if options:
            raise ValueError(
                f"options hold `{EPISODES_OPTION}`, one episode per sub-environment, and also episode fields for "
                f"all of them ({', '.join(sorted(options))}): give one or the other"
            )
        if len(episodes) != self.num_envs:
            raise ValueError(f"{len(episodes)} episodes for {self.num_envs} sub-environments: give one each")
        return list(episodes)

    @staticmethod
    def _checked(episode: EpisodeSpec | Mapping[str, Any] | None) -> EpisodeSpec | None:
        """An episode as given (its fields checked, `WorldModelEnv.reset`'s way), or None to keep the one there."""
        if episode is None:
            return None
        return checked_ends(episode) if isinstance(episode, EpisodeSpec) else episode_fields(dict(episode))

    def _reset_one(self, i: int, seed: int | None, episode: EpisodeSpec | None) -> tuple[str, dict[str, Any]]:
        env = self.envs[i]
        if episode is not None:
            env.episode = episode
        return env.reset(seed=seed)
