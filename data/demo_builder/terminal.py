"""Terminal runs: each task family's commands run by real bash in a fresh throwaway home, the
observation being what bash printed, with the temporary path shown as /home/user."""

import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.store.schema import SystemPrompt, Trajectory, Turn

from . import SOURCE
from .shell_tasks import TERMINAL_TASKS, ShellTask
from .verifiers import count_verifier

HOME = "/home/user"
WORKDIR = f"{HOME}/work"
TERMINAL_TASK_DESCRIPTION = (
    "You are simulating a Linux terminal: bash 5 with GNU coreutils, findutils, grep, sed, tar, diff "
    "and Python 3 on Debian, as user `user`. Each action is one command line that bash runs in "
    f"{WORKDIR}. Reply with exactly what the terminal prints (stdout and stderr, in order), and "
    "with nothing when the command prints nothing."
)
TERMINAL_ACTION_SPACE = (
    "bash commands: one command line per turn (pipes, redirections, `&&` and `;` allowed), run with "
    f"`bash -c` in {WORKDIR}. Files persist between turns; the working directory and shell variables "
    "do not. Non-interactive: no editors, pagers or prompts."
)
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


class Sandbox:
    """A throwaway home directory with `python3` pinned to the interpreter running the builder, so
    tracebacks come from one known Python whatever the machine's PATH holds. Removed on leaving
    the `with` block."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="simulacra-demo-")).resolve()
        self.home = self.root / "home" / "user"
        self.work = self.home / "work"
        self.work.mkdir(parents=True)
        shims = self.root / "bin"
        shims.mkdir()
        (shims / "python3").symlink_to(sys.executable)
        self.env = {
            "PATH": f"{shims}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "LC_ALL": "C",
            "TZ": "UTC",
            "USER": "user",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exception: object) -> None:
        shutil.rmtree(self.root)

    def seed(self, files: dict[str, str]) -> None:
        for relative in sorted(files):
            path = self.work / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[relative])
            # Explicit modes: the umask of whoever builds must not change `ls`, `tar` or `./script` results.
            path.chmod(0o644)

    def run(self, command: str) -> tuple[str, int]:
        completed = subprocess.run(
            ["bash", "-c", command],
            cwd=self.work,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=30,
        )
        text = completed.stdout.decode("utf-8", "replace").replace(str(self.home), HOME)
        return text, completed.returncode


def terminal_system(files: dict[str, str]) -> SystemPrompt:
    """The system prompt of a terminal trajectory: the seeded files are its initial state."""
    listing = "\n".join(f"  {path} ({len(files[path].encode())} bytes)" for path in sorted(files))
    return SystemPrompt(
        task_description=TERMINAL_TASK_DESCRIPTION,
        action_space=TERMINAL_ACTION_SPACE,
        initial_state=f"Working directory {WORKDIR} (home {HOME}) contains:\n{listing}",
    )


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
