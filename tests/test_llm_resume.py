"""SIGKILL the client mid-sampling and rerun it (issue 10): a real subprocess against a real server.

What is guaranteed, precisely: every answer is committed to the store, in its own transaction,
before the client takes the next one; a committed answer is never requested again. A kill can
still catch requests in flight: the server may have answered them while the client never read or
committed the answer, and the rerun asks them again. So the test asserts that every request the
server answered twice was uncommitted at the kill, that there are at most `concurrency` of them
(the requests in flight), and that the final table equals an uninterrupted run's.
"""

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from openai_server import OpenAIServer, echo_last_user_message

from pipeline.store.database import Store

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "llm_client_worker.py"
N = 240
CONCURRENCY = 8
COLUMNS = "key, role, backend, model, request, answer, error, prompt_tokens, completion_tokens, attempts"


def worker(store: Path, server: OpenAIServer) -> subprocess.Popen:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, str(WORKER), str(store), server.base_url, str(N), str(CONCURRENCY)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> None:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err


def table(path: Path) -> list[tuple]:
    with Store(path) as store:
        return store.execute(f"SELECT {COLUMNS} FROM llm_cache ORDER BY key").fetchall()


def questions_answered(entries) -> Counter:
    return Counter(entry.body["messages"][-1]["content"] for entry in entries if entry.outcome == "answered")


class KillGate:
    """Answers as the echo server does, but once armed holds every answer past `limit` until opened:
    the worker stalls mid-run however slowly this process polls it on a loaded machine (it once ran
    to its end, all answers committed, between two polls), so the kill always lands mid-way."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self.calls = 0
        self.limit = 0

    def arm(self, limit: int) -> None:
        with self._lock:
            self.calls, self.limit = 0, limit
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def __call__(self, request: dict) -> str:
        with self._lock:
            self.calls += 1
            held = self.calls > self.limit and not self._open.is_set()
        if held:
            self._open.wait(timeout=120)
        return echo_last_user_message(request)


@pytest.mark.slow
def test_a_killed_run_resumes_without_asking_a_committed_answer_again(tmp_path):
    gate = KillGate()
    with OpenAIServer(answer=gate, latency_s=0.02) as server:
        finish(worker(tmp_path / "uninterrupted.duckdb", server))
        uninterrupted_requests = len(server.log)

        gate.arm(N // 3)
        killed = worker(tmp_path / "resumed.duckdb", server)
        deadline = time.monotonic() + 60
        while len(server.answered()) < uninterrupted_requests + N // 3:
            assert killed.poll() is None and time.monotonic() < deadline, "the worker ended before the kill"
            time.sleep(0.01)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        gate.release()  # the held handlers answer a dead socket; the rerun's requests pass
        first_run = server.log[uninterrupted_requests:]
        with Store(tmp_path / "resumed.duckdb") as store:
            committed = {
                row[0]
                for row in store.execute(
                    "SELECT json_extract_string(request, '$.messages[0].content') FROM llm_cache WHERE answer IS NOT NULL"
                ).fetchall()
            }
        assert N // 3 - CONCURRENCY <= len(committed) < N  # the answered, less those in flight

        rerun_from = len(server.log)
        finish(worker(tmp_path / "resumed.duckdb", server))
        rerun = server.log[rerun_from:]

    asked_again = set(questions_answered(rerun))
    assert not asked_again & committed
    answered_twice = {q for q, times in questions_answered(first_run + rerun).items() if times > 1}
    assert answered_twice <= asked_again and len(answered_twice) <= CONCURRENCY
    assert len(asked_again) == N - len(committed)
    assert table(tmp_path / "resumed.duckdb") == table(tmp_path / "uninterrupted.duckdb")
