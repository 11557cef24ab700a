"""The LLM client with the transformers backend at two and at four batches in flight, same requests, one run.

    python bench/batches_in_flight.py [--model smollm2-135m-instruct] [--queries 24] [--samples 2] [--in-flight 2 4]

The client cuts its requests into batches of `batch_size` and keeps `max_in_flight` of them with the
backend; the decoder takes rows from all of them, but a batch is answered (and its answers committed)
only when its last row ends. So a batch holding one answer that runs to `max_tokens` keeps its slot that
long, and with two slots two such batches leave the decoder only their two long rows. The requests are
the demo's terminal queries (bench/local_decoding.py's), each sampled `--samples` times at temperature
0.8 with a seed, as the SFT generator asks: the same answers whatever the slots (each row has its own
seeded generator). Prints each setting's time, its ratio to the first, and whether the answers agree.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.base_model import add_model_argument, model_folder
from bench.local_decoding import demo_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--queries", type=int, default=24)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=320)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()

    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.chat import ChatRequest
    from pipeline.llm.client import open_client
    from pipeline.llm.transformers_backend import TransformersBackend
    from pipeline.store.database import Store

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        requests = [ChatRequest(r.messages, k) for r in demo_requests(args.queries) for k in range(args.samples)]
        endpoint = EndpointConfig(
            backend="transformers",
            model=folder,
            temperature=0.8,
            max_tokens=args.max_tokens,
            seed=0,
            batch_size=args.batch_size,
            device="cpu",
        )
        results = {}
        for slots in args.in_flight:
            TransformersBackend.max_in_flight = slots
            with Store(Path(tmp) / f"cache-{slots}.duckdb") as store:  # a cache of its own: nothing answered twice
                client = open_client(endpoint, store, "bench")
                client.backend._load()  # before the clock
                started = time.perf_counter()
                answers = client.complete_sync(requests)
                results[slots] = (time.perf_counter() - started, answers, client.backend.scheduler.largest_batch)

    first = args.in_flight[0]
    lengths = [a.completion_tokens for a in results[first][1]]
    print(
        f"{len(requests)} sampled requests, batch size {args.batch_size}, max_tokens {args.max_tokens}, model {args.model}"
    )
    print(
        f"answer lengths (tokens): min {min(lengths)}, max {max(lengths)}, total {sum(lengths)}, "
        f"at max_tokens {sum(n >= args.max_tokens for n in lengths)}"
    )
    for slots, (seconds, answers, largest) in results.items():
        same = sum(a.text == b.text for a, b in zip(answers, results[first][1]))
        print(
            f"max_in_flight {slots}: {seconds:7.1f} s, {results[first][0] / seconds:.2f}x of {first}; "
            f"largest batch {largest}; same answer for {same} of {len(requests)}"
        )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
