"""The `stage_runs` table: what ran, under which fingerprint, and how it ended.

It is what decides that a stage is done, for `simulacra run` and the Prefect flows alike. Prefect's
own task cache mirrors it but does not decide (a retried flow run can miss that cache,
PrefectHQ/prefect#21727, and a cache entry can outlive the store it described).

Rows: `started` when a stage begins, turned into `completed` (metrics, output path, summary) or
`failed` (the error) when it ends; a row left `started` is a process that was killed. A stage whose
fingerprint has a completed row, and whose recorded output still exists, is not run again: a
`skipped` row records that it was asked for.
"""

import json
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.stage import StageResult
from pipeline.store.database import Store

COLUMNS = "run_id, stage, fingerprint, status, started_at, finished_at, metrics, output_path, summary, error"


@dataclass
class StageRun:
    run_id: str
    stage: str
    fingerprint: str
    status: str
    started_at: datetime
    finished_at: datetime | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    output_path: str | None = None
    summary: str = ""
    error: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "StageRun":
        metrics = row["metrics"]
        return cls(**{**row, "metrics": json.loads(metrics) if metrics else {}, "summary": row["summary"] or ""})

    def result(self) -> StageResult:
        """The StageResult this run recorded (its tables and images were published when it ran)."""
        output = Path(self.output_path) if self.output_path else None
        return StageResult(self.stage, metrics=self.metrics, output_path=output, summary=self.summary)


def completed_run(store: Store, stage: str, fingerprint: str) -> StageRun | None:
    """The latest completed run with this fingerprint whose output is still there, if any."""
    rows = store.rows(
        f"SELECT {COLUMNS} FROM stage_runs WHERE stage = ? AND fingerprint = ? AND status = 'completed' "
        "ORDER BY finished_at DESC LIMIT 1",
        [stage, fingerprint],
    )
    if not rows:
        return None
    run = StageRun.from_row(rows[0])
    if run.output_path and not Path(run.output_path).exists():
        return None  # removed by hand: the stage must produce it again
    return run


def _insert(store: Store, run: StageRun) -> None:
    with store.transaction() as con:
        con.execute(
            f"INSERT INTO stage_runs ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                run.run_id,
                run.stage,
                run.fingerprint,
                run.status,
                run.started_at,
                run.finished_at,
                json.dumps(run.metrics, default=str),
                run.output_path,
                run.summary,
                run.error,
            ],
        )


def record_skip(store: Store, completed: StageRun) -> StageRun:
    """A `skipped` row pointing at the completed run that made the work unnecessary."""
    now = datetime.now()
    skipped = StageRun(
        run_id=uuid.uuid4().hex,
        stage=completed.stage,
        fingerprint=completed.fingerprint,
        status="skipped",
        started_at=now,
        finished_at=now,
        metrics=completed.metrics,
        output_path=completed.output_path,
        summary=completed.summary,
    )
    _insert(store, skipped)
    return skipped


def execute(store: Store, stage: str, fingerprint: str, run: Callable[[], StageResult]) -> StageResult:
    """Run a stage between a `started` row and its `completed` or `failed` update."""
    run_id = uuid.uuid4().hex
    _insert(store, StageRun(run_id, stage, fingerprint, "started", datetime.now()))
    try:
        result = run()
    except BaseException as exc:
        error = "".join(traceback.format_exception_only(exc)).strip()
        store.execute(
            "UPDATE stage_runs SET status = 'failed', finished_at = ?, error = ? WHERE run_id = ?",
            [datetime.now(), error, run_id],
        )
        raise
    store.execute(
        "UPDATE stage_runs SET status = 'completed', finished_at = ?, metrics = ?, output_path = ?, summary = ? "
        "WHERE run_id = ?",
        [
            datetime.now(),
            json.dumps(result.metrics, default=str),
            str(result.output_path) if result.output_path else None,
            result.summary,
            run_id,
        ],
    )
    return result


def history(store: Store, stage: str | None = None) -> list[StageRun]:
    """Runs in the order they started, of one stage or all."""
    where, parameters = ("WHERE stage = ?", [stage]) if stage else ("", [])
    rows = store.rows(f"SELECT {COLUMNS} FROM stage_runs {where} ORDER BY started_at, run_id", parameters)
    return [StageRun.from_row(row) for row in rows]
