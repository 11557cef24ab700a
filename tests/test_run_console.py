"""What `simulacra run` prints on the terminal when a stage fails for a reason the user can fix: the stage's one
line, not Prefect's 40-line traceback before it (found by probing, 2026-12-06: production.yaml's source paths
on a machine without them). Prefect's stored log keeps the traceback; a failure that is not the user's keeps it
on the terminal too. A real `simulacra run` process with its temporary Prefect server, and the filter itself."""

import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.errors import UserFixableError, user_fixable
from pipeline.orchestration.console_log import FixableWithoutTraceback

REPO = Path(__file__).resolve().parents[1]


def test_a_configured_source_that_is_not_there_is_one_line_naming_the_source(tmp_path):
    workspace, missing = tmp_path / "ws", tmp_path / "nightly" / "*.jsonl"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "workspace": {"path": str(workspace)},
                "ingest": {"sources": [{"name": "nightly", "path": str(missing)}]},
                "orchestration": {"stages": ["ingest", "filter"]},
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "--config", str(config), "run"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    line = (
        f"stage 'ingest' failed: source `nightly` (ingest.sources): {missing}: no such file, folder or glob match: "
        "correct its `path` in the config, or remove it"
    )
    assert line in done.stderr.splitlines()
    assert "Traceback" not in done.stderr and "rerun the same command" not in done.stderr
    with sqlite3.connect(workspace / "prefect" / "prefect.db") as prefect_db:
        stored = [message for (message,) in prefect_db.execute("SELECT message FROM log WHERE level >= 40")]
    assert any("Traceback (most recent call last)" in message for message in stored)  # what the UI shows: all of it


def record_of(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())


def test_only_a_fixable_failure_loses_its_traceback_on_the_console():
    class StageFailedLike(RuntimeError):  # flows/dag.py's StageFailed, as the filter sees it: `fixable` says
        fixable = True

    wrapped = RuntimeError("stage 'sft' failed")
    wrapped.__cause__ = UserFixableError("run `simulacra cpt` first")
    for fixable in (UserFixableError("no such file"), wrapped, StageFailedLike("stage 'ingest' failed")):
        record = record_of(fixable)
        assert user_fixable(fixable) and FixableWithoutTraceback().filter(record)
        assert record.exc_info is None and "Traceback" not in logging.Formatter().format(record)
    bug = record_of(KeyError("a bug"))
    assert not user_fixable(bug.exc_info[1]) and FixableWithoutTraceback().filter(bug)  # type: ignore[index]
    assert "Traceback" in logging.Formatter().format(bug)
