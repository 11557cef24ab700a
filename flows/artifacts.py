"""What a stage shows in the Prefect UI: its tables, its plots, a summary, and progress.

Keys are stable (`<stage>-summary`, `<stage>-progress`, and the keys a stage gives its tables and
images, prefixed with the stage), so the UI keeps one artifact per key with a version per run;
Prefect accepts lower-case letters, digits and dashes only. Plots are PNG files the stage rendered;
the Prefect server cannot read the worker's disk, so each is sent inline as a `data:` URI in an
image artifact, described in words, and its path is in the summary. A plot named as a table is
(score's `categories`) takes `-plot` after its key: under one key the UI kept only the last artifact,
and its page showed the table "Changed to image artifact" (issue 29.8).
"""

import base64
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import (
    create_image_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from pipeline import progress
from pipeline.stage import StageResult

# Progress artifacts are updated at most this often: each update is an API call.
PROGRESS_INTERVAL_S = 5.0


def artifact_key(text: str) -> str:
    """`Filter Drops_by rule` -> `filter-drops-by-rule`."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def stage_key(stage: str, key: str) -> str:
    """A stage's artifact key, prefixed with the stage unless it already is: keys stay unique
    across stages (`pools` -> `split-pools`)."""
    key = artifact_key(key)
    return key if key.startswith(f"{stage}-") else f"{stage}-{key}"


def _json_safe(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Timestamps, paths and decimals from the store become text; the UI renders JSON."""
    return json.loads(json.dumps(rows, default=str))


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _metric_rows(metrics: dict[str, Any]) -> list[str]:
    rows = []
    for name, value in metrics.items():
        shown = f"`{json.dumps(value, default=str)}`" if isinstance(value, dict | list) else value
        rows.append(f"| {name} | {shown} |")
    return rows


def summary_markdown(stage: str, fingerprint: str, result: StageResult) -> str:
    lines = [f"## {stage}", "", result.summary or "(no summary)", "", f"- fingerprint: `{fingerprint}`"]
    if result.output_path:
        lines.append(f"- output: `{result.output_path}`")
    lines += [f"- plot `{key}`: `{path}`" for key, path in result.images.items()]
    if result.metrics:
        lines += ["", "| metric | value |", "|---|---|", *_metric_rows(result.metrics)]
    return "\n".join(lines)


def publish_stage(stage: str, fingerprint: str, result: StageResult) -> None:
    """Tables, plots and the summary of a stage that ran."""
    tables = {stage_key(stage, key) for key in result.tables}
    for key, rows in result.tables.items():
        create_table_artifact(table=_json_safe(rows), key=stage_key(stage, key), description=f"{stage}: {key}")
    for key, path in result.images.items():
        if Path(path).is_file():
            named = stage_key(stage, key)
            words = named.removeprefix(f"{stage}-").replace("-", " ")
            create_image_artifact(
                image_url=_png_data_uri(Path(path)),
                key=named + ("-plot" if named in tables else ""),
                description=f"{stage}: plot of the {words}",
            )
    create_markdown_artifact(
        markdown=summary_markdown(stage, fingerprint, result),
        key=stage_key(stage, "summary"),
        description=f"{stage}: what the run did",
    )


class ProgressArtifact:
    """One progress artifact (a percentage in the UI), created on first report, updated sparingly."""

    def __init__(self, key: str, description: str):
        self.key = artifact_key(key)
        self.description = description
        self.artifact_id: UUID | None = None
        self.last_update = 0.0

    def report(self, percent: float, force: bool = False) -> None:
        now = time.monotonic()
        if self.artifact_id is None:
            # Prefect's async_dispatch types the result `R | Coroutine`; called from sync code it is the UUID.
            self.artifact_id = create_progress_artifact(  # type: ignore[assignment]
                progress=percent, key=self.key, description=self.description
            )
        elif force or now - self.last_update >= PROGRESS_INTERVAL_S:
            update_progress_artifact(self.artifact_id, percent)
        else:
            return
        self.last_update = now


@contextmanager
def stage_progress(stage: str) -> Iterator[None]:
    """Publishes the stage's progress bars (pipeline/progress.py) with a known total as `<stage>-progress`; on a
    server's worker, also as the plain lines a log gets (`cpt: 12/32 (38%), 0.05/s, elapsed 4:01, eta 6:40`) in the
    run's own logs. The worker's log had them and the UI's Logs tab showed nothing for minutes of training (found by
    probing). Not under `simulacra run`, whose terminal shows the bars already."""
    from flows.concurrency import connected_to_server

    artifact = ProgressArtifact(stage_key(stage, "progress"), f"{stage}: share of the current step done")
    lines: dict[str, progress.ProgressLines] = {}
    logger = get_run_logger() if connected_to_server() else None

    def observe(description: str, completed: int, total: int | None) -> None:
        if total:
            artifact.report(100.0 * min(completed, total) / total, force=completed >= total)
        if logger is not None:
            if description not in lines:
                lines[description] = progress.ProgressLines(
                    description, total, lambda text, **_: logger.info("%s", text)
                )
            lines[description].advance(completed)

    progress.OBSERVERS.append(observe)
    try:
        yield
    finally:
        progress.OBSERVERS.remove(observe)
