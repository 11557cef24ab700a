"""Which checkpoints a training stage resumes from, and what it sets aside (issue 8.1).

The folders are made of real files in the formats the Trainer writes (safetensors, torch.save zips,
JSON), whole or cut short the way a killed write leaves them. The kill itself, during a real save,
is tested in tests/test_cpt_stage.py.
"""

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pipeline.store.atomic_files import publish_folder, write_text_atomic
from pipeline.training.checkpoints import AtomicCheckpoints, missing_parts, newest_complete_checkpoint

EVERY_PART = ["weights", "optimizer", "scheduler", "rng state", "trainer state"]


def cut_short(path: Path) -> None:
    """What a kill during the write leaves: the file's first half."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def write_checkpoint(folder: Path, step: int, layout: str = "plain") -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "generation_config.json").write_text("{}")
    weights = {"embed": torch.randn(32, 8), "head": torch.randn(8, 32)}
    if layout == "sharded":
        save_file({"embed": weights["embed"]}, folder / "model-00001-of-00002.safetensors")
        save_file({"head": weights["head"]}, folder / "model-00002-of-00002.safetensors")
        weight_map = {"embed": "model-00001-of-00002.safetensors", "head": "model-00002-of-00002.safetensors"}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    elif layout == "deepspeed":
        (folder / f"global_step{step}").mkdir()
        torch.save({"module": weights}, folder / f"global_step{step}" / "mp_rank_00_model_states.pt")
        torch.save({"state": {}}, folder / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    else:
        save_file(weights, folder / "model.safetensors")
    if layout != "deepspeed":
        torch.save({"state": {0: {"exp_avg": torch.randn(64)}}}, folder / "optimizer.pt")
        torch.save({"last_epoch": step}, folder / "scheduler.pt")
    ranks = ["rng_state_0.pth", "rng_state_1.pth"] if layout == "two processes" else ["rng_state.pth"]
    for name in ranks:
        torch.save({"python": step, "cpu": torch.random.get_rng_state()}, folder / name)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return folder


def only_config_files(folder: Path) -> None:
    """The folder issue 8 found after a kill: the model's config files and nothing else."""
    for path in folder.iterdir():
        if path.is_file() and path.name not in ("config.json", "generation_config.json"):
            path.unlink()


CASES = [
    # (layout, damage done after the write, parts reported missing)
    ("plain", None, []),
    ("sharded", None, []),
    ("two processes", None, []),
    ("deepspeed", None, []),  # DeepSpeed keeps the scheduler in its own files
    ("plain", only_config_files, EVERY_PART),
    ("plain", lambda f: cut_short(f / "optimizer.pt"), ["optimizer"]),
    ("plain", lambda f: cut_short(f / "model.safetensors"), ["weights"]),
    ("plain", lambda f: (f / "scheduler.pt").unlink(), ["scheduler"]),
    ("plain", lambda f: (f / "rng_state.pth").unlink(), ["rng state"]),
    ("plain", lambda f: cut_short(f / "trainer_state.json"), ["trainer state"]),
    ("sharded", lambda f: (f / "model-00002-of-00002.safetensors").unlink(), ["weights"]),
    ("two processes", lambda f: cut_short(f / "rng_state_1.pth"), ["rng state"]),
]


@pytest.mark.parametrize(("layout", "damage", "missing"), CASES)
def test_a_checkpoint_is_complete_when_every_part_the_trainer_resumes_from_is_whole(tmp_path, layout, damage, missing):
    folder = write_checkpoint(tmp_path / "checkpoint-8", 8, layout)
    if damage:
        damage(folder)
    assert missing_parts(folder) == missing


def test_resumption_takes_the_newest_complete_checkpoint_and_sets_the_rest_aside(tmp_path, caplog):
    trainer_dir = tmp_path / "trainer"
    write_checkpoint(trainer_dir / "checkpoint-8", 8)
    write_checkpoint(trainer_dir / "checkpoint-16", 16)
    only_config_files(write_checkpoint(trainer_dir / "checkpoint-20", 20))  # issue 8's folder
    write_checkpoint(trainer_dir / "staging" / "checkpoint-24", 24)  # a write cut before its rename
    cut_short(trainer_dir / "staging" / "checkpoint-24" / "trainer_state.json")

    with caplog.at_level(logging.WARNING):
        assert newest_complete_checkpoint(trainer_dir) == trainer_dir / "checkpoint-16"

    assert sorted(p.name for p in trainer_dir.iterdir()) == ["checkpoint-16", "checkpoint-8", "incomplete", "staging"]
    kept = sorted((trainer_dir / "incomplete").iterdir())
    assert [p.name.rsplit("-", 1)[0] for p in kept] == ["checkpoint-20", "checkpoint-24"]
    assert (kept[0] / "config.json").is_file()  # set aside whole, not deleted
    warnings = [record.getMessage() for record in caplog.records]
    assert any(str(trainer_dir / "checkpoint-20") in w and "weights" in w and str(kept[0]) in w for w in warnings)
    assert any(str(trainer_dir / "staging" / "checkpoint-24") in w for w in warnings)
    # Checked again: nothing more to set aside, the same checkpoint.
    assert newest_complete_checkpoint(trainer_dir) == trainer_dir / "checkpoint-16"


def test_killed_twice_at_the_same_step_keeps_both_cut_folders(tmp_path):
    trainer_dir = tmp_path / "trainer"
    for _ in range(2):
        only_config_files(write_checkpoint(trainer_dir / "checkpoint-20", 20))
        assert newest_complete_checkpoint(trainer_dir) is None
    assert len(list((trainer_dir / "incomplete").iterdir())) == 2


def test_no_trainer_folder_means_a_fresh_start(tmp_path):
    assert newest_complete_checkpoint(tmp_path / "trainer") is None


def test_a_file_written_atomically_replaces_the_old_one_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "metrics.json"
    write_text_atomic(path, "old")
    write_text_atomic(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_a_published_folder_replaces_the_old_one_whole(tmp_path):
    final, staged = tmp_path / "model", tmp_path / "model.partial"
    final.mkdir()
    (final / "stale.bin").write_text("old save")
    staged.mkdir()
    (staged / "model.safetensors").write_text("new save")
    publish_folder(staged, final)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in final.iterdir()] == ["model.safetensors"]


def test_a_trainer_with_the_mixin_publishes_checkpoints_and_tracks_the_best_one_under_its_published_name(tmp_path):
    """A real Trainer on a small random Qwen3, evaluating and keeping its best checkpoint: the
    Trainer records it while the save is still under staging/, the mixin points it at the final name."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Trainer, TrainingArguments

    class StageTrainer(AtomicCheckpoints, Trainer):
        pass

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
        )
    )
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (16, 12)).tolist()]
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        max_steps=6,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        save_strategy="steps",
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        save_total_limit=1,
        metric_for_best_model="loss",
        load_best_model_at_end=True,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = StageTrainer(model=model, args=args, train_dataset=rows, eval_dataset=rows[:4])
    trainer.train()

    trainer_dir = tmp_path / "trainer"
    best = Path(trainer.state.best_model_checkpoint)
    assert best.parent == trainer_dir and missing_parts(best) == []
    kept = sorted(trainer_dir.glob("checkpoint-*"))
    assert best in kept and trainer_dir / "checkpoint-6" in kept and len(kept) <= 2  # rotation kept best and last
    recorded = json.loads((trainer_dir / "checkpoint-6" / "trainer_state.json").read_text())["best_model_checkpoint"]
    assert Path(recorded).parent == trainer_dir
    assert list((trainer_dir / "staging").iterdir()) == []
