"""bash in a scratch home as a gymnasium environment (issue 31, deliver 2): the corpus's task families,
dealt as the corpus deals them, each episode in a fresh sandbox seeded with the task's files.

    env = TerminalEnv()
    observation, info = env.reset(seed=2)   # the listing of the corpus's trajectory 2's files
    observation, reward, terminated, truncated, info = env.step("python3 app/main.py data/readings.csv")
    env.close()                             # removes the sandbox

Task `index` is family `index` modulo the 14 families, drawn from `random.Random(f"terminal-{index}")`,
as data/demo_builder/terminal.py draws the corpus's trajectory `index`. As data/demo/terminal.jsonl
presents it: domain `terminal`, the task the family's request, the system prompt the terminal's
description, its action space and the seeded files as the initial state (environments/terminal.py's
`terminal_system`). Each action runs as `bash -c` in the sandbox's work folder
(environments/terminal.py's `Sandbox`: `LC_ALL=C`, `TZ=UTC`, `python3` the running interpreter, the
temporary path shown as /home/user); the observation is stdout and stderr interleaved, `info` has the
exit code. The sandbox is replaced on every reset and removed on `close()`.

Success (`ShellGoal`) is the corpus's outcome reward made strict: a line of the last observation is,
whole, the task's evidence (shell_tasks.py's `done_line`: "largest log: logs/api.log (1258 bytes)",
"4 passed, 0 failed", the count a counting command prints alone). The corpus's reward is its
`done_when` anywhere in the last observation; on all 120 corpus runs the two agree. The check reads
no clock, pid or temporary path: bash's observations of the families' commands hold none.

The solution is the family's commands, the corpus agent's (mistakes and detours included, so the
solver acts as the world model's training data does). The vocabulary is read-only and harmless
commands over the seeded files (list, print, count lines and bytes, search), none of which prints a
number alone, so chance does not pass for evidence.
"""

import random
import re
from dataclasses import dataclass
from typing import Any

from pipeline.environments.base import RealEnvironment
from pipeline.environments.shell_tasks import TERMINAL_TASKS, ShellTask
from pipeline.environments.task import History, TaskSpec
from pipeline.environments.terminal import Sandbox, terminal_system

DOMAIN = "terminal"
# Above the families' longest plan (10 commands) and the corpus's longest run.
MAX_STEPS = 15


@dataclass(frozen=True)
class ShellGoal:
    done_line: str  # a regular expression a whole line of the last observation must match

    def __call__(self, history: History) -> bool:
        if not history:
            return False
        pattern = re.compile(self.done_line)
        return any(pattern.fullmatch(line.rstrip()) for line in history[-1][1].splitlines())


def vocabulary(files: dict[str, str]) -> list[str]:
    """Commands an agent looking around this workspace types, over its seeded files and folders."""
    folders = sorted({path.rsplit("/", 1)[0] for path in files if "/" in path})
    actions = ["ls -1", "ls -1A", "ls -R", "pwd", "find . -type f | sort", "du -b .", "mkdir -p tmp", "echo done"]
    actions += [f"ls -1 {folder}" for folder in folders]
    for path in sorted(files):
        actions += [f"cat {path}", f"head -n 3 {path}", f"tail -n 3 {path}", f"wc -l {path}", f"wc -c {path}"]
        actions += [f"grep -n e {path}", f"sort {path} | head -n 3", f"cp {path} tmp/"]
    return actions


def shell_spec(task: ShellTask) -> TaskSpec:
    return TaskSpec(
        domain=DOMAIN,
        task=task.task,
        system=terminal_system(task.files),
        success=ShellGoal(task.done_line),
        solution=tuple(task.commands),
        vocabulary=tuple(vocabulary(task.files)),
        max_steps=MAX_STEPS,
    )


def shell_task(index: int) -> ShellTask:
    return TERMINAL_TASKS[index % len(TERMINAL_TASKS)](random.Random(f"terminal-{index}"))


def terminal_task(index: int) -> TaskSpec:
    """Task `index` as the corpus deals it (the corpus's trajectory `index` for index < 120)."""
    return shell_spec(shell_task(index))


class TerminalEnv(RealEnvironment):
    sandbox: Sandbox | None = None

    def deal(self, index: int) -> TaskSpec:
        task = shell_task(index)
        self.close()
        self.sandbox = Sandbox()
        self.sandbox.seed(task.files)
        return shell_spec(task)

    def run(self, action: str) -> tuple[str, dict[str, Any]]:
        assert self.sandbox is not None  # reset dealt a task, so a sandbox stands
        output, code = self.sandbox.run(action)
        return output, {"exit_code": code}

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.remove()
            self.sandbox = None
