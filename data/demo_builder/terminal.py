"""Terminal runs: each task family's commands (pipeline/environments/shell_tasks.py) run by real bash
in a fresh throwaway home (pipeline/environments/terminal.py), the observation being what bash
printed, with the temporary path shown as /home/user."""

import random

from pipeline.environments.shell_tasks import TERMINAL_TASKS, ShellTask
from pipeline.environments.terminal import Sandbox, terminal_system
from pipeline.store.schema import Trajectory, Turn

from . import SOURCE
from .verifiers import count_verifier

# Versions printed into terminal_env.md (Markdown, so ingesting the folder skips it): the exact
# text of error messages and tracebacks depends on them, so a rebuild elsewhere matches the
# committed corpus only when they match.
TOOL_VERSIONS = [
    "bash --version",
    "ls --version",
    "grep --version",
    "sed --version",
    "find --version",
    "tar --version",
    "diff --version",
    "python3 --version",
]


def shell_turn(command: str, output: str, code: int = 0, **metadata: object) -> Turn:
    return Turn(command, output, is_error=code != 0, metadata={"exit_code": code, **metadata})


def task_turn(task: ShellTask, command: str, output: str, code: int) -> Turn:
    """A turn of a task run; a counting command whose count the task knows gets its verifier,
    once bash printed exactly that count (otherwise the task's model of its files is wrong)."""
    fields = task.counts.get(command)
    if fields is None:
        return shell_turn(command, output, code)
    if output.split() != fields:
        raise RuntimeError(f"{task.family}: `{command}` printed {output!r}, the task computed {fields}")
    return shell_turn(command, output, code, verifier=count_verifier(fields))


def terminal_trajectory(index: int) -> Trajectory:
    rng = random.Random(f"terminal-{index}")
    task = TERMINAL_TASKS[index % len(TERMINAL_TASKS)](rng)
    commands = task.commands
    # One run in ten stops early, as agents out of steps do: its outcome reward is then 0.
    if rng.random() < 0.1 and len(commands) > 5:
        commands = commands[: len(commands) - rng.randint(1, 2)]
    with Sandbox() as sandbox:
        sandbox.seed(task.files)
        turns = [task_turn(task, command, *sandbox.run(command)) for command in commands]
    return Trajectory(
        source=SOURCE,
        domain="terminal",
        task=task.task,
        turns=turns,
        system=terminal_system(task.files),
        outcome_reward=1.0 if task.done_when in turns[-1].observation else 0.0,
        metadata={"environment": "bash", "task_family": task.family, "seed": f"terminal-{index}"},
    )


def tool_versions() -> str:
    """terminal_env.md: the first line each tool prints for `--version` in the sandbox."""
    with Sandbox() as sandbox:
        lines = "".join(f"$ {command}\n{sandbox.run(command)[0].splitlines()[0]}\n" for command in TOOL_VERSIONS)
    return f"# Tools of the terminal runs\n\nThe versions `terminal.jsonl` was built with:\n\n```\n{lines}```\n"
