"""The terminal environment: real bash in a throwaway home, and the system-prompt parts a terminal
trajectory of the demo corpus carries (data/demo/terminal.jsonl), with the temporary path shown as
/home/user in every observation."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.store.schema import SystemPrompt

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


class Sandbox:
    """A throwaway home directory with `python3` pinned to the running interpreter, so tracebacks
    come from one known Python whatever the machine's PATH holds. Removed on leaving the `with`
    block (or by `remove`)."""

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
        self.remove()

    def remove(self) -> None:
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
