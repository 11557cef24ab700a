"""What a packed training step costs on a CPU with each sequence attended on its own (`simulacra_segments`,
pipeline/training/segment_attention.py) against transformers' SDPA path, which masks the whole row densely;
printed as a ratio to the SDPA step, measured in the same run.

    python bench/segment_attention.py [--model smollm2-135m-instruct] [--row 1024] [--lengths 728 437 929 ...]
        [--repeats 3]

The rows are the project's own (pipeline/training/packing.py: best-fit rows of `--row` tokens, the
collator's positions and offsets) over sequences of `--lengths` tokens, by default lengths spread like the
demo's CPT windows (median 728, from 437 to 1,000 tokens), a fifth of their tokens labelled. A step is the
project's loss forward (pipeline/training/token_loss.py), the backward pass and a fused AdamW update, all in
float32; the two variants run interleaved (sdpa, segments, sdpa, ...) so that load from other processes falls
on both alike, and the first step of each is a warm-up. The losses of the two are printed too: the same to
float32 rounding, or the comparison means nothing.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.base_model import add_model_argument, model_folder

# Window lengths spread like the demo's CPT sequences (5th, 25th, 50th, 75th, 95th percentiles: 437, 550, 728,
# 929, 1,001 tokens, measured on its train.parquet, 2026-12-04).
DEMO_LENGTHS = (437, 550, 728, 929, 1001, 640, 810, 500, 980, 700, 600, 860)


def _model(folder: str, attention: str):
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.training.token_loss import install_token_loss

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=attention)
    install_token_loss(model, "chunked")
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)


def _rows(lengths: list[int], row: int, vocab: int):
    """Batches of one packed row each, with a fifth of their positions labelled (seeded)."""
    import numpy as np

    from pipeline.training.packing import PackedCollator, PackedSequences

    class Sequences:
        def __init__(self):
            rng = np.random.default_rng(0)
            self.items = []
            for n in lengths:
                ids = rng.integers(0, vocab, n).tolist()
                self.items.append({"input_ids": ids, "labels": [t if rng.random() < 0.2 else -100 for t in ids]})

        def __len__(self):
            return len(self.items)

        def __getitem__(self, index):
            return self.items[index]

        def lengths(self):
            return [len(item["input_ids"]) for item in self.items]

        def set_epoch(self, epoch):
            pass

    packed = PackedSequences(Sequences(), row, seed=0)
    collate = PackedCollator(pad_token_id=0, width=row)
    return [collate([packed[i]]) for i in range(len(packed))]


def _step(model, optimizer, batch) -> tuple[float, float]:
    start = time.perf_counter()
    out = model(**batch)
    loss = out["loss_sum"] / out["label_count"]
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start, loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--row", type=int, default=1024, help="packed row length (cpt.max_length)")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(DEMO_LENGTHS), help="sequence lengths")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per variant (after one warm-up)")
    args = parser.parse_args()
    from pipeline.training import segment_attention

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        variants = {"sdpa": _model(folder, "sdpa"), "segments": _model(folder, segment_attention.register())}
        vocab = variants["sdpa"][0].config.vocab_size
        batches = _rows(args.lengths, args.row, vocab)
        times: dict[str, list[float]] = {name: [] for name in variants}
        first_loss: dict[str, float] = {}
        for round_ in range(args.repeats + 1):
            batch = batches[round_ % len(batches)]
            for name, (model, optimizer) in variants.items():
                took, loss = _step(model, optimizer, batch)
                first_loss.setdefault(name, loss)
                if round_:
                    times[name].append(took)
    reference = statistics.median(times["sdpa"])
    rows = len(batches)
    segments = [int(b["cu_seq_lens_q"].numel() - 1) for b in batches]
    print(f"{len(args.lengths)} sequences in {rows} rows of {args.row} tokens ({segments} sequences a row, tails too)")
    print(f"{'attention':<10}{'median s/step':>15}{'ratio':>8}{'first loss':>12}")
    for name, series in times.items():
        median = statistics.median(series)
        print(f"{name:<10}{median:>15.2f}{median / reference:>8.2f}{first_loss[name]:>12.5f}")


if __name__ == "__main__":
    main()
