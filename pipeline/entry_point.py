"""The `simulacra` console script (pyproject.toml): ctrl-C stops it with one line and status 130 from
the first instant (SIGTERM with its own line and 143).

The command line (pipeline/cli.py) imports typer, rich and pydantic before it can catch anything, a
second or more on a cold disk, and a ctrl-C then printed a 47-line KeyboardInterrupt traceback (issue
29.3). This module imports nothing heavy before it watches for the interrupt (pipeline/errors.py), and
asks once more when the command has ended: an interrupt after the command group's own check (Click
turns it into "Aborted!" and status 1) still ends with the line and 130.
"""

import sys

from pipeline.errors import interrupts_received, stopped_by, watch_for_interrupts

# The group's options that take a value (`--set x=1`): the command's name is the first word after them.
OPTIONS_WITH_VALUES = ("--config", "-c", "--set")


def main() -> int:
    watch_for_interrupts()
    try:
        from pipeline.cli import app

        return app()
    except KeyboardInterrupt:
        pass
    except SystemExit as ended:
        if ended.code in (130, 143) or not interrupts_received():
            raise
    command = command_name(sys.argv[1:])
    line, status = stopped_by(command)
    print(f"{command}: {line}", file=sys.stderr)
    return status


def command_name(args: list[str]) -> str:
    """The command `args` name (`ingest` in `--set a=1 ingest data`); `simulacra` when none does yet."""
    words = iter(args)
    for word in words:
        if word in OPTIONS_WITH_VALUES:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return "simulacra"
