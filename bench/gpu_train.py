"""Training throughput of the stages' own training path: non-padding tokens/s, MFU and peak memory.

    python bench/gpu_train.py                       # on a GPU: Qwen3-0.6B's shape, the targets of issue 9
    python bench/gpu_train.py --compare-padded      # and the padded batches the CPT stage used before, same run
    python bench/gpu_train.py --shape tiny --steps 4 --warmup-steps 1    # CPU smoke test (CI)
    deploy/gpu-check.sh                             # what a user with a GPU runs

1. The demo store: `data/configs/demo.yaml`'s sources through ingest, filter, score and split (the
   stages' own code, no Prefect) into `--workspace`, then CPT's own sequence building at
   `--max-length` (the tiny tokenizer built from the cpt pool, as the demo does). Kept between runs;
   `--prepare-only` does this step alone, so a GPU machine can train from a workspace prepared elsewhere.
2. The model: `--shape qwen3-0.6b` is a randomly initialised model of Qwen3-0.6B's shape (28 layers,
   hidden 1024, vocabulary 151,936, tied embeddings), built from its config with no hub and saved
   beside the tokenizer; `--shape tiny` is the demo's tiny model.
3. Training: `pipeline.training.trainer.train`, the entry point the CPT stage calls, for `--steps`
   optimizer steps (packed rows, the fused or chunked loss, the attention path it picks), with no
   held-out evaluation and no checkpoint inside the timed steps. Throughput is measured over the
   steps after `--warmup-steps` (compilation, allocator warm-up).
   It first checks, on a small model, that packed rows (several to a micro-batch) give the loss and
   gradients of the sequences run one by one, with the loss this device gets and every attention
   path the loader can pick here (flash_attention_2 with flash-attn, flex attention on CUDA, SDPA).
4. `--compare-padded`: the same model and sequences the way the CPT stage trained before issue 9
   (sequences padded to the longest of each batch of `--micro-batch-rows`, transformers' own
   loss over full logits), and the ratio of the two in this run.

MFU = achieved model FLOPs / the GPU's dense bf16 peak. Model FLOPs per token: 6 x the body's
parameters (embeddings excluded), plus attention 12 x layers x heads x head_dim x the mean causal
context (each sequence attends to itself only), plus 6 x vocabulary x hidden for each labelled
token (the output layer runs on labelled positions only).

Targets (issue 9, one H200, `--max-length` 2048): >= 80,000 non-padding tokens/s, peak <= 40 GiB.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Dense bf16 peak FLOP/s by device name (vendor data sheets, SXM parts, without sparsity).
PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 70e12,
}
QWEN3_06B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1_000_000,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
TARGET_TOKENS_PER_S = 80_000
TARGET_PEAK_GIB = 40


def demo_config(workspace: Path, options, base: str | None):
    from pipeline.config import load_config

    cpt = {
        "max_length": options.max_length,
        "micro_batch_rows": options.micro_batch_rows,
        "tokens_per_step": options.tokens_per_step or options.micro_batch_rows * options.max_length,
        "max_steps": options.steps,
        "save_steps": options.steps + 1,  # no checkpoint inside the timed steps
        "gradient_checkpointing": options.gradient_checkpointing,
        "loss": options.loss,
        "learning_rate": 1e-4,
    }
    overrides = [{"workspace": {"path": str(workspace)}, "model": {"base": base}, "cpt": cpt}]
    return load_config(REPO / "data" / "configs" / "demo.yaml", overrides)


def prepare_sequences(workspace: Path, options) -> Path:
    """The demo store and CPT's sequences of its cpt and eval pools, built once per max length into
    `<workspace>/bench/sequences-<max length>`. A workspace prepared elsewhere (`--prepare-only`)
    needs none of the data stages' packages (DuckDB, polars...) here: only the training path's."""
    prepared = workspace / "bench" / f"sequences-{options.max_length}"
    if (prepared / "train.parquet").is_file():
        return prepared
    from pipeline.store.database import open_store
    from pipeline.training.trainer import load_tokenizer_with_chatml
    from stages import cpt, ingest, score, split
    from stages import filter as filter_stage

    config = demo_config(workspace, options, None)
    store = open_store(config)
    try:
        if not store.scalar("SELECT count(*) FROM splits"):
            for stage in (ingest, filter_stage, score, split):
                stage.run(config, store)
        plan = cpt._plan(config, store)
        tokenizer, _ = load_tokenizer_with_chatml(config, plan.base_ref)
        cpt._build_sequences(config, plan, tokenizer)
    finally:
        store.close()
    shutil.copytree(plan.sequences_dir, prepared)
    return prepared


def random_qwen3_06b(workspace: Path, tokenizer_dir: Path) -> Path:
    """Qwen3-0.6B's shape, random weights in bf16, saved with the demo tokenizer (its ids are all < 151,936)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    folder = workspace / "models" / "qwen3-0.6b-random"
    if (folder / "config.json").is_file():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen3Config(**QWEN3_06B, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def model_flops_per_token(model_dir: Path, sequences_dir: Path) -> float:
    """See the module docstring; read from the model's config and the training sequences."""
    import numpy as np
    from transformers import AutoConfig

    from pipeline.training.sequences import IGNORE_INDEX, ParquetSequences

    config = AutoConfig.from_pretrained(model_dir)
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention_params = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp_params = 3 * hidden * config.intermediate_size
    body = layers * (attention_params + mlp_params)
    sequences = ParquetSequences([sequences_dir / "train.parquet"])  # epoch 0's keep-ratio masks
    lengths = sequences.lengths().astype(np.float64)
    labelled = sum(
        sum(1 for label in sequences[i]["labels"][1:] if label != IGNORE_INDEX) for i in range(len(sequences))
    )
    mean_context = float((lengths * (lengths + 1) / 2).sum() / lengths.sum())
    return 6 * body + 12 * layers * heads * head_dim * mean_context + 6 * vocab * hidden * labelled / lengths.sum()


class StepTimer:
    """Wall time and non-padding tokens between the end of the warm-up steps and the last step."""

    def __init__(self, warmup_steps: int):
        from transformers import TrainerCallback

        timer = self

        class Callback(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                timer.mark(state)

        self.callback = Callback()
        self.warmup_steps = warmup_steps
        self.start: tuple[float, int] | None = None
        self.end: tuple[float, int] | None = None

    def mark(self, state) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        point = (time.perf_counter(), state.num_input_tokens_seen)
        if state.global_step == self.warmup_steps:
            self.start = point
        if state.global_step > self.warmup_steps:
            self.end = point

    def tokens_per_second(self) -> float:
        (t0, n0), (t1, n1) = self.start, self.end
        return (n1 - n0) / (t1 - t0)


def reset_peak_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib() -> float:
    import resource

    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux; the process's peak


def train_packed(config, model_dir: Path, sequences_dir: Path, workspace: Path, warmup_steps: int) -> dict:
    """The stage's own path: `pipeline.training.trainer.train`."""
    from pipeline.training.trainer import TrainingJob, train

    timer = StepTimer(warmup_steps)
    run_dir = Path(tempfile.mkdtemp(prefix="packed-", dir=workspace))  # fresh: nothing to resume from
    job = TrainingJob(
        stage="bench",
        progress_label="bench training steps",
        base_ref=str(model_dir),
        train_files=[sequences_dir / "train.parquet"],
        eval_files=[],
        trainer_dir=run_dir / "trainer",
        model_dir=run_dir / "model",
        settings=config.cpt,
        callbacks=[timer.callback],
    )
    reset_peak_memory()
    outcome = train(config, job)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "tokens_per_s": timer.tokens_per_second(),
        "peak_gib": peak_memory_gib(),
        "attention": outcome.attention,
        "loss": outcome.loss,
        "tokens_per_step": outcome.tokens_per_step,
        "last_loss": outcome.loss_curve[-1][1],
    }


def train_padded(config, model_dir: Path, sequences_dir: Path, workspace: Path, warmup_steps: int) -> dict:
    """The baseline: the CPT stage before issue 9. Batches of `micro_batch_rows` sequences padded to the
    longest, transformers' loss over full logits, SDPA, the same steps and learning rate."""
    import torch
    from transformers import PrinterCallback, Trainer, TrainingArguments

    from pipeline.training.models import load_causal_lm, load_tokenizer
    from pipeline.training.sequences import PadCollator, ParquetSequences

    cpt = config.cpt
    timer = StepTimer(warmup_steps)
    run_dir = Path(tempfile.mkdtemp(prefix="padded-", dir=workspace))
    tokenizer = load_tokenizer(str(model_dir))
    on_cuda = torch.cuda.is_available()
    args = TrainingArguments(
        output_dir=str(run_dir),
        max_steps=cpt.max_steps,
        per_device_train_batch_size=cpt.micro_batch_rows,
        learning_rate=cpt.learning_rate,
        lr_scheduler_type="cosine",
        save_strategy="no",
        logging_steps=1,
        use_cpu=not on_cuda,
        bf16=on_cuda,
        include_num_input_tokens_seen="non_padding",
        seed=cpt.seed,
        remove_unused_columns=False,
        report_to="none",
        disable_tqdm=True,
    )
    model = load_causal_lm(str(model_dir), config.model.dtype, attn_implementation="sdpa")
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=ParquetSequences([sequences_dir / "train.parquet"]),
        data_collator=PadCollator(tokenizer.pad_token_id),
        processing_class=tokenizer,
        callbacks=[timer.callback],
    )
    trainer.remove_callback(PrinterCallback)
    reset_peak_memory()
    trainer.train()
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"tokens_per_s": timer.tokens_per_second(), "peak_gib": peak_memory_gib()}


