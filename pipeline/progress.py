"""Progress bars for work longer than a few seconds (rich), quiet when output is not a terminal."""

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


@contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[Callable[..., None]]:
    """Yields `advance(n, status=None)`; a status is shown after the description (the LLM client's
    done/cached/failed/tokens line). Rich draws nothing on a non-terminal (CI logs, Prefect workers)."""
    # Elapsed and remaining (the ETA, from the pace so far): on 2 cores a stage of the demo takes minutes.
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn()]
    console = Console(stderr=True)
    with Progress(*columns, transient=True, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task(description, total=total)
        completed = 0

        def advance(n: int, status: str | None = None) -> None:
            nonlocal completed
            completed += n
            progress.advance(task, n)
            if status is not None:
                progress.update(task, description=f"{description} ({status})")
            for observer in OBSERVERS:
                observer(description, completed, total)

        yield advance
