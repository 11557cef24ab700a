"""The demo's three real environments by domain: what policy agreement (pipeline/fidelity/agreement.py) plays the
policies in, and what deals the tasks a simulator is asked (`fidelity.environments` names them).

    kind = DEMO_ENVIRONMENTS["terminal"]
    env, task = kind.make(), kind.task(3)    # a TerminalEnv, and the TaskSpec its reset(seed=3) deals
"""

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.environments.base import RealEnvironment
from pipeline.environments.bookstore_env import BookstoreEnv, bookstore_task
from pipeline.environments.household_env import HouseholdEnv, household_task
from pipeline.environments.task import TaskSpec
from pipeline.environments.terminal_env import TerminalEnv, terminal_task


@dataclass(frozen=True)
class DemoEnvironment:
    domain: str
    make: Callable[[], RealEnvironment]  # a fresh environment over the real engine
    task: Callable[[int], TaskSpec]  # task `seed`, as the environment deals it from that seed


DEMO_ENVIRONMENTS: dict[str, DemoEnvironment] = {
    kind.domain: kind
    for kind in (
        DemoEnvironment("terminal", TerminalEnv, terminal_task),
        DemoEnvironment("mcp", BookstoreEnv, bookstore_task),
        DemoEnvironment("text-game", HouseholdEnv, household_task),
    )
}
