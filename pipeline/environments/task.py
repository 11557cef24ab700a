"""An episode's task as the real environment deals it and as a simulator must be asked it (issue 31).

A `TaskSpec` is what a real environment (household_env.py, bookstore_env.py, terminal_env.py) deals
from a seed, and what makes the same episode askable of a simulator and judgeable there:

- `domain`, `task` and `system`: the domain name, the task and the system-prompt parts exactly as the
  corpus's trajectories of that domain carry them once ingested (data/demo, read by its format
  adapter), so the world model is asked an episode like its training data. The world model's prompt
  is rendered from `system` alone (its `task_description` included); `task` is what the agent is
  asked to do, which for two of the three domains appears nowhere in that prompt (a terminal
  trajectory's system prompt describes the terminal, a tool-call one has its tools only);
  `episode_options` gives the simulator exactly `system`.
- `success`: the episode's success check, a function of the (action, observation) pairs alone. The
  simulator has no state to inspect, so the same check must judge a real episode from real
  observations and a simulated one from simulated observations (issue 31: "Success in the simulator is
  judged by the episode's own success check, applied to the simulated observations"). A check does
  not depend on the literal value of anything the environment makes up at run time (a new order's
  id, a return's id).
- `solution`: actions that do the task, planned from the dealt ground truth (the solver's plan,
  pipeline/fidelity/policies.py); `vocabulary`: plausible actions of this episode, the pool a random
  policy draws from.
- `max_steps`: the step limit; the episode is truncated there.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.store.schema import SystemPrompt

# An episode so far: its (action, observation) pairs, oldest first.
History = Sequence[tuple[str, str]]


class SuccessCheck(Protocol):
    def __call__(self, history: History) -> bool: ...


@dataclass(frozen=True)
class TaskSpec:
    domain: str
    task: str
    system: SystemPrompt
    success: SuccessCheck
    solution: tuple[str, ...]
    vocabulary: tuple[str, ...]
    max_steps: int

    def episode_options(self) -> dict[str, Any]:
        """The episode as pipeline/serving/episode.py's `EpisodeSpec.from_mapping` reads it (the options of
        `WorldModelEnv.reset`): its `task` becomes the prompt's task description, so it is the corpus's
        `system.task_description`, not the agent's task, and the prompt is the corpus's system prompt."""
        system = self.system
        parts = {
            "action_space": system.action_space,
            "tools": list(system.tools) or None,
            "initial_state": system.initial_state,
            "demonstrations": system.demonstrations,
            "simulation_instructions": system.simulation_instructions,
        }
        return {
            "task": system.task_description,
            **{name: value for name, value in parts.items() if value is not None},
            "max_steps": self.max_steps,
        }
