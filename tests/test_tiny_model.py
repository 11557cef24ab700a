"""The tiny offline model: a real tokenizer and a real random Qwen3/Llama, saved and reloaded as HF folders."""

import os
import random

import pytest

from pipeline.config.model import TinyModelConfig
from pipeline.training.models import (
    ensure_chatml_tokens,
    load_causal_lm,
    load_tokenizer,
    model_identity,
    training_dtype,
)
from pipeline.training.tiny_model import IM_END, IM_START, PAD, build_tiny_model

WORDS = "ls cat grep total drwxr-xr-x root file not found error permission denied json value true false".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text(
        "\n".join(" ".join(rng.choice(WORDS) for _ in range(20)) + f" {i}" for i in range(2000)), encoding="utf-8"
    )
    return path


@pytest.fixture(scope="module")
def tiny(corpus, tmp_path_factory):
    return build_tiny_model(TinyModelConfig(), [corpus], tmp_path_factory.mktemp("models") / "tiny")


def test_the_folder_loads_back_with_the_same_tokenizer_and_a_qwen3_model(tiny):
    import torch

    tokenizer = load_tokenizer(str(tiny))
    # Not Qwen2Tokenizer (STACK.md): the saved byte-level BPE is what comes back.
    assert "Qwen2" not in type(tokenizer).__name__
    assert len(tokenizer) == 512
    vocab = tokenizer.get_vocab()
    assert all(token in vocab for token in (IM_START, IM_END, PAD))
    assert (tokenizer.eos_token, tokenizer.pad_token) == (IM_END, PAD)
    text = 'naïve 日本 \t\n ls -la\x00 {"ok": true}'
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text

    model = load_causal_lm(str(tiny), "auto")
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.vocab_size) == (64, 2, 512)
    assert model.dtype == torch.float32  # auto on a CPU
    ids = torch.tensor([tokenizer("ls -la", add_special_tokens=False)["input_ids"]])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], 512)
    assert model.generation_config.eos_token_id == vocab[IM_END]


def test_the_chat_template_renders_chatml(tiny):
    tokenizer = load_tokenizer(str(tiny))
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "ls"},
        {"role": "assistant", "content": "a"},
    ]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nls<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"
    )
    assert tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True).endswith(
        "<|im_start|>assistant\n"
    )


def test_a_rebuild_with_the_same_seed_is_identical_and_replaces_the_folder(tiny, corpus):
    before = {name: (tiny / name).read_bytes() for name in ("tokenizer.json", "model.safetensors")}
    build_tiny_model(TinyModelConfig(), [corpus], tiny)
    assert {name: (tiny / name).read_bytes() for name in before} == before
    assert not list(tiny.parent.glob("*.partial-*"))


@pytest.mark.parametrize(
    ("change", "expected_type"),
    [
        ({"architecture": "llama"}, "LlamaForCausalLM"),
        ({"hidden_size": 32, "num_layers": 1, "num_heads": 2}, "Qwen3ForCausalLM"),
    ],
)
def test_config_shapes_the_model(corpus, tmp_path, change, expected_type):
    config = TinyModelConfig(**change)
    model = load_causal_lm(str(build_tiny_model(config, [corpus], tmp_path / "m")))
    assert type(model).__name__ == expected_type
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (config.hidden_size, config.num_layers)


@pytest.mark.parametrize(
    ("setup", "error", "message"),
    [
        ("foreign_folder", FileExistsError, "not a tiny model folder"),
        ("missing_text", FileNotFoundError, "text file"),
        ("bad_heads", ValueError, "divisible"),
    ],
)
def test_build_errors(corpus, tmp_path, setup, error, message):
    out, files, config = tmp_path / "m", [corpus], TinyModelConfig()
    if setup == "foreign_folder":
        out.mkdir()
        (out / "precious.txt").write_text("keep me")
    elif setup == "missing_text":
        files = [tmp_path / "absent.txt"]
    else:
        config = TinyModelConfig(hidden_size=64, num_heads=5)
    with pytest.raises(error, match=message):
        build_tiny_model(config, files, out)
    if setup == "foreign_folder":
        assert (out / "precious.txt").read_text() == "keep me"


def test_a_tokenizer_without_chatml_tokens_gets_them(corpus):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel()
    raw.train([str(corpus)], trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"], show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>")
    assert ensure_chatml_tokens(tokenizer) == [IM_START, IM_END]
    ids = tokenizer("<|im_start|>user<|im_end|>", add_special_tokens=False)["input_ids"]
    assert (ids[0], ids[-1]) == tuple(tokenizer.convert_tokens_to_ids([IM_START, IM_END]))
    assert ensure_chatml_tokens(tokenizer) == []


def test_model_identity_follows_the_folder_contents(tiny, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy)
    assert model_identity(str(copy)) == model_identity(str(copy))
    before = model_identity(str(copy))
    (copy / "config.json").write_text(
        (copy / "config.json").read_text().replace('"hidden_size": 64', '"hidden_size": 65')
    )
    assert model_identity(str(copy)) != before


