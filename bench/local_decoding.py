"""The `transformers` backend's continuous batching against one `generate` call per batch, in one run.

    python bench/local_decoding.py [--model smollm2-135m-instruct] [--queries 16] [--batch-size 8] [--max-tokens 320]

The demo's stages ask the local model for many answers of very different lengths (one batch of the
demo's eval queries ran from 3 to 320 tokens): `generate` holds every row of a batch until its longest
ends, continuous batching (pipeline/llm/batching.py) lets a finished row leave and a waiting one take
its place. Both paths answer the same greedy requests, built from the bundled demo's terminal
trajectories in the stages' shape (the trajectory's task description as the system prompt, the history
as turns, the next action; not the stages' own prompt templates), with the configured loop stop. Prints the time of each, their ratio, the tokens each generated and
whether the answers agree (greedy: they should, up to float rounding of differently padded batches).
"""

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.base_model import add_model_argument, model_folder


def demo_requests(count: int):
    """Chat requests from the demo's terminal trajectories: each turn after the first, its history kept
    to the turns before it (at most 800 characters, as the demo keeps it)."""
    from pipeline.llm.chat import ChatRequest

    requests = []
    for line in (REPO / "data/demo/terminal.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        steps = record["turns"]
        system = {"role": "system", "content": record["system"]["task_description"]}
        history: list[dict[str, str]] = []
        for step in steps:
            action, observation = str(step.get("action", "")), str(step.get("observation", ""))
            if history:
                kept, size = [], 0
                for message in reversed(history):
                    size += len(message["content"])
                    if size > 800:
                        break
                    kept.insert(0, message)
                requests.append(ChatRequest((system, *kept, {"role": "user", "content": action})))
                if len(requests) == count:
                    return requests
            history += [{"role": "user", "content": action}, {"role": "assistant", "content": observation}]
    return requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=320)
    args = parser.parse_args()

    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.transformers_backend import TransformersBackend

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        requests = demo_requests(args.queries)
        if len(requests) < args.queries:
            raise SystemExit(
                f"the demo's terminal trajectories hold {len(requests)} queries, fewer than --queries {args.queries}"
            )
        endpoint = EndpointConfig(
            backend="transformers",
            model=folder,
            temperature=0.0,
            max_tokens=args.max_tokens,
            batch_size=args.batch_size,
            device="cpu",
        )
        backend = TransformersBackend(endpoint)
        backend._load()  # before either clock

        # Shortest prompts first, batch by batch, as the client orders and cuts them.
        requests.sort(key=lambda r: sum(len(m["content"]) for m in r.messages))
        batches = [requests[i : i + args.batch_size] for i in range(0, len(requests), args.batch_size)]

        started = time.perf_counter()
        one_call = [c for batch in batches for c in backend._generate(batch)]
        generate_s = time.perf_counter() - started

        async def continuous():
            async with backend.connect() as send:
                answered = await asyncio.gather(*(send(batch) for batch in batches))
            return [c for batch in answered for c in batch]

        started = time.perf_counter()
        rows = asyncio.run(continuous())
        continuous_s = time.perf_counter() - started

    lengths = [c.completion_tokens for c in one_call]
    same = sum(a.text == b.text for a, b in zip(one_call, rows))
    print(
        f"{len(requests)} greedy requests, batch size {args.batch_size}, max_tokens {args.max_tokens}, model {args.model}"
    )
    print(f"answer lengths (tokens): min {min(lengths)}, max {max(lengths)}, total {sum(lengths)}")
    print(f"generate, one call a batch:  {generate_s:7.1f} s")
    print(f"continuous batching:         {continuous_s:7.1f} s")
    print(
        f"ratio: {generate_s / continuous_s:.2f}x faster; same answer for {same} of {len(requests)}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
