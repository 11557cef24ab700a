"""Float32 against int8 weights (`quantize: int8`) for local decoding on a CPU: step time, prefill time, and
how far greedy answers agree, one run.

    python bench/int8_decoding.py [--model smollm2-135m-instruct] [--rows 8] [--prompt-tokens 600] [--steps 24]

Step and prefill: random prompts of `--prompt-tokens` tokens in `--rows` rows, then `--steps` greedy decoding
steps, each setting twice, interleaved. Agreement: the demo's terminal queries (bench/local_decoding.py's),
40 greedy tokens each from both models, counted up to the first token where they part. Prints each time and
its ratio to float32.
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


def timed_decoding(model, ids, steps: int) -> tuple[float, float]:
    """(prefill seconds, mean seconds a decoding step)."""
    import torch

    with torch.inference_mode():
        started = time.perf_counter()
        out = model(ids, use_cache=True)
        prefill = time.perf_counter() - started
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        started = time.perf_counter()
        for _ in range(steps):
            out = model(token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return prefill, (time.perf_counter() - started) / steps


def greedy(model, tokenizer, messages, tokens: int) -> list[int]:
    import torch

    ids = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=600)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--queries", type=int, default=8)
    args = parser.parse_args()

    import torch

    from pipeline.llm.transformers_backend import int8_weights
    from pipeline.training.models import load_causal_lm, load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        tokenizer = load_tokenizer(folder)
        models = {"float32": load_causal_lm(folder).eval()}
        models["int8"] = int8_weights(load_causal_lm(folder).eval())
    ids = torch.randint(
        100, tokenizer.vocab_size - 100, (args.rows, args.prompt_tokens), generator=torch.Generator().manual_seed(0)
    )
    timings: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    for _ in range(2):
        for name, model in models.items():
            timings[name].append(timed_decoding(model, ids, args.steps))
    agreed = total = 0
    for request in demo_requests(args.queries):
        reference, other = (greedy(models[name], tokenizer, request.messages, 40) for name in ("float32", "int8"))
        agreed += next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), min(len(reference), len(other)))
        total += len(reference)

    base_prefill = min(p for p, _ in timings["float32"])
    base_step = min(s for _, s in timings["float32"])
    print(f"{args.rows} rows x {args.prompt_tokens} prompt tokens, {args.steps} greedy steps, model {args.model}")
    for name, runs in timings.items():
        prefill, step = min(p for p, _ in runs), min(s for _, s in runs)
        print(
            f"{name:8s} prefill {prefill:6.2f} s ({prefill / base_prefill:.2f}x)  step {step * 1000:6.1f} ms ({step / base_step:.2f}x)"
        )
    print(
        f"greedy answers of {args.queries} demo queries: int8 follows float32 for {agreed} of {total} tokens "
        f"before they part ({agreed / args.queries:.1f} a query)"
    )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
