"""Rows leaving the continuous batch in place (pipeline/llm/batching.py `_Batch.select`, pipeline/llm/kv_cache.py
`ReservedLayer.keep_rows`) against the selection it replaced, which copied every row that stayed into new buffers
(`batch_select_indices`) and, when the leading padding could be dropped, copied the cache again into new room.

    python bench/rows_leaving.py [--model smollm2-135m-instruct] [--queries 24] [--max-tokens 128] [--repeats 2]

In a validation or evaluation pass every target is admitted at once and most answers end within the first
twenty steps, one or two a step, while a few run on to the cap: each of those departures copied the whole cache
(on 2 cores, 20 rows after 1,500-token prompts: 0.6-0.8 s, three decoding steps). In place, only the rows past
the batch's new end move into the slots of the rows that left, and the padding is dropped as a view. The
requests are the bundled demo's terminal turns in the stages' shape (bench/local_decoding.py `demo_requests`).
After one pass not counted, the variants alternate, each pass timed whole; prints each pass, the medians' ratio,
and whether the answers agree (they should to the token: the same tensors, only copies and row order differ).
"""

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.base_model import add_model_argument, model_folder
from bench.local_decoding import demo_requests
from bench.prefix_sharing import answer, print_alternating


def select_copying(batch, keep: list[int]):
    """The baseline: the rows `keep` copied into new buffers, in their order; a trim assigns the cache whole, so
    the next token copies it again into new room."""
    import torch

    if len(keep) < len(batch.rows):
        index = torch.tensor(keep, device=batch.mask.device)
        batch.cache.batch_select_indices(index)
        batch.rows = [batch.rows[i] for i in keep]
        batch.mask, batch.last_position, batch.logits = (
            batch.mask[index],
            batch.last_position[index],
            batch.logits[index],
        )
        used = batch.mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        if start:
            batch.mask = batch.mask[:, start:]
            for layer in batch.cache.layers:
                layer.keys, layer.values = layer.keys[..., start:, :], layer.values[..., start:, :]
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--queries", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="passes per variant, alternating")
    args = parser.parse_args()

    from pipeline.config.llm import EndpointConfig
    from pipeline.llm import batching
    from pipeline.llm.batching import MIN_SHARED_PREFIX
    from pipeline.llm.transformers_backend import TransformersBackend

    in_place = batching._Batch.select
    variants = {"copying": select_copying, "in place": in_place}
    passes: dict[str, list[float]] = {name: [] for name in variants}
    answers: dict[str, list[list[int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        backend = TransformersBackend(EndpointConfig(backend="transformers", model=folder, device="cpu"))
        prompts = backend._prompt_ids(demo_requests(args.queries), "")
        answer(backend, prompts, args.max_tokens, MIN_SHARED_PREFIX)  # warm-up, not counted
        for _ in range(args.repeats):
            for name, select in variants.items():
                batching._Batch.select = select
                answers[name], _, seconds = answer(backend, prompts, args.max_tokens, MIN_SHARED_PREFIX)
                passes[name].append(seconds)
        batching._Batch.select = in_place

    label = f"max_tokens {args.max_tokens}, model {args.model}"
    print_alternating(prompts, label, passes, answers, "in place")


if __name__ == "__main__":
    main()
