"""The model a decoding or training benchmark runs: `--model`, as `model.base` takes it (the packaged
SmolLM2's short name, a GGUF file, or a Hugging Face folder), resolved to a folder transformers loads."""

import argparse
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model.base: a packaged name, GGUF file or HF folder")


def model_folder(model: str, scratch: Path) -> str:
    """`model` itself when it is a folder; otherwise converted once into a workspace under `scratch`, as the
    pipeline converts `model.base` (pipeline/training/models.py `ensure_base_model`)."""
    if Path(model).is_dir():
        return model
    from pipeline.config import load_config
    from pipeline.training.models import ensure_base_model

    config = load_config(None, [{"workspace": {"path": str(scratch / "workspace")}, "model": {"base": model}}])
    return ensure_base_model(config)