def packing_check_attentions() -> list[str]:
    """Every attention path the loader can pick on this device, the one training gets first (models.py):
    flash_attention_2 where flash-attn is installed on CUDA, flex attention on CUDA, SDPA everywhere, and
    on a CPU the per-sequence SDPA CPU training gets (`simulacra_segments`). Flex attention has no backward
    on CPU, so a CPU checks those two (tests/test_packing.py checks flex's forward and flash-attention's
    dispatch on CPU)."""
    import importlib.util

    import torch

    from pipeline.training.models import packed_attention_implementation

    available = ["sdpa"]
    if torch.cuda.is_available():
        available.append("flex_attention")
        if importlib.util.find_spec("flash_attn"):
            available.append("flash_attention_2")
    chosen = packed_attention_implementation()
    return [chosen] + [attention for attention in available if attention != chosen]


def check_packing(sequences_dir: Path, vocab_size: int, attention: str) -> tuple[bool, str]:
    """Packed vs one by one on this device with `attention` and the loss training picks: a small Qwen3
    (4 layers, hidden 256, the benchmark's vocabulary), loss and gradients. The rows are made narrow
    enough that the six sequences fill several, all in one micro-batch: flash-attention isolates
    sequences within a row only through the collator's offsets when a batch has more than one row
    (pipeline/training/packing.py). float32, except under flash-attention, which has no float32
    kernels: bf16 there, with bf16's tolerance."""
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pipeline.training.packing import PackedCollator, PackedSequences
    from pipeline.training.sequences import IGNORE_INDEX, ParquetSequences
    from pipeline.training.token_loss import install_token_loss, resolve_loss_implementation

    loss_kind = resolve_loss_implementation("auto")
    dtype = torch.bfloat16 if attention == "flash_attention_2" else torch.float32
    loss_tolerance, gradient_tolerance = (2e-2, 1e-1) if dtype == torch.bfloat16 else (1e-3, 1e-2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sequences = ParquetSequences([sequences_dir / "train.parquet"])
    picked = [sequences[int(i)] for i in sequences.lengths().argsort()[:6]]  # the shortest: several to a row
    lengths = [len(s["input_ids"]) for s in picked]
    width = max(max(lengths), -(-sum(lengths) // 2))  # at least two rows

    def model():
        torch.manual_seed(0)
        config = Qwen3Config(
            vocab_size=vocab_size,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
        )
        config._attn_implementation = attention
        return Qwen3ForCausalLM(config).to(device, dtype)

    reference = model()
    total, count = 0.0, 0
    for s in picked:
        logits = reference(input_ids=torch.tensor([s["input_ids"]], device=device)).logits[0, :-1]
        target = torch.tensor(s["labels"][1:], device=device)
        total = total + F.cross_entropy(logits.float(), target, ignore_index=IGNORE_INDEX, reduction="sum")
        count += int((target != IGNORE_INDEX).sum())
    expected = total / count
    expected.backward()

    class Picked:
        def __len__(self):
            return len(picked)

        def __getitem__(self, i):
            return picked[i]

        def lengths(self):
            return lengths

    packed_model = model()
    install_token_loss(packed_model, loss_kind)
    rows = PackedSequences(Picked(), width, seed=0)
    batch = PackedCollator(0, width)([rows[i] for i in range(len(rows))])
    outputs = packed_model(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    loss = outputs["loss_sum"] / outputs["label_count"]
    loss.backward()
    worst = max(
        ((p.grad.float() - q.grad.float()).norm() / q.grad.float().norm().clamp(min=1e-12)).item()
        for p, q in zip(packed_model.parameters(), reference.parameters())
        if q.grad is not None
    )
    relative = abs(loss.item() - expected.item()) / expected.item()
    matches = relative < loss_tolerance and worst < gradient_tolerance
    verdict = "ok" if matches else "MISMATCH"
    return matches, (
        f"packing check ({attention}, {loss_kind}, {len(picked)} sequences in {len(rows)} rows): loss "
        f"{loss.item():.5f} vs {expected.item():.5f} one by one, worst relative gradient difference {worst:.1e}: "
        f"{verdict}"
    )


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    on_cuda = torch.cuda.is_available()
    parser.add_argument("--shape", choices=["qwen3-0.6b", "tiny"], default="qwen3-0.6b" if on_cuda else "tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--micro-batch-rows", type=int, default=8)
    parser.add_argument("--tokens-per-step", type=int, default=None, help="Default: one micro-batch per step.")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--loss", choices=["auto", "liger", "chunked"], default="auto")
    parser.add_argument("--compare-padded", action="store_true", help="Also time the pre-packing CPT path.")
    parser.add_argument("--workspace", type=Path, default=None, help="Kept between runs (default: a temporary one).")
    parser.add_argument("--peak-tflops", type=float, default=None, help="The GPU's dense bf16 peak, if not listed.")
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="Build the demo store and sequences into --workspace and stop (for a GPU machine "
        "that has the training packages only).",
    )
    options = parser.parse_args()
    if not 1 <= options.warmup_steps < options.steps:
        parser.error("need 1 <= --warmup-steps < --steps")
    os.chdir(REPO)  # the demo config's paths are relative to the repository root

    workspace = options.workspace or Path(tempfile.mkdtemp(prefix="simulacra-gpu-train-"))
    workspace = workspace.resolve()
    sequences_dir = prepare_sequences(workspace, options)
    if options.prepare_only:
        print(f"prepared: {sequences_dir} (and the tiny tokenizer in {workspace / 'models' / 'tiny'})")
        return
    tiny_dir = workspace / "models" / "tiny"
    model_dir = random_qwen3_06b(workspace, tiny_dir) if options.shape == "qwen3-0.6b" else tiny_dir
    config = demo_config(workspace, options, str(model_dir))
    device = torch.cuda.get_device_name() if on_cuda else "CPU"
    print(
        f"{device}; {options.shape} model; max_length {options.max_length}; {options.micro_batch_rows} rows per "
        f"micro-batch; gradient checkpointing {'on' if options.gradient_checkpointing else 'off'}"
    )
    from transformers import AutoConfig

    vocab_size = AutoConfig.from_pretrained(model_dir).vocab_size
    mismatched = []
    for attention in packing_check_attentions():
        matches, line = check_packing(sequences_dir, vocab_size, attention)
        print(line, flush=True)
        if not matches:
            mismatched.append(attention)

    packed = train_packed(config, model_dir, sequences_dir, workspace, options.warmup_steps)
    peak = (
        options.peak_tflops * 1e12
        if options.peak_tflops
        else next((flops for name, flops in PEAK_BF16.items() if on_cuda and name in device), None)
    )
    flops = model_flops_per_token(model_dir, sequences_dir)
    mfu = f"{packed['tokens_per_s'] * flops / peak:.1%}" if peak else "n/a (no bf16 peak known for this device)"
    print(
        f"packed ({packed['attention']}, {packed['loss']} loss, {packed['tokens_per_step']} tokens/step): "
        f"{packed['tokens_per_s']:,.0f} non-padding tokens/s, MFU {mfu}, peak memory {packed['peak_gib']:.1f} GiB "
        f"{'(GPU, allocated)' if on_cuda else '(process RSS)'}, last loss {packed['last_loss']:.3f}"
    )
    if on_cuda and options.shape == "qwen3-0.6b" and options.max_length == 2048:
        met = packed["tokens_per_s"] >= TARGET_TOKENS_PER_S and packed["peak_gib"] <= TARGET_PEAK_GIB
        print(f"target >= {TARGET_TOKENS_PER_S:,} tokens/s and <= {TARGET_PEAK_GIB} GiB: {'met' if met else 'NOT met'}")
    if options.compare_padded:
        try:
            padded = train_padded(config, model_dir, sequences_dir, workspace, options.warmup_steps)
        except torch.cuda.OutOfMemoryError:
            # The padded path holds full float32 logits: batches that fit packed need not fit padded.
            print(f"padded (before issue 9): out of GPU memory at {options.micro_batch_rows} sequences a batch")
        else:
            print(
                f"padded (before issue 9): {padded['tokens_per_s']:,.0f} non-padding tokens/s, peak memory "
                f"{padded['peak_gib']:.1f} GiB"
            )
            print(f"packed / padded: {packed['tokens_per_s'] / padded['tokens_per_s']:.2f}x non-padding tokens/s")
    if mismatched:
        # The throughput above is still measured; the exit status says the run is not sound.
        sys.exit(
            f"packing check failed under {', '.join(mismatched)}: packed rows do not train what the "
            "sequences alone would"
        )


if __name__ == "__main__":
    main()
