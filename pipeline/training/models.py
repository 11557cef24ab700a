"""Loading the causal LM a training stage starts from: any HF model by name or path, or the tiny one.

Nothing here places a model on a device. Under `accelerate launch` (DeepSpeed ZeRO-3, FSDP) the
Trainer decides placement and sharding; a `.to(device)` here would break it.
"""

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import UserFixableError, out_of_space
from pipeline.training.gguf_base import SOURCE_FILE as GGUF_SOURCE_FILE
from pipeline.training.gguf_base import convert_gguf, is_gguf_ref, resolve_gguf
from pipeline.training.tiny_model import IM_END, IM_START

# Files whose bytes identify a local model folder (weights are covered by the config and the
# builder's seed for the tiny model, and by the GGUF file's digest for a converted one; hashing
# gigabytes of weights per run would cost more than it tells).
IDENTITY_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "tiny_model.json", GGUF_SOURCE_FILE)
# Beside a training stage's `model` folder: the run's fingerprint (pipeline/training/runs.py).
RUN_FINGERPRINT = "fingerprint.json"


def tiny_model_dir(config: Any) -> Path:
    """Where the workspace keeps its tiny offline model (`simulacra init-model` writes it)."""
    return config.workspace.root / "models" / "tiny"


def base_model_ref(config: Any, digests=None) -> str:
    """The name or path training starts from: `model.base`, the folder a GGUF `model.base` converts
    to (pipeline/training/gguf_base.py; it may not exist yet: `ensure_base_model`), or the
    workspace's tiny model."""
    base = config.model.base
    if base is None:
        return str(tiny_model_dir(config))
    if is_gguf_ref(base):
        return str(resolve_gguf(base, config.workspace.root, digests).folder)
    return base


def ensure_base_model(config: Any) -> str:
    """`base_model_ref`, with a GGUF base converted first if it is not yet (once per file: about
    30 s for SmolLM2-135M on 2 cores). The tiny model is built by CPT from its pool's text."""
    base = config.model.base
    if is_gguf_ref(base):
        return str(convert_gguf(resolve_gguf(base, config.workspace.root)))
    return base_model_ref(config)


def base_model_identity(config: Any, digests=None) -> str:
    """What the base model is, for fingerprints, without converting or loading anything: a GGUF
    file by its bytes, the tiny model by "tiny" (its config section and pool are fingerprinted
    already), anything else by `model_identity`."""
    base = config.model.base
    if base is None:
        return "tiny"
    if is_gguf_ref(base):
        return "gguf-" + resolve_gguf(base, config.workspace.root, digests).sha256[:16]
    return model_identity(base)


def model_identity(ref: str) -> str:
    """A short digest that changes when the model a name or path refers to changes.

    A local folder is identified by what it holds, never by its path (a moved or copied workspace
    keeps every fingerprint): its config and tokenizer files, and, for a training stage's output
    (`<run folder>/model`), the fingerprint of the run that trained it (`fingerprint.json` beside
    it), which tells two checkpoints of one architecture apart without hashing their weights. A hub
    name is identified by the name itself (a pinned revision belongs in the name: `org/model@rev` is
    not supported by from_pretrained, so pin by downloading to a folder)."""
    path = Path(ref)
    if not path.is_dir():
        return hashlib.sha256(ref.encode()).hexdigest()[:16]
    digest = hashlib.sha256(b"local folder")
    for name in IDENTITY_FILES:
        if (path / name).is_file():
            digest.update(name.encode())
            digest.update((path / name).read_bytes())
    run = path.parent / RUN_FINGERPRINT
    if run.is_file():
        digest.update(json.loads(run.read_text())["fingerprint"].encode())
    return digest.hexdigest()[:16]


def training_dtype(choice: str):
    """`model.dtype` as a torch dtype. auto: bfloat16 on a CUDA GPU that supports it, else float32
    (CPUs train float32; fp16 without a loss scaler diverges, so auto never picks it)."""
    import torch

    if choice == "auto":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, choice)


def cpu_has_bf16() -> bool:
    """Whether this CPU does bfloat16 arithmetic in hardware (AVX512-BF16 or AMX tiles); elsewhere torch
    emulates it, 1.28x slower than float32 (bench/cpu_training_step.py with oneDNN held below AVX512-BF16)."""
    import torch

    # torch's own CPUID checks (private in 2.13; no public equivalent): `lscpu` flags avx512_bf16 / amx_bf16.
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def mixed_precision_choice(config, stage_settings=None) -> str:
    """A training stage's `mixed_precision`, else `model.mixed_precision`."""
    own = getattr(stage_settings, "mixed_precision", None)
    return own if own is not None else config.model.mixed_precision


