"""A ladder of scripted policies of graded quality (issue 31, deliver 2): the policies whose success
rates a simulator must rank as the real environment does.

    for policy in policy_ladder():                  # solver, solver-noise-0.1, -0.25, -0.5, random
        actor = policy.start(task, seed)            # task: the episode's TaskSpec
        action = actor.act(observation)             # None: the policy has nothing left to do

- `Solver()` knows the task: it plays the episode's `solution`, the plan the environment made from the
  dealt ground truth (pipeline/environments/task.py).
- `Solver(noise=p)` is the same plan with slips: at each step, with probability p, the planned action
  is replaced by a random one from the episode's vocabulary and the plan moves on without it (an agent
  that forgot a step, not one that takes a detour and comes back). Three rates, NOISE_RATES, chosen so
  success is graded in every real environment: the plans hold 3 to 10 actions of which 1 to 8 are
  needed, so success falls roughly as (1 - p)^needed (measured rates: tests/test_policies.py).
- `RandomPolicy()` draws every action from the vocabulary, until the step limit ends the episode.

Every policy acts open-loop: its actions depend on the task, the seed and the step, never on the
observations. The ladder measures a simulator, so the policies must behave the same in the real
environment and in the simulator, where observations may be wrong: a policy that read them would take
other actions after a wrong observation, and the two success rates would compare two different
behaviours rather than one behaviour judged twice. Open-loop, the episodes are the same action for
action, and the only difference is what the environment answers (and hence what the success check
reads). The noisy solvers draw from one stream per seed (`random.Random(f"solver/{seed}")`), a slip
draw and a replacement at every step whatever the rate: common random numbers, so a step that slips
at rate 0.1 slips at 0.25 and 0.5 too, with the same replacement, and the ladder's order does not rest
on sampling luck. The same seed and observations give the same actions, in any environment: a
policy sees nothing of it but the task spec and the observations.
"""

import random
from dataclasses import dataclass
from typing import Protocol

from pipeline.environments.task import TaskSpec

NOISE_RATES = (0.1, 0.25, 0.5)


class Actor(Protocol):
    """A policy in one episode."""

    def act(self, observation: str) -> str | None: ...


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def start(self, task: TaskSpec, seed: int) -> Actor: ...


class PlanActor:
    def __init__(self, plan: tuple[str, ...], vocabulary: tuple[str, ...], noise: float, rng: random.Random):
        self.plan = plan
        self.vocabulary = vocabulary
        self.noise = noise
        self.rng = rng
        self.step = 0

    def act(self, observation: str) -> str | None:
        if self.step >= len(self.plan):
            return None
        planned = self.plan[self.step]
        self.step += 1
        # Both draws at every step, used or not: every rate sees the same slips and replacements.
        slip, replacement = self.rng.random(), self.rng.choice(self.vocabulary)
        return replacement if slip < self.noise else planned


class RandomActor:
    def __init__(self, vocabulary: tuple[str, ...], rng: random.Random):
        self.vocabulary = vocabulary
        self.rng = rng

    def act(self, observation: str) -> str | None:
        return self.rng.choice(self.vocabulary)


@dataclass(frozen=True)
class Solver:
    noise: float = 0.0  # the probability that a step's planned action is replaced by a random one

    @property
    def name(self) -> str:
        return "solver" if self.noise == 0 else f"solver-noise-{self.noise:g}"

    def start(self, task: TaskSpec, seed: int) -> Actor:
        return PlanActor(task.solution, task.vocabulary, self.noise, random.Random(f"solver/{seed}"))


@dataclass(frozen=True)
class RandomPolicy:
    @property
    def name(self) -> str:
        return "random"

    def start(self, task: TaskSpec, seed: int) -> Actor:
        return RandomActor(task.vocabulary, random.Random(f"random/{seed}"))


def policy_ladder() -> list[Policy]:
    """Best first: the solver, the solver at each noise rate, the random policy."""
    return [Solver(), *(Solver(noise) for noise in NOISE_RATES), RandomPolicy()]
