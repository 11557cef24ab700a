"""What a training step of the demo's real model costs on this machine: full fine-tuning in float32 against
full fine-tuning under bfloat16 autocast (`model.mixed_precision`), against LoRA, and long windows against
short ones (issue 16: "measure per-step cost with and without LoRA, shorter windows"), each printed as a
ratio to float32 full fine-tuning on the longest window, measured in the same run.

    python bench/cpu_training_step.py [--model smollm2-135m-instruct] [--lengths 1024 512] [--repeats 3]

The variants run interleaved (full, bf16, LoRA, full, bf16, LoRA, ...) so that load from other processes on a
shared machine falls on all of them alike; the first step of each is a warm-up and not counted. A step
is a forward pass with the project's loss on one row (`pipeline/training/token_loss.py`: no
[tokens x vocabulary] logits), the backward pass and an AdamW update; weights and optimizer state in
float32 in every variant, the bf16 one running forward and backward under `torch.autocast` as the Trainer
does with `bf16=True`. Whether this CPU has bfloat16 instructions (without them torch emulates bfloat16,
slower than float32) is printed first.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.base_model import add_model_argument, model_folder

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _variant(folder: str, lora: bool):
    """The model with the project's loss, and (LoRA) adapters on every projection of it, rank 16."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.training.token_loss import install_token_loss

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    install_token_loss(model, "chunked")  # LoRA layers replace the projections in place: the loss still sees them
    if lora:
        from peft import LoraConfig, get_peft_model

        get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(trainable, lr=1e-5), sum(p.numel() for p in trainable)


def _step(model, optimizer, length: int, bf16: bool) -> float:
    import torch

    ids = torch.randint(0, model.config.vocab_size, (1, length + 1))
    positions = torch.arange(length)[None]
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model.forward(input_ids=ids[:, :-1], position_ids=positions, shift_labels=ids[:, 1:])
    (out["loss_sum"] / out["label_count"]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 512])
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per variant (after one warm-up)")
    args = parser.parse_args()
    from pipeline.training.models import cpu_has_bf16

    print(f"bfloat16 instructions on this CPU (AVX512-BF16 or AMX): {'yes' if cpu_has_bf16() else 'no'}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        variants = {"full": _variant(folder, False), "bf16": _variant(folder, False), "lora": _variant(folder, True)}
        times: dict[tuple[str, int], list[float]] = {}
        for length in args.lengths:
            for round_ in range(args.repeats + 1):
                for name, (model, optimizer, _) in variants.items():
                    took = _step(model, optimizer, length, bf16=name == "bf16")
                    if round_:
                        times.setdefault((name, length), []).append(took)
    reference = statistics.median(times[("full", max(args.lengths))])
    print(f"{'variant':<8}{'window':>8}{'trainable':>14}{'median s/step':>15}{'ratio':>8}{'s per 1k tokens':>17}")
    for (name, length), series in times.items():
        median = statistics.median(series)
        print(
            f"{name:<8}{length:>8}{variants[name][2]:>14,}{median:>15.2f}{median / reference:>8.2f}{median / length * 1000:>17.2f}"
        )


if __name__ == "__main__":
    main()
