"""Progress of work longer than a few seconds: a bar (rich) on a terminal, plain lines elsewhere.

Where output is not a terminal (a Prefect worker's log, `nohup`, CI) a bar draws nothing, and a step
of minutes would print nothing for minutes (issue 30: `evaluate --data` on 46 items). There a bar with a
total prints a line when it starts and each time another `LINE_EVERY_FRACTION` of it is done, with the
count, the rate and the ETA, lines at least `MIN_SECONDS_BETWEEN_LINES` apart; a bar without a total
(ingest's records) prints its count every `LINE_EVERY_SECONDS`.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# Also told of every advance, as observer(description, completed, total): the Prefect flows publish
# it as a progress artifact (flows/artifacts.py), so stages stay free of Prefect.
OBSERVERS: list[Callable[[str, int, int | None], None]] = []

# A line per 5% is at most 20 lines a bar: enough to see a stalled step in a log, few enough to read it.
LINE_EVERY_FRACTION = 0.05
# A bar of a second (filter on the demo) would print 20 lines nobody needs; its start line says it ran.
MIN_SECONDS_BETWEEN_LINES = 1.0
# Without a total the count is all there is; twice a minute shows it is moving. No start line: ingest
# opens a bar per file, and a folder of 100 small files would print 100 of them.
LINE_EVERY_SECONDS = 30.0


@contextmanager
def progress_bar(description: str, total: int | None, done: int = 0) -> Iterator[Callable[..., None]]:
    """Yields `advance(n, status=None)`; a status is shown after the description (the LLM client's
    done/cached/failed/tokens line). A bar on a terminal, `ProgressLines` anywhere else.

    `done` is work finished before this call (a resumed run's restored steps, answers already cached):
    the bar starts there, and its rate and ETA count only what this call does. Advanced by `done` in
    its first second, a resumed bar claimed 4 steps a second and an ETA of nothing."""
    # Elapsed and remaining (the ETA, from the pace so far): on 2 cores a stage of the demo takes minutes.
    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    ]
    console = Console(stderr=True)
    lines = None if console.is_terminal else ProgressLines(description, total, console.print, done=done)
    with Progress(*columns, transient=True, console=console, disable=lines is not None) as progress:
        # Created at `done`, not advanced to it: rich's speed is taken from advances only.
        task = progress.add_task(description, total=total, completed=done)
        completed = done
        if done:
            for observer in OBSERVERS:
                observer(description, completed, total)

        def advance(n: int, status: str | None = None) -> None:
            nonlocal completed
            completed += n
            progress.advance(task, n)
            if status is not None:
                progress.update(task, description=f"{description} ({status})")
            if lines is not None:
                lines.advance(completed, status)
            for observer in OBSERVERS:
                observer(description, completed, total)

        yield advance


class ProgressLines:
    """A bar as plain lines, for a log: `evaluate base: 23/46 (50%), 0.38/s, elapsed 1:01, eta 1:01`."""

    def __init__(
        self, description: str, total: int | None, write: Callable[..., None], clock=time.monotonic, done: int = 0
    ):
        self.description, self.total, self.write, self.clock = description, total, write, clock
        self.done = done  # finished before this run: not part of its rate
        self.started = self.last_line_at = clock()
        # the last LINE_EVERY_FRACTION step a line was printed for (a resumed bar's lines go on from where it is)
        self.last_step = int(done / total / LINE_EVERY_FRACTION) if total else 0
        self.lines = 0  # progress lines printed, the start line aside
        if total and done:
            self._print(f"{description}: {done} of {total} done before, {total - done} to do")
        elif total:
            self._print(f"{description}: started, {total} to do")

    def advance(self, completed: int, status: str | None = None) -> None:
        now = self.clock()
        since = now - self.last_line_at
        if self.total:
            step = int(completed / self.total / LINE_EVERY_FRACTION)
            # The last line always, once the bar has printed one: a log then shows it ended and how fast.
            finished = completed >= self.total and self.lines > 0
            if step <= self.last_step or (since < MIN_SECONDS_BETWEEN_LINES and not finished):
                return
            self.last_step = step
        elif since < LINE_EVERY_SECONDS:
            return
        self.last_line_at = now
        self.lines += 1
        self._print(self.line(completed, now, status))

    def line(self, completed: int, now: float, status: str | None = None) -> str:
        elapsed = now - self.started
        rate = (completed - self.done) / elapsed if elapsed > 0 else 0.0
        parts = [
            f"{completed}/{self.total} ({100 * completed / self.total:.0f}%)" if self.total else f"{completed} done",
            f"{rate:.3g}/s",
            f"elapsed {_clock_time(elapsed)}",
        ]
        if self.total and completed < self.total and rate > 0:
            parts.append(f"eta {_clock_time((self.total - completed) / rate)}")
        text = f"{self.description}: {', '.join(parts)}"
        return f"{text} ({status})" if status else text

    def _print(self, text: str) -> None:
        # Text, not markup (a description may hold brackets), and one line whatever the width: a log greps it whole.
        self.write(text, markup=False, highlight=False, soft_wrap=True)


def _clock_time(seconds: float) -> str:
    """0:07, 12:30, 1:02:03."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
