"""Serving throughput and latency at 1, 8 and 32 concurrent clients, as ratios to one client, in one run.

    .venv/bin/python bench/serving.py [--engine simulacra|transformers|transformers-cb] [--max-tokens 32]
                                      [--requests 64] [--model DIR]

Exports the tiny offline model (or serves `--model`, an exported folder) and starts the server in
its own process: `simulacra serve` (continuous batching, pipeline/llm/batching.py), or
`transformers serve` on the same folder, without or with `--continuous-batching` (issue 19: measure
it against the project's server and keep the better one). Then, for each concurrency, `--requests`
chat completions of `--max-tokens` tokens each from that many client threads (the `openai` client,
greedy), and prints completion tokens per second (from `usage`), p50 / p95 request latency, and the
throughput ratio to one client; finally one streamed answer's tokens per second (content chunks
after the first). The ideal ratio is the concurrency; what separates a run from it is the decoder's
per-step cost growing with the batch and the clients' CPU on the same cores.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx
from openai import OpenAI

MESSAGES = [{"role": "system", "content": "You simulate a Linux terminal."}, {"role": "user", "content": "cat big.log"}]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def export_tiny(root: Path) -> Path:
    from pipeline.config.model import TinyModelConfig
    from pipeline.serving.export_folder import write_export
    from pipeline.serving.prompt_formats import prompt_format
    from pipeline.training.tiny_model import build_tiny_model

    model = build_tiny_model(TinyModelConfig(), [REPO / "data/demo/terminal.jsonl"], root / "tiny")
    return write_export(
        model,
        root / "export",
        prompt_format("cpt"),
        {"model_name": "bench-world-model", "fingerprint": "bench", "context_length": 1024},
        "# bench\n",
    )


def start(engine: str, folder: Path, port: int) -> tuple[subprocess.Popen, str]:
    if engine == "simulacra":
        command = [sys.executable, "-m", "pipeline.cli", "serve", str(folder), "--port", str(port), "--device", "cpu"]
        name = __import__("json").loads((folder / "simulacra.json").read_text())["model_name"]
    else:
        command = [
            str(Path(sys.executable).with_name("transformers")),
            "serve",
            str(folder),
            "--port",
            str(port),
            "--device",
            "cpu",
        ] + (["--continuous-batching"] if engine == "transformers-cb" else [])
        name = str(folder)
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).raise_for_status()
            return process, name
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise SystemExit(f"{engine} did not start") from None
            time.sleep(0.5)


def run(client: OpenAI, name: str, engine: str, concurrency: int, requests: int, max_tokens: int):
    extra = {"ignore_eos": True} if engine == "simulacra" else {}
    latencies: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    counter = iter(range(requests))

    def worker():
        while True:
            with lock:
                if next(counter, None) is None:
                    return
            began = time.perf_counter()
            answer = client.chat.completions.create(
                model=name, messages=MESSAGES, max_tokens=max_tokens, temperature=0, extra_body=extra
            )
            with lock:
                latencies.append(time.perf_counter() - began)
                tokens[0] += answer.usage.completion_tokens

    began = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    latencies.sort()
    return tokens[0] / wall, statistics.median(latencies), latencies[max(0, int(0.95 * len(latencies)) - 1)]


def streamed_rate(client: OpenAI, name: str, engine: str, max_tokens: int) -> float:
    extra = {"ignore_eos": True} if engine == "simulacra" else {}
    stamps = []
    for chunk in client.chat.completions.create(
        model=name, messages=MESSAGES, max_tokens=max_tokens, temperature=0, stream=True, extra_body=extra
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("simulacra", "transformers", "transformers-cb"), default="simulacra")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    parser.add_argument("--model", type=Path, help="an exported folder (default: the tiny model, exported here)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.model or export_tiny(Path(scratch))
        port = free_port()
        process, name = start(args.engine, folder, port)
        try:
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
            run(client, name, args.engine, 1, 2, args.max_tokens)  # warm-up: first-request costs are not throughput
            results = {c: run(client, name, args.engine, c, max(args.requests, c), args.max_tokens) for c in (1, 8, 32)}
            base = results[1][0]
            print(f"engine {args.engine}, {args.max_tokens} tokens per answer, load {os.getloadavg()[0]:.1f}")
            for concurrency, (rate, p50, p95) in results.items():
                print(
                    f"  {concurrency:>2} clients: {rate:7.1f} tokens/s  ({rate / base:4.1f}x one client)  "
                    f"latency p50 {p50:6.2f} s  p95 {p95:6.2f} s"
                )
            print(f"  streamed: {streamed_rate(client, name, args.engine, 4 * args.max_tokens):.1f} tokens/s")
        finally:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
