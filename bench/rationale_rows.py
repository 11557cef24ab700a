"""SFT rationale requests through the transformers backend at the endpoint's rows a step and at more, one run.

    python bench/rationale_rows.py [--model smollm2-135m-instruct] [--queries 24] [--samples 2] [--rows 8 48]

A rationale request (pipeline/sft/rationale.py) is one short user turn, the action and an observation, answered
in at most `--max-tokens` tokens. The requests here are the demo's terminal queries (bench/local_decoding.py's),
each shown its real observation (a model's guess is as long), asked `--samples` times at temperature 0.8 with
a seed, as the demo's SFT generator asks. Each setting answers from a fresh cache; each row samples from its
own seeded generator, so the answers agree whatever the rows. Prints each setting's time and its ratio to
the first.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.base_model import add_model_argument, model_folder


def rationale_requests(count: int, samples: int):
    """(action, real observation) of the demo's terminal turns, as rationale requests."""
    from pipeline.llm.chat import ChatRequest
    from pipeline.sft.queries import Query
    from pipeline.sft.rationale import rationale_messages
    from pipeline.store.schema import SystemPrompt

    requests = []
    for line in (REPO / "data/demo/terminal.jsonl").read_text(encoding="utf-8").splitlines():
        for index, step in enumerate(json.loads(line)["turns"]):
            query = Query("bench", index, "terminal", SystemPrompt(), (), str(step.get("action", "")), "", 0)
            messages = rationale_messages(query, str(step.get("observation", "")))
            requests += [ChatRequest(messages, k) for k in range(samples)]
            if len(requests) >= count * samples:
                return requests
    return requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--queries", type=int, default=24)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 48])
    args = parser.parse_args()

    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.client import open_client
    from pipeline.store.database import Store

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        requests = rationale_requests(args.queries, args.samples)
        results = {}
        for rows in args.rows:
            endpoint = EndpointConfig(
                backend="transformers",
                model=folder,
                temperature=0.8,
                max_tokens=args.max_tokens,
                seed=0,
                batch_size=rows,
                device="cpu",
            )
            with Store(Path(tmp) / f"cache-{rows}.duckdb") as store:  # a cache of its own: nothing answered twice
                client = open_client(endpoint, store, "bench")
                client.backend._load()  # before the clock
                started = time.perf_counter()
                answers = client.complete_sync(requests)
                results[rows] = (time.perf_counter() - started, answers)

    first = args.rows[0]
    print(f"{len(requests)} rationale requests, max_tokens {args.max_tokens}, model {args.model}")
    for rows, (seconds, answers) in results.items():
        same = sum(a.text == b.text for a, b in zip(answers, results[first][1]))
        tokens = sum(a.completion_tokens or 0 for a in answers)
        print(
            f"{rows:3d} rows: {seconds:7.1f} s, {seconds / results[first][0]:.2f}x of {first} rows; {tokens} tokens; "
            f"same answer for {same} of {len(requests)}"
        )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
