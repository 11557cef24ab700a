"""Prefilling prompts that begin alike once (pipeline/llm/batching.py `prefix_families`) against every prompt
prefilled whole, in one run, on the same greedy requests.

    python bench/prefix_sharing.py [--model smollm2-135m-instruct] [--queries 30] [--max-tokens 64]

An evaluation or validation pass asks one model many targets at once, and targets of one environment share its
system prompt, targets of one trajectory its history too: on 30 of the demo's eval targets 7,800 of 13,100 prompt
tokens repeat an earlier prompt's beginning. The requests are the bundled demo's terminal turns in the stages'
shape (bench/local_decoding.py `demo_requests`), all admitted at once (one batch). Prints each path's time, the
prompt tokens each ran through the model, their ratio, and whether the answers agree (greedy: they should, up
to float rounding of a differently split prefill).
"""

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.base_model import add_model_argument, model_folder
from bench.local_decoding import demo_requests


def answer(
    backend, prompts: list[list[int]], max_tokens: int, min_shared_prefix: int | None, draft_tokens: int | None = None
) -> tuple[list[list[int]], int, float]:
    """Greedy answers to `prompts`, all admitted at once; (answers, prompt tokens prefilled, seconds). `draft_tokens`:
    the scheduler's (None: its default)."""
    from pipeline.llm.batching import DRAFT_TOKENS, Row, Sampling, Scheduler

    model, tokenizer, stops = backend._load()
    scheduler = Scheduler(
        model,
        tokenizer,
        stops,
        max_batch=len(prompts),
        min_shared_prefix=min_shared_prefix,
        draft_tokens=DRAFT_TOKENS if draft_tokens is None else draft_tokens,
    )
    done, ended = threading.Event(), []

    def listener(step) -> None:
        if step.finish_reason is not None:
            ended.append(step)
            if len(ended) == len(prompts):
                done.set()

    rows = [Row(prompt, Sampling(max_tokens=max_tokens, temperature=0), 0, listener) for prompt in prompts]
    started = time.perf_counter()
    scheduler.submit(rows)
    done.wait()
    seconds = time.perf_counter() - started
    scheduler.close()
    return [row.generated for row in rows], scheduler.prefilled_tokens, seconds


def print_alternating(
    prompts: list[list[int]],
    label: str,
    passes: dict[str, list[float]],
    answers: dict[str, list[list[int]]],
    faster: str,
    notes: dict[str, str] | None = None,
) -> None:
    """The report of two variants' alternating passes (the first the baseline): the requests and answers, each
    pass's seconds (and a note per variant), the medians' ratio, and for how many requests the answers agree."""
    import os
    import statistics

    baseline, candidate = passes
    lengths = sorted(map(len, answers[candidate]))
    print(
        f"{len(prompts)} greedy requests at once, {label}; {sum(map(len, prompts))} prompt tokens; answers of "
        f"{lengths[0]} to {lengths[-1]} tokens (median {lengths[len(lengths) // 2]}, {sum(lengths)} in all)"
    )
    for name, series in passes.items():
        print(f"{name:<9} " + ", ".join(f"{seconds:.1f} s" for seconds in series) + (notes or {}).get(name, ""))
    ratio = statistics.median(passes[baseline]) / statistics.median(passes[candidate])
    same = sum(a == b for a, b in zip(answers[baseline], answers[candidate]))
    print(
        f"ratio (medians): {ratio:.2f}x faster {faster}; same answer for {same} of {len(prompts)}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.batching import MIN_SHARED_PREFIX
    from pipeline.llm.transformers_backend import TransformersBackend

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        requests = demo_requests(args.queries)
        backend = TransformersBackend(EndpointConfig(backend="transformers", model=folder, device="cpu"))
        prompts = backend._prompt_ids(requests, "")
        answer(backend, prompts[:1], 1, None)  # load and warm up before either clock
        whole, whole_tokens, whole_s = answer(backend, prompts, args.max_tokens, None)
        shared, shared_tokens, shared_s = answer(backend, prompts, args.max_tokens, MIN_SHARED_PREFIX)

    same = sum(a == b for a, b in zip(whole, shared))
    print(
        f"{len(prompts)} greedy requests at once, max_tokens {args.max_tokens}, model {args.model}; "
        f"{sum(map(len, prompts))} prompt tokens, answers of {sum(map(len, whole))} tokens"
    )
    print(f"every prompt prefilled whole:  {whole_s:7.1f} s  ({whole_tokens} prompt tokens run)")
    print(f"common beginnings once:        {shared_s:7.1f} s  ({shared_tokens} prompt tokens run)")
    print(
        f"ratio: {whole_s / shared_s:.2f}x faster; same answer for {same} of {len(prompts)}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
