"""LLM client throughput at the configured concurrency against one request at a time, in one run.

    .venv/bin/python bench/sampling.py [--latency 0.2] [--concurrency 32] [--requests 512] [--serial-requests 24]

Starts the test OpenAI server (tests/openai_server.py) in its own process with a fixed latency per
answer (a stand-in for a loaded vLLM server: time the client waits, not time it computes; a
separate process so the server's threads do not share the client's GIL), then times, each into a
fresh store so every answer is also committed to the cache as in a stage:
  concurrent: `--requests` requests at `concurrency` in flight (the default config)
  serial:     `--serial-requests` requests at concurrency 1
Prints answers/s of both, their ratio, the client's CPU milliseconds per answer and the load
average; the ideal ratio is the concurrency (32x), the target 25x (issue 10). What separates the
concurrent run from the ideal is CPU: the client's per answer (the SDK's request and parsing, its
share of a group commit) and the server's, on the same cores. On a machine whose load exceeds its
cores both runs slow down, the concurrent one more.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import openai  # noqa: F401 - imported before the clock: a one-off cost of seconds, not throughput

from pipeline.config.llm import EndpointConfig
from pipeline.llm.client import ChatRequest, open_client
from pipeline.store.database import Store


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def answers_per_second(base_url: str, store_path: Path, requests: int, concurrency: int) -> tuple[float, float]:
    """Answers per second and the client's CPU milliseconds per answer."""
    config = EndpointConfig(
        backend="openai", base_url=base_url, model="test-model", api_key_env=None, concurrency=concurrency
    )
    asked = [ChatRequest(({"role": "user", "content": f"question {i} at {concurrency}"},)) for i in range(requests)]
    with Store(store_path) as store:
        client = open_client(config, store, "bench")
        store.connection  # noqa: B018 - the property migrates the store: before the clock starts
        started, cpu_started = time.perf_counter(), cpu_seconds()
        answers = client.complete_sync(asked)
        elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
    failed = [a.error for a in answers if a.error]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed, e.g. {failed[0]}")
    return requests / elapsed, 1000 * cpu / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="server seconds per answer (issue 10: 200 ms)")
    parser.add_argument("--concurrency", type=int, default=EndpointConfig.model_fields["concurrency"].default)
    parser.add_argument("--requests", type=int, default=512, help="requests of the concurrent run")
    parser.add_argument("--serial-requests", type=int, default=24, help="requests of the one-at-a-time run")
    args = parser.parse_args()

    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "openai_server.py"), "--latency", str(args.latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        base_url = server.stdout.readline().strip()
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as scratch:
            concurrent, concurrent_cpu = answers_per_second(
                base_url, Path(scratch) / "concurrent.duckdb", args.requests, args.concurrency
            )
            serial, serial_cpu = answers_per_second(base_url, Path(scratch) / "serial.duckdb", args.serial_requests, 1)
        load_after = os.getloadavg()[0]
    finally:
        server.terminate()
        server.wait()
    print(f"server latency {args.latency * 1000:.0f} ms; load average {load_before:.2f} -> {load_after:.2f}")
    print(
        f"concurrency {args.concurrency}: {args.requests} answers, {concurrent:.1f} answers/s, client CPU {concurrent_cpu:.1f} ms/answer"
    )
    print(
        f"one at a time:  {args.serial_requests} answers, {serial:.2f} answers/s, client CPU {serial_cpu:.1f} ms/answer"
    )
    print(f"ratio {concurrent / serial:.1f}x (ideal {args.concurrency}x, target 25x)")


if __name__ == "__main__":
    main()