def test_training_dtype():
    import torch

    assert training_dtype("float32") == torch.float32
    assert training_dtype("bfloat16") == torch.bfloat16
    bf16_gpu = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    assert training_dtype("auto") == (torch.bfloat16 if bf16_gpu else torch.float32)


def test_two_builds_from_the_same_text_at_different_paths_have_one_identity(corpus, tmp_path):
    """Issue 20.13: the corpus is often a temporary file; its path must not reach the model's identity."""
    import json
    import shutil

    elsewhere = tmp_path / "tmp-4f2a9c" / "corpus.txt"
    elsewhere.parent.mkdir()
    shutil.copy(corpus, elsewhere)
    config = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2)
    first = build_tiny_model(config, [corpus], tmp_path / "a" / "tiny")
    second = build_tiny_model(config, [elsewhere], tmp_path / "b" / "tiny")
    assert (first / "tiny_model.json").read_text() == (second / "tiny_model.json").read_text()
    assert str(corpus) not in (first / "tiny_model.json").read_text()
    assert json.loads((first / "tiny_model.json").read_text())["text_bytes"] == corpus.stat().st_size
    assert model_identity(str(first)) == model_identity(str(second))


def test_a_checkpoint_is_identified_by_its_content_and_its_run_never_its_path(tiny, tmp_path):
    """Issue 20.14: a moved workspace keeps its fingerprints; two runs' checkpoints still differ."""
    import json
    import shutil

    from pipeline.llm.cache import model_key

    def checkpoint(workspace, fingerprint):
        run = workspace / "runs" / "cpt" / fingerprint
        shutil.copytree(tiny, run / "model")
        (run / "fingerprint.json").write_text(json.dumps({"fingerprint": fingerprint, "inputs": {}}))
        return str(run / "model")

    original = checkpoint(tmp_path / "ws", "cpt-1")
    moved = checkpoint(tmp_path / "moved" / "ws", "cpt-1")
    retrained = checkpoint(tmp_path / "ws", "cpt-2")
    assert model_identity(original) == model_identity(moved) != model_identity(retrained)
    assert (
        model_key("transformers", original) == model_key("transformers", moved) != model_key("transformers", retrained)
    )
    assert model_key("openai", "served-name") == "served-name"


def test_a_build_killed_mid_save_leaves_no_folder_behind_for_good(corpus, tmp_path):
    """Issue 20.15: `<name>.partial-<pid>` of a dead build is removed by the next build; a live one's is kept."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = tmp_path / f"tiny.partial-{int(dead.stdout)}"
    (abandoned / "half-written").mkdir(parents=True)
    running = tmp_path / f"tiny.partial-{os.getppid()}"
    running.mkdir()
    build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2), [corpus], tmp_path / "tiny")
    assert not abandoned.exists() and running.exists()


def test_init_model_trains_its_tokenizer_on_the_visible_files_of_a_folder(corpus, tmp_path):
    """`simulacra init-model FOLDER` read every file under it, a repository's `.git/` objects among them."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    text = tmp_path / "text"
    (text / ".git" / "objects").mkdir(parents=True)
    (text / "shell.txt").write_text(corpus.read_text(encoding="utf-8"), encoding="utf-8")
    (text / ".git" / "objects" / "pack").write_bytes(bytes(range(256)) * 64)
    (text / ".notes.txt").write_text("a hidden scratch file")
    result = CliRunner().invoke(
        app, ["--set", f"workspace.path={tmp_path / 'ws'}", "init-model", str(text), "--out", str(tmp_path / "tiny")]
    )
    assert result.exit_code == 0, result.output
    assert f"tiny model written to {tmp_path / 'tiny'} (tokenizer trained on 1 files)" in result.output


def test_init_model_passes_over_files_that_are_not_text_and_names_a_missing_one(corpus, tmp_path):
    """A folder of notes beside an image and an archive: their bytes were read as text (U+FFFD and control
    characters) into the tokenizer's training text."""
    import gzip

    from typer.testing import CliRunner

    from pipeline.cli import app

    text = tmp_path / "text"
    text.mkdir()
    (text / "shell.txt").write_text(corpus.read_text(encoding="utf-8"), encoding="utf-8")
    (text / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 8)
    (text / "old.txt.gz").write_bytes(gzip.compress(b"ls -la\n" * 50))
    settings = ["--set", f"workspace.path={tmp_path / 'ws'}"]
    result = CliRunner().invoke(app, [*settings, "init-model", str(text), "--out", str(tmp_path / "tiny")])
    assert result.exit_code == 0, result.output
    assert "(tokenizer trained on 1 files) (2 files not UTF-8 text passed over, e.g." in result.output

    only_binary = CliRunner().invoke(app, [*settings, "init-model", str(text / "logo.png")])
    assert only_binary.exit_code == 2
    assert (
        f"init-model: no text files under {text / 'logo.png'} (1 files not UTF-8 text passed over" in only_binary.output
    )
    missing = CliRunner().invoke(app, [*settings, "init-model", str(tmp_path / "nope")])
    assert missing.exit_code == 2
    assert f"init-model: no such file or folder: {tmp_path / 'nope'}" in missing.output
