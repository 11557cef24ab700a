"""What a decoding step costs with transformers' DynamicCache against the project's ReservedCache, and what
more rows cost a step, measured interleaved in one run and printed as ratios to DynamicCache at 8 rows.

    python bench/kv_cache.py [--model smollm2-135m-instruct] [--shapes 8x600 8x1200 16x600] [--steps 40] [--repeats 2]

A step is one greedy token for every row after a prompt of the given length (random token ids: the cost
does not depend on the text), through the model as the continuous batch calls it (pipeline/llm/batching.py).
DynamicCache appends each token's keys and values with `torch.cat`, copying each layer's whole cache every
step; ReservedCache (pipeline/llm/kv_cache.py) writes into room it reserved. Also checks that both give the
same tokens. The variants alternate (dynamic, reserved, dynamic, ...) so that load from other processes on a
shared machine falls on both alike.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.base_model import add_model_argument, model_folder


def _decode(model, cache, rows: int, prompt: int, steps: int) -> tuple[float, list[int]]:
    """Seconds per decoding step, and the tokens of the first row."""
    import torch

    from pipeline.llm.kv_cache import cache_keyword

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, model.config.vocab_size - 100, (rows, prompt), generator=generator)
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        logits = model(
            input_ids=ids, attention_mask=mask, **{cache_keyword(model): cache}, use_cache=True, logits_to_keep=1
        ).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
        first = [int(token[0])]
        start = time.perf_counter()
        for step in range(steps):
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            positions = torch.full((rows, 1), prompt + step)
            logits = model(
                input_ids=token,
                attention_mask=mask,
                position_ids=positions,
                **{cache_keyword(model): cache},
                use_cache=True,
            ).logits
            token = logits[:, -1].argmax(-1, keepdim=True)
            first.append(int(token[0]))
        return (time.perf_counter() - start) / steps, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--shapes", nargs="+", default=["8x600", "8x1200", "16x600"], help="ROWSxPROMPT_TOKENS")
    parser.add_argument("--steps", type=int, default=40, help="decoding steps timed per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per variant and shape")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from pipeline.llm.kv_cache import ReservedCache

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        caches = {"dynamic": DynamicCache, "reserved": ReservedCache}
        shapes = [tuple(int(part) for part in shape.split("x")) for shape in args.shapes]
        times: dict[tuple[str, int, int], list[float]] = {}
        agree = True
        for rows, prompt in shapes:
            for _ in range(args.repeats):
                tokens = {}
                for name, cache in caches.items():
                    took, tokens[name] = _decode(model, cache(), rows, prompt, args.steps)
                    times.setdefault((name, rows, prompt), []).append(took)
                agree = agree and tokens["dynamic"] == tokens["reserved"]
    base_rows, base_prompt = shapes[0]
    reference = statistics.median(times[("dynamic", base_rows, base_prompt)])
    print(
        f"{'cache':<10}{'rows':>6}{'prompt':>8}{'ms/step':>10}{'vs dynamic here':>17}{'vs dynamic ' + args.shapes[0]:>18}"
        f"{'tokens/s':>10}"
    )
    for (name, rows, prompt), series in times.items():
        median = statistics.median(series)
        here = median / statistics.median(times[("dynamic", rows, prompt)])
        print(
            f"{name:<10}{rows:>6}{prompt:>8}{median * 1000:>10.0f}{here:>17.2f}{median / reference:>18.2f}{rows / median:>10.1f}"
        )
    print(f"same greedy tokens with both caches: {agree}")


if __name__ == "__main__":
    main()
