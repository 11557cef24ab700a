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
import time
from collections import Counter
from pathlib import Path

import pytest
from openai_server import OpenAIServer

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


@pytest.mark.slow
def test_a_killed_run_resumes_without_asking_a_committed_answer_again(tmp_path):
    with OpenAIServer(latency_s=0.02) as server:
        finish(worker(tmp_path / "uninterrupted.duckdb", server))
        uninterrupted_requests = len(server.log)

        killed = worker(tmp_path / "resumed.duckdb", server)
        deadline = time.monotonic() + 60
        while len(server.answered()) < uninterrupted_requests + N // 3:
            assert killed.poll() is None and time.monotonic() < deadline, "the worker ended before the kill"
            time.sleep(0.01)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
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
