"""Writing the exported world-model folder, and copying it to an fsspec URL.

The folder is a plain Hugging Face model folder any server loads (`vllm serve DIR`,
`AutoModelForCausalLM.from_pretrained(DIR)`):
- the weights as safetensors (copied byte for byte when the checkpoint has them, else loaded and
  saved as safetensors) and `config.json`;
- the tokenizer, its chat template replaced by the world model's (pipeline/serving/chat_template.py);
- `generation_config.json` whose end-of-sequence ids include `<|im_end|>`, where every observation
  ends in training, so a server stops there without being told;
- `simulacra.json`: the prompt format, the answer formats the model was trained in (`answer_formats`,
  thinking and/or direct) and the one a request gets by default (`thinking`, `default_answer_format`),
  the context length and history budget
  it was trained at, and its lineage by checkpoint id (never a path of the exporting machine), which
  `simulacra serve` and the environment classes read;
- `README.md`, the model card (pipeline/serving/model_card.py).
It is built in a sibling folder and renamed into place, so a killed export leaves no half folder.
"""

import json
import shutil
from pathlib import Path
from typing import Any

from pipeline.errors import UserFixableError, out_of_space
from pipeline.prompts.answer_format import EXPORT_RECORD
from pipeline.serving.chat_template import chat_template
from pipeline.serving.prompt_formats import ANSWER_FORMAT_NAMES, PromptFormat
from pipeline.training.tiny_model import IM_END

METADATA_FILE = EXPORT_RECORD
WEIGHT_PATTERNS = ("*.safetensors", "model.safetensors.index.json")


def _write_weights(source: Path, target: Path) -> None:
    weights = [path for pattern in WEIGHT_PATTERNS for path in source.glob(pattern)]
    if any(path.suffix == ".safetensors" for path in weights):
        for path in [*weights, source / "config.json"]:
            shutil.copy2(path, target / path.name)
        return
    # A folder with PyTorch .bin weights (a model from elsewhere): safetensors, as the issue asks.
    from pipeline.training.models import load_causal_lm

    load_causal_lm(str(source), dtype="float32").save_pretrained(target)


def _write_generation_config(source: Path, target: Path, tokenizer) -> list[int]:
    from transformers import GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(source)
    except OSError:  # no generation_config.json in the checkpoint
        generation = GenerationConfig()
    eos = generation.eos_token_id
    stops = [eos] if isinstance(eos, int) else list(eos or [])
    for token in (tokenizer.convert_tokens_to_ids(IM_END), tokenizer.eos_token_id):
        if token is not None and token not in stops:
            stops.append(token)
    generation.eos_token_id = stops
    generation.pad_token_id = tokenizer.pad_token_id
    generation.save_pretrained(target)
    return stops


def write_export(source: Path, out_dir: Path, fmt: PromptFormat, metadata: dict[str, Any], card: str) -> Path:
    """Build the exported folder for the model at `source` at `out_dir` (replacing a previous one).
    `metadata` holds at least model_name and context_length (pipeline/serving/provenance.py)."""
    from pipeline.training.models import load_tokenizer

    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    _write_weights(source, partial)
    tokenizer = load_tokenizer(str(source))
    tokenizer.chat_template = chat_template(fmt)
    tokenizer.model_max_length = metadata["context_length"]  # the trained length, which servers read as the limit
    tokenizer.save_pretrained(partial)
    stops = _write_generation_config(source, partial, tokenizer)
    recorded = {
        **metadata,
        "prompt_format": fmt.name,
        "thinking": fmt.thinking,
        "answer_formats": list(fmt.answer_formats),
        "default_answer_format": ANSWER_FORMAT_NAMES[fmt.thinking],
        "stop_token_ids": stops,
    }
    (partial / METADATA_FILE).write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    (partial / "README.md").write_text(card, encoding="utf-8")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    partial.rename(out_dir)
    return out_dir


# What a server reads from `simulacra.json` (pipeline/serving/world_model.py, vllm_engine.py): an export writes them all.
SERVED_FIELDS = ("model_name", "prompt_format", "context_length", "stop_token_ids")


def read_metadata(model_dir: Path) -> dict[str, Any]:
    """`simulacra.json` of an exported folder. A folder without one is not an export; one whose record is not JSON,
    lacks a field a server reads, or whose weights are gone is an export damaged or copied in part: either is one
    line naming the fix, not a traceback from deep in the server."""
    path = Path(model_dir) / METADATA_FILE
    if not path.is_file():
        raise UserFixableError(
            f"{model_dir} is not an exported world model (no {METADATA_FILE}): "
            "run `simulacra export` and pass the folder it prints"
        )
    again = "export it again (`simulacra export`) or copy the whole folder"
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserFixableError(f"{path} is not JSON ({exc}): {again}") from None
    missing = [name for name in SERVED_FIELDS if not isinstance(metadata, dict) or name not in metadata]
    if missing:
        raise UserFixableError(f"{path} lacks {', '.join(missing)}: {again}")
    if not any(Path(model_dir).glob("*.safetensors")):
        raise UserFixableError(f"{model_dir} holds no weights (no *.safetensors file): {again}")
    return metadata


def destination_filesystem(destination: str):
    """The fsspec filesystem and path of a URL; checked before the export is written, so an unknown
    scheme, a missing package (s3fs, gcsfs) or a local path that is a file stops the stage before any work."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    try:
        filesystem, root = fsspec.core.url_to_fs(destination)
    except (ImportError, ValueError) as exc:
        raise ValueError(f"export.destination: {destination}: {exc}") from None
    if isinstance(filesystem, LocalFileSystem) and filesystem.isfile(root):
        raise ValueError(f"export.destination: {destination} is a file: name a folder (it is created where missing)")
    return filesystem, root


def copy_to(out_dir: Path, destination: str) -> str:
    """Copy the exported folder to an fsspec URL (s3://, gs://, file://, memory://, a local path);
    returns the URL written. Files are put one by one under the destination, which is replaced
    file for file, so a rerun after a failed upload completes it. A destination that refuses a file
    is one line naming it and the file (a full disk stays an OSError: pipeline/errors.py names its free space)."""
    filesystem, root = destination_filesystem(destination)
    root = root.rstrip("/")
    relative = "."
    try:
        filesystem.makedirs(root, exist_ok=True)
        for path in sorted(out_dir.rglob("*")):
            if path.is_file():
                relative = path.relative_to(out_dir).as_posix()
                parent = f"{root}/{relative}".rsplit("/", 1)[0]
                filesystem.makedirs(parent, exist_ok=True)
                filesystem.put_file(str(path), f"{root}/{relative}")
    except OSError as exc:
        if out_of_space(exc):
            raise
        raise ValueError(
            f"export.destination: {destination}: writing {relative} failed ({exc.strerror or exc}); "
            f"the export itself is complete in {out_dir}: fix the destination and rerun"
        ) from exc
    return destination
