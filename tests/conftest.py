"""Shared fixtures: a config whose workspace lives in tmp_path, the public trajectories, and a tiny random
chat model (built offline, once per session)."""

import random
from pathlib import Path

import pytest

from pipeline.config import SimulacraConfig, load_config
from pipeline.store.database import Store

REPO = Path(__file__).resolve().parents[1]
PUBLIC_DATA = REPO.parent / "shared" / "data" / "public"


@pytest.fixture
def public_data() -> Path:
    if not PUBLIC_DATA.is_dir():
        pytest.skip(f"public trajectories not found at {PUBLIC_DATA} (the shared/ folder beside the repo)")
    return PUBLIC_DATA


@pytest.fixture
def config(tmp_path: Path) -> SimulacraConfig:
    return load_config(None, [{"workspace": {"path": str(tmp_path / "workspace")}}])


@pytest.fixture
def store(config: SimulacraConfig):
    with Store(config.workspace.database_path) as opened:
        yield opened


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    """A tiny random Qwen3-shaped model with a ChatML template, its tokenizer trained on shell-like words:
    for tests of decoding and caching, where what the model says does not matter."""
    from pipeline.config.model import TinyModelConfig
    from pipeline.training.tiny_model import build_tiny_model

    rng = random.Random(3)
    words = "ls cat grep notes total root file error json value true false".split()
    corpus = tmp_path_factory.mktemp("corpus") / "text.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(16)) for _ in range(500)), encoding="utf-8")
    return build_tiny_model(TinyModelConfig(), [corpus], tmp_path_factory.mktemp("models") / "tiny-chat")
