"""The continuous batch under a KV cache budget (pipeline/llm/batching.py `Scheduler._admitted`) against rows
admitted up to `max_batch` alone, on long prompts: tau-bench's airline conversations, whose policy system prompt
and tool turns make prompts of thousands of tokens.

    python bench/kv_budget.py [--model smollm2-135m-instruct] [--queries 12] [--batch-size 32] [--budget-gib 1]
                              [--max-tokens 300] [--repeats 1]

A batch's cache is as wide as its widest row, so long prompts of different lengths pad every row to the longest;
the budget admits rows while rows x widest (prompt and answer budget) fit. Each pass runs in a process of its own
(its peak memory is its own), the variants alternating; greedy, so both give the same answers. Prints each pass's
seconds and peak resident memory, the medians' ratios, and whether the answers agree.
"""

import argparse
import asyncio
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.base_model import add_model_argument, model_folder

TAU_BENCH = REPO.parent / "shared" / "data" / "public" / "tau_bench" / "gpt-4o-airline-tasks-00-24.json"


def tau_requests(count: int):
    """Chat requests from tau-bench runs: the conversation up to each tool call's answer, asked of the model, one
    query per run (its last tool answer), so prompt lengths spread as a benchmark's do."""
    from pipeline.llm.chat import ChatRequest

    requests = []
    for run in json.loads(TAU_BENCH.read_text(encoding="utf-8")):
        messages = [m for m in run["traj"] if m.get("content")]
        last_tool = max((i for i, m in enumerate(messages) if m["role"] == "tool"), default=None)
        if last_tool is None:
            continue
        history = [
            {"role": "user" if m["role"] in ("user", "tool") else m["role"], "content": str(m["content"])}
            for m in messages[:last_tool]
        ]
        requests.append(ChatRequest(tuple(history)))
        if len(requests) == count:
            break
    return requests


def one_pass(args) -> dict:
    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.transformers_backend import TransformersBackend

    with tempfile.TemporaryDirectory() as tmp:
        endpoint = EndpointConfig(
            backend="transformers",
            model=model_folder(args.model, Path(tmp)),
            temperature=0.0,
            max_tokens=args.max_tokens,
            batch_size=args.batch_size,
            device="cpu",
            kv_cache_gib=args.budget_gib if args.variant == "budget" else 1e6,
        )
        backend = TransformersBackend(endpoint)
        backend._load()
        requests = tau_requests(args.queries)

        async def answer():
            async with backend.connect() as send:
                return await send(requests)

        started = time.perf_counter()
        completions = asyncio.run(answer())
        seconds = time.perf_counter() - started
    texts = [completion.text for completion in completions]
    return {
        "seconds": seconds,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "answers": hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:12],
        "largest_batch": backend.scheduler.largest_batch if backend.scheduler else 0,
        "prompt_tokens": sum(completion.prompt_tokens or 0 for completion in completions),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--queries", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--budget-gib", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--variant", choices=("budget", "rows"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(one_pass(args)))
        return
    if not TAU_BENCH.is_file():
        raise SystemExit(f"bench/kv_budget.py: no tau-bench runs at {TAU_BENCH} (the shared/ folder beside the repo)")
    results: dict[str, list[dict]] = {"rows": [], "budget": []}
    for _ in range(args.repeats):
        for variant in ("rows", "budget"):
            child = [sys.executable, __file__, *sys.argv[1:], "--variant", variant]
            result = json.loads(
                subprocess.run(child, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
            )
            results[variant].append(result)
            print(
                f"{variant:6s} {result['seconds']:7.1f} s  peak {result['peak_mb']:7.0f} MB  "
                f"largest batch {result['largest_batch']:2d}  answers {result['answers']}",
                flush=True,
            )
    rows, budget = results["rows"], results["budget"]
    same = {r["answers"] for r in rows} == {r["answers"] for r in budget}
    print(
        f"{args.queries} tau-bench queries ({rows[0]['prompt_tokens']} prompt tokens), max_tokens {args.max_tokens}, "
        f"batch size {args.batch_size}, budget {args.budget_gib} GiB, model {args.model}"
    )
    print(
        f"budget vs rows alone: time {median(r['seconds'] for r in budget) / median(r['seconds'] for r in rows):.2f}x, "
        f"peak memory {median(r['peak_mb'] for r in budget) / median(r['peak_mb'] for r in rows):.2f}x; "
        f"same answers: {same}; load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
