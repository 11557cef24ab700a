"""A tiny causal LM built offline: for tests and the demo, where no model hub can be reached.

STACK.md's recipe: a byte-level BPE tokenizer trained with `tokenizers` on local text (vocab ~512,
specials `<|im_start|>`, `<|im_end|>`, `<|pad|>`), wrapped in `PreTrainedTokenizerFast` with a ChatML
chat template, and a randomly initialised Qwen3 (or Llama) model from a small config. A Qwen2
config is avoided on purpose: `AutoTokenizer` would load `Qwen2Tokenizer` for it, which swaps in
Qwen's pre-tokenizer and silently changes token ids.
"""

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pipeline.config.model import TinyModelConfig
from pipeline.store.atomic_files import publish_folder

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (IM_START, IM_END, PAD)

# Written into the model folder: it marks a folder this module may overwrite on a rebuild.
MARKER = "tiny_model.json"

# ChatML, as Qwen renders it. Assistant turns carry `{% generation %}` markers so TRL's
# `assistant_only_loss=True` can find them (STACK.md); they do not change the rendered text.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{%- else -%}"
    "{{ message['content'] + '<|im_end|>' }}"
    "{%- endif -%}"
    "{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def _lines(text_files: Sequence[Path]) -> Iterator[str]:
    for path in text_files:
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            yield from handle


def train_tokenizer(config: TinyModelConfig, lines: Iterable[str]):
    """Byte-level BPE on `lines`; every byte is in the alphabet, so any text encodes losslessly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=config.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )


def random_model(config: TinyModelConfig, tokenizer):
    """A randomly initialised decoder sized by `config`, its vocabulary matching `tokenizer`."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    if config.hidden_size % config.num_heads:
        raise ValueError(
            f"model.tiny.hidden_size ({config.hidden_size}) must be divisible by model.tiny.num_heads ({config.num_heads})"
        )
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        head_dim=config.hidden_size // config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model_config = Qwen3Config(**shape) if config.architecture == "qwen3" else LlamaConfig(**shape)
    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


@contextmanager
def _quiet_transformers():
    """No shard-writing progress bar for a one-shard model: the command reports the result."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _remove_abandoned_builds(out_dir: Path) -> None:
    """Delete `<name>.partial-<pid>` folders of builds whose process is gone (killed mid-save), which
    nothing else would ever remove; a build still running elsewhere keeps its folder."""
    for partial in out_dir.parent.glob(f"{out_dir.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def build_tiny_model(config: TinyModelConfig, text_files: Sequence[Path], out_dir: Path) -> Path:
    """Train the tokenizer on `text_files`, create the model, save both as one HF folder at `out_dir`.

    The folder appears whole or not at all (built aside, then renamed). An existing folder is
    replaced only if it is a tiny model this function built; anything else there is an error.
    """
    out_dir = Path(out_dir)
    files = [Path(p) for p in text_files]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"tiny model: text file(s) not found: {', '.join(missing)}")
    if not files:
        raise ValueError("tiny model: at least one text file is needed to train the tokenizer")
    if out_dir.exists() and not (out_dir / MARKER).is_file():
        raise FileExistsError(f"{out_dir} exists and is not a tiny model folder; refusing to overwrite it")

    tokenizer = train_tokenizer(config, _lines(files))
    model = random_model(config, tokenizer)

    _remove_abandoned_builds(out_dir)
    partial = out_dir.with_name(f"{out_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with _quiet_transformers():
        model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    # What the model was built from, by content: the model's identity (pipeline/training/models.py)
    # hashes this file, and a corpus written to a temporary path must not make two builds differ.
    text = hashlib.sha256()
    for path in files:
        text.update(path.read_bytes())
    marker = {
        "config": config.model_dump(mode="json"),
        "text_sha256": text.hexdigest(),
        "text_bytes": sum(p.stat().st_size for p in files),
        "vocab_size": len(tokenizer),
    }
    (partial / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    publish_folder(partial, out_dir)
    return out_dir
