"""A training run whose base model's own run measured the same held-out sequences after its last step takes
that number as its "before" instead of measuring it again (SFT starts from the CPT checkpoint and measures
CPT's eval windows: its step-0 cross-entropy is CPT's final one). Other held-out sequences, or a base
model without such a record, are measured at step 0 as before. Real tiny-model training."""

import random
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.config.model import TinyModelConfig
from pipeline.training.sequences import SequenceBuilder, SequenceWriter
from pipeline.training.tiny_model import build_tiny_model
from pipeline.training.trainer import HELDOUT_CE_FILE, TrainingJob, train

REPO = Path(__file__).resolve().parents[1]
WORDS = "ls cat grep notes total root file error json value".split()

pytestmark = pytest.mark.slow


def _sequences(tokenizer, path: Path, seed: int, count: int, max_length: int = 256) -> Path:
    from pipeline.store.schema import ScoredTurn

    rng = random.Random(seed)
    builder = SequenceBuilder(tokenizer, max_length, seed=0)
    with SequenceWriter(path) as writer:
        for index in range(count):
            turns = [
                ScoredTurn(
                    i,
                    " ".join(rng.choice(WORDS) for _ in range(4)),
                    " ".join(rng.choice(WORDS) for _ in range(12)),
                    "retrieval",
                    1.0,
                )
                for i in range(3)
            ]
            windows, _ = builder.trajectory_sequences(f"t{seed}-{index}", "You are a shell.", turns, full_labels=True)
            for window in windows:
                writer.write(window)
    return path


def _job(
    root: Path,
    stage: str,
    base_ref: str,
    train_file: Path,
    eval_file: Path,
    settings,
    eval_max_length: int | None = None,
) -> TrainingJob:
    return TrainingJob(
        stage=stage,
        progress_label=f"{stage} steps",
        base_ref=base_ref,
        train_files=[train_file],
        eval_files=[eval_file],
        trainer_dir=root / stage / "trainer",
        model_dir=root / stage / "model",
        settings=settings,
        eval_max_length=eval_max_length,
    )


def test_a_run_takes_its_before_from_the_base_models_run_when_the_sequences_are_the_same(tmp_path):
    from pipeline.training.models import load_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(random.Random(i).choice(WORDS) for _ in range(16)) for i in range(300)))
    base = build_tiny_model(TinyModelConfig(), [corpus], tmp_path / "base")
    tokenizer = load_tokenizer(str(base))
    train_file = _sequences(tokenizer, tmp_path / "train.parquet", 1, 6)
    held_out = _sequences(tokenizer, tmp_path / "eval.parquet", 2, 3)
    other = _sequences(tokenizer, tmp_path / "other-eval.parquet", 3, 3)
    config = load_config(
        None,
        [
            {
                "workspace": {"path": str(tmp_path / "ws")},
                "model": {"base": str(base)},
                "cpt": {"max_length": 256, "tokens_per_step": 256, "max_steps": 2, "save_steps": 2},
            }
        ],
    )

    first = train(config, _job(tmp_path, "cpt", str(base), train_file, held_out, config.cpt))
    assert (tmp_path / "cpt" / HELDOUT_CE_FILE).is_file() and first.eval_ce_before is not None

    second = train(config, _job(tmp_path, "sft", str(tmp_path / "cpt" / "model"), train_file, held_out, config.cpt))
    assert second.eval_ce_before == first.eval_ce_after
    history = _log_history(tmp_path / "sft" / "trainer")
    assert not any("eval_observation_ce" in entry and entry["step"] == 0 for entry in history)  # not measured again

    third = train(config, _job(tmp_path, "other", str(tmp_path / "cpt" / "model"), train_file, other, config.cpt))
    assert third.eval_ce_before is not None and third.eval_ce_before != first.eval_ce_after
    assert any(
        "eval_observation_ce" in entry and entry["step"] == 0 for entry in _log_history(tmp_path / "other" / "trainer")
    )


def _log_history(trainer_dir: Path) -> list[dict]:
    import json

    [state] = sorted(trainer_dir.glob("checkpoint-*/trainer_state.json"))[-1:]
    return json.loads(state.read_text())["log_history"]


def test_rows_shorter_than_the_held_out_windows_measure_the_same_cross_entropy(tmp_path):
    """SFT may train on rows shorter than CPT's windows (the demo: 512 against 1,024): its held-out windows are
    packed in rows of their own length, so the model's cross-entropy on them is the one a run with long rows
    measures, and training still runs on the short rows."""
    from pipeline.training.models import load_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(random.Random(i).choice(WORDS) for _ in range(16)) for i in range(300)))
    base = build_tiny_model(TinyModelConfig(), [corpus], tmp_path / "base")
    tokenizer = load_tokenizer(str(base))
    long_train = _sequences(tokenizer, tmp_path / "train-256.parquet", 1, 6)
    short_train = _sequences(tokenizer, tmp_path / "train-96.parquet", 1, 6, max_length=96)
    held_out = _sequences(tokenizer, tmp_path / "eval.parquet", 2, 3)
    overrides = {
        "workspace": {"path": str(tmp_path / "ws")},
        "model": {"base": str(base)},
        "cpt": {"max_length": 256, "tokens_per_step": 256, "max_steps": 2, "save_steps": 2},
        "sft": {"max_length": 96, "tokens_per_step": 96, "micro_batch_rows": 1, "max_steps": 2, "save_steps": 2},
    }
    config = load_config(None, [overrides])

    long_rows = train(config, _job(tmp_path, "long", str(base), long_train, held_out, config.cpt))
    short_rows = train(
        config, _job(tmp_path, "short", str(base), short_train, held_out, config.sft, eval_max_length=256)
    )
    assert short_rows.global_step == 2 and short_rows.tokens_per_step == 96
    assert short_rows.eval_ce_before == pytest.approx(long_rows.eval_ce_before, rel=1e-5)
    assert short_rows.eval_ce_after is not None and short_rows.eval_tokens_scored == long_rows.eval_tokens_scored
