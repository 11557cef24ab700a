"""A store another process holds (DuckDB allows one writer): a command waits for it, saying so once, and gives up
after `lock_timeout_s` with one line naming what to do. Real DuckDB files, a real second process."""

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.store.database import Store, StoreBusy

HOLD = """
import sys, time, duckdb
connection = duckdb.connect(sys.argv[1])
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold(path: Path, seconds: float) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


@pytest.fixture
def store_path(tmp_path):
    path = tmp_path / "simulacra.duckdb"
    with Store(path) as store:
        store.execute("CREATE TABLE notes (text VARCHAR)")
    return path


def test_a_held_store_is_waited_for_and_the_wait_is_said_once(store_path, caplog):
    """The wait was silent: a command behind another one's write looked hung for up to two minutes."""
    holder = hold(store_path, 2.0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="pipeline.store.database"), Store(store_path) as store:
        assert store.scalar("SELECT count(*) FROM notes") == 0
    holder.wait(timeout=30)
    assert time.monotonic() - started > 0.5  # it did wait for the holder
    assert [record.getMessage() for record in caplog.records] == [
        f"{store_path} is held by another process (DuckDB allows one writer): waiting up to 120s for it"
    ]


def test_a_store_held_past_the_timeout_is_one_line_naming_the_fix(store_path):
    holder = hold(store_path, 20.0)
    try:
        with pytest.raises(StoreBusy, match=r"held by another process .* gave up after 1s: rerun once"):
            Store(store_path, lock_timeout_s=1.0).scalar("SELECT 1")
    finally:
        holder.kill()
        holder.wait(timeout=30)
