"""Running a policy for N episodes on any gymnasium environment of text (issue 31, deliver 2): the real
environments of pipeline/environments/ or a simulator asked the same tasks.

    records = run_episodes(Solver(noise=0.1), HouseholdEnv(), household_task, seeds=range(20))
    records = run_episodes(Solver(noise=0.1), simulator, household_task, seeds=range(20),
                           options=TaskSpec.episode_options)   # WorldModelEnv: the task travels in reset's options

Episode `seed` is task `tasks(seed)` (the real environment deals the same task from the same seed), the
environment reset with that seed and, where `options` is given, with `options(task)`. The policy acts
from the task and the observations until one of:
- `success`: the task's own success check passes on the history (the same check for every environment:
  in a simulator it reads the simulated observations);
- `stopped`: the policy has nothing left to do (a plan played to its end without success);
- `terminated`: the environment ended the episode without the check passing;
- `truncated`: the task's step limit, or the environment's, was reached.
Success is the check's verdict, never the environment's reward, so a simulator with no notion of the
task is judged exactly as the real environment.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium

from pipeline.environments.task import TaskSpec
from pipeline.fidelity.policies import Policy


@dataclass(frozen=True)
class EpisodeRecord:
    policy: str
    seed: int
    success: bool
    steps: int
    end: str  # success | stopped | terminated | truncated
    history: tuple[tuple[str, str], ...]  # (action, observation) pairs, oldest first


def run_episode(
    policy: Policy,
    env: gymnasium.Env[str, str],
    task: TaskSpec,
    seed: int,
    options: Mapping[str, Any] | None = None,
) -> EpisodeRecord:
    observation, _ = env.reset(seed=seed, options=dict(options) if options is not None else None)
    actor = policy.start(task, seed)
    history: list[tuple[str, str]] = []
    end = "truncated"
    while len(history) < task.max_steps:
        action = actor.act(observation)
        if action is None:
            end = "stopped"
            break
        observation, _, terminated, truncated, _ = env.step(action)
        history.append((action, observation))
        if task.success(history):
            end = "success"
            break
        if terminated or truncated:
            end = "terminated" if terminated else "truncated"
            break
    return EpisodeRecord(policy.name, seed, end == "success", len(history), end, tuple(history))


def run_episodes(
    policy: Policy,
    env: gymnasium.Env[str, str],
    tasks: Callable[[int], TaskSpec],
    seeds: Iterable[int],
    options: Callable[[TaskSpec], Mapping[str, Any]] | None = None,
) -> list[EpisodeRecord]:
    records = []
    for seed in seeds:
        task = tasks(seed)
        records.append(run_episode(policy, env, task, seed, options(task) if options is not None else None))
    return records
