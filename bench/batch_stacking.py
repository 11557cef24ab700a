"""A pass's prefill parts stacked into one batch at once (pipeline/llm/batching.py `_stacked`) against the way
they were joined before: two at a time, each join copying the growing batch's whole cache, with no room left
for the next token, and a row leaving the batch copying the others' cache twice (the selection, then new room).

    python bench/batch_stacking.py [--model smollm2-135m-instruct] [--queries 24] [--max-tokens 64] [--repeats 2]

A validation or evaluation pass admits every target at once; its prefill runs in dozens of parts (a family's
common beginning once, then the rest of each prompt in groups of similar length), and every part's cache joins
the batch. The requests are the bundled demo's terminal turns in the stages' shape (bench/local_decoding.py
`demo_requests`). After one pass not counted (the model's first calls, memory the process has not used yet),
the variants alternate, each pass timed whole (prefill and decoding) with the prefill's share apart. Prints each
pass, the medians' ratio, and whether the answers agree (they should to the token: both variants compute the
same tensors, only the copies differ). Warm passes understate the gain of a stage's pass, whose model and
buffers are new: measured cold, one process a pass, the demo's 24 validation targets prefilled in 20.1 s joined
and 10.4 s stacked (docs/performance.md).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.base_model import add_model_argument, model_folder
from bench.local_decoding import demo_requests
from bench.prefix_sharing import answer
from bench.rows_leaving import select_copying


def joined_two_at_a_time(parts):
    """The baseline: each part joined to the batch so far, both left-padded to one width and concatenated."""
    import torch
    import torch.nn.functional as F

    def left_pad(tensor, width: int):
        flat = tensor.dim() == 2
        missing = width - tensor.shape[-1 if flat else -2]
        if missing <= 0:
            return tensor
        return F.pad(tensor, (missing, 0) if flat else (0, 0, missing, 0))

    batch = parts[0]
    for other in parts[1:]:
        width = max(batch.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(batch.cache.layers, other.cache.layers):
            mine.keys = torch.cat([left_pad(mine.keys, width), left_pad(theirs.keys, width)], dim=0)
            mine.values = torch.cat([left_pad(mine.values, width), left_pad(theirs.values, width)], dim=0)
        batch.mask = torch.cat([left_pad(batch.mask, width), left_pad(other.mask, width)], dim=0)
        batch.rows += other.rows
        batch.last_position = torch.cat([batch.last_position, other.last_position])
        batch.logits = torch.cat([batch.logits, other.logits])
    return batch


class Variant:
    """Puts one way of joining (and of selecting rows) in place for the passes that follow."""

    def __init__(self):
        from transformers.cache_utils import DynamicLayer

        from pipeline.llm import batching
        from pipeline.llm.kv_cache import ReservedLayer

        self.batching, self.layer = batching, ReservedLayer
        self.stacked, self.select = batching._stacked, ReservedLayer.batch_select_indices
        self.select_before = DynamicLayer.batch_select_indices
        self.leave = batching._Batch.select  # rows leave in place since (bench/rows_leaving.py)
        self.prefill_seconds = 0.0
        prefill = batching.Scheduler._prefill

        def timed(scheduler, rows):
            started = time.perf_counter()
            try:
                return prefill(scheduler, rows)
            finally:
                self.prefill_seconds += time.perf_counter() - started

        batching.Scheduler._prefill = timed

    def use(self, name: str) -> None:
        joining = name == "joined"
        self.batching._stacked = joined_two_at_a_time if joining else self.stacked
        self.layer.batch_select_indices = self.select_before if joining else self.select
        # The baseline's rows left by a selection (copying the rest twice: the selection, then new room).
        self.batching._Batch.select = select_copying if joining else self.leave
        self.prefill_seconds = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--queries", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="passes per variant, alternating")
    args = parser.parse_args()

    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.batching import MIN_SHARED_PREFIX
    from pipeline.llm.transformers_backend import TransformersBackend

    variant = Variant()
    passes: dict[str, list[tuple[float, float]]] = {"joined": [], "stacked": []}
    answers: dict[str, list[list[int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        backend = TransformersBackend(EndpointConfig(backend="transformers", model=folder, device="cpu"))
        prompts = backend._prompt_ids(demo_requests(args.queries), "")
        variant.use("stacked")
        answer(backend, prompts, args.max_tokens, MIN_SHARED_PREFIX)  # warm-up, not counted
        for _ in range(args.repeats):
            for name in passes:
                variant.use(name)
                answers[name], _, seconds = answer(backend, prompts, args.max_tokens, MIN_SHARED_PREFIX)
                passes[name].append((seconds, variant.prefill_seconds))

    print(
        f"{len(prompts)} greedy requests at once, max_tokens {args.max_tokens}, model {args.model}; "
        f"{sum(map(len, prompts))} prompt tokens, answers of {sum(map(len, answers['stacked']))} tokens"
    )
    for name, series in passes.items():
        shown = ", ".join(f"{whole:.1f} s (prefill {prefill:.1f})" for whole, prefill in series)
        print(f"{name:<8} {shown}")
    joined = statistics.median(whole for whole, _ in passes["joined"])
    stacked = statistics.median(whole for whole, _ in passes["stacked"])
    same = sum(a == b for a, b in zip(answers["joined"], answers["stacked"]))
    print(
        f"ratio (medians): {joined / stacked:.2f}x faster stacked; same answer for {same} of {len(prompts)}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