def bf16_mixed_precision(choice: str, dtype_choice: str) -> bool:
    """Whether training runs under bfloat16 autocast (`mixed_precision`; the weights keep `model.dtype`). Never
    with float16 weights: autocast would mix the two half formats."""
    import torch

    if training_dtype(dtype_choice) == torch.float16 or choice == "none":
        return False
    if choice == "bf16":
        return True
    gpu = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if choice == "native-bf16":
        return gpu or (not torch.accelerator.is_available() and cpu_has_bf16())
    # auto: a GPU's. Not a CPU's, although AVX512-BF16 makes a step 2.35x faster: at `make learn`'s budgets SFT and RL
    # trained so scored measurably lower on the validation pool (docs/performance.md, 2026-12-03, evening).
    return gpu


def load_tokenizer(ref: str, trust_remote_code: bool = False):
    """The tokenizer of `ref`, with a pad token (base models often lack one: pad with end-of-sequence,
    harmless because padded positions are masked out of attention and loss)."""
    from transformers import AutoTokenizer

    with _loadable(ref):
        tokenizer = AutoTokenizer.from_pretrained(ref, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def ensure_chatml_tokens(tokenizer) -> list[str]:
    """The CPT format is ChatML. A tokenizer without `<|im_start|>`/`<|im_end|>` as single tokens (Llama
    base models, for one) gets them added as special tokens; returns those added, so the caller
    resizes the model's embeddings."""
    vocab = tokenizer.get_vocab()
    missing = [token for token in (IM_START, IM_END) if token not in vocab]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing})
    return missing


def packed_attention_implementation() -> str:
    """The attention path for packed rows (pipeline/training/packing.py), each isolating sequences its
    own way: flash-attention's variable-length kernels where `flash_attn` is installed on a CUDA GPU;
    else flex attention on CUDA (a sparse BlockMask from the sequence boundaries: no slower than plain
    causal attention on an H200, STACK.md); else, on a CPU (where flex attention has no backward), SDPA
    run causally on each sequence of a row, cut out by the same offsets (pipeline/training/segment_attention.py:
    transformers' SDPA path masks the whole row densely, most of a CPU step's attention time)."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        from pipeline.training import segment_attention

        return segment_attention.register()
    return "flash_attention_2" if importlib.util.find_spec("flash_attn") else "flex_attention"


def reads_varlen_offsets(attention: str | None) -> bool:
    """Whether an attention implementation isolates packed sequences by flash-attention's variable-length
    offsets rather than by a mask: `flash_attention_2/3/4` and hub kernels of flash-attention
    ("kernels-community/flash-attn2"), all of which go through transformers' `_flash_attention_forward`."""
    return attention is not None and "flash" in attention


def takes_varlen_offsets(attention: str | None) -> bool:
    """Whether packed rows hand an attention implementation the offsets: flash-attention, which needs them, and
    the CPU's per-sequence SDPA, which reads them where it could otherwise only fall back to a mask."""
    from pipeline.training.segment_attention import NAME

    return reads_varlen_offsets(attention) or attention == NAME


def load_causal_lm(
    ref: str, dtype: str = "auto", trust_remote_code: bool = False, attn_implementation: str | None = None
):
    """Any Hugging Face causal LM by hub name or local folder, on no particular device."""
    from transformers import AutoModelForCausalLM

    if not Path(ref).exists() and (ref.startswith((".", "/", "~")) or ref.count("/") > 1):
        raise UserFixableError(f"model.base: {ref} is neither a local folder nor a hub name")
    with _loadable(ref):
        return AutoModelForCausalLM.from_pretrained(
            ref,
            dtype=training_dtype(dtype),
            trust_remote_code=trust_remote_code,
            attn_implementation=attn_implementation,
        )


@contextlib.contextmanager
def _loadable(ref: str) -> Iterator[None]:
    """transformers' OSError for a model it cannot find or read (a misspelt hub name, no network and nothing in the
    Hugging Face cache, a folder missing its files), as one line naming the model and what to do. Found by probing
    (2026-12-06): `--set model.base=<a name not cached>` on this offline machine ended CPT in a 40-line traceback.
    A full disk stays an OSError (pipeline/errors.py names its free space)."""
    try:
        yield
    except (OSError, ValueError) as exc:
        # A ValueError only from a local folder without a config: what transformers raises for one that is not a
        # model. From a folder with one it is about the model itself (an attention implementation it lacks, say).
        if isinstance(exc, ValueError) and not (Path(ref).is_dir() and not (Path(ref) / "config.json").is_file()):
            raise
        if out_of_space(exc):
            raise
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if Path(ref).is_dir():
            raise UserFixableError(
                f"{ref} is not a complete model folder ({reason}): point model.base (or the stage's base_model) at "
                "one, or rerun the stage that wrote it"
            ) from None
        raise UserFixableError(
            f"model {ref} is neither a local folder nor one the Hugging Face Hub gave ({reason}): check the name, or "
            f"download it where the Hub is reachable (`hf download {ref} --local-dir DIR`) and set model.base to DIR"
        ) from None
