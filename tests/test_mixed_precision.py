"""`model.mixed_precision` and a stage's own: which runs train under bfloat16 autocast, and that the Trainer really does so on a CPU."""

import random
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.config.model import TinyModelConfig
from pipeline.training import models
from pipeline.training.models import bf16_mixed_precision
from pipeline.training.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cpu_only(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize(
    ("choice", "dtype", "expected"),
    [
        # Even where the CPU has bfloat16 instructions (a step 2.35x faster), SFT and RL learnt less so: auto keeps
        # float32 on a CPU.
        ("auto", "auto", False),
        ("none", "auto", False),
        ("bf16", "auto", True),  # asked for: done, emulated where the CPU lacks the instructions
        ("bf16", "float16", False),  # never two half formats at once
        ("auto", "float16", False),
    ],
)
def test_the_choice_on_a_cpu(cpu_only, choice, dtype, expected):
    assert bf16_mixed_precision(choice, dtype) is expected


@pytest.mark.parametrize("native", [True, False])
def test_native_bf16_follows_the_cpus_instructions(cpu_only, monkeypatch, native):
    """`native-bf16`: bf16 where the CPU computes it (AVX512-BF16 or AMX), float32 where torch would emulate it,
    1.28x slower than float32."""
    import torch

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(models, "cpu_has_bf16", lambda: native)
    assert bf16_mixed_precision("native-bf16", "auto") is native
    assert bf16_mixed_precision("native-bf16", "float16") is False


def test_a_stages_own_choice_overrides_the_models(tmp_path):
    config = load_config(
        REPO / "data" / "configs" / "demo.yaml",
        [
            {
                "workspace": {"path": str(tmp_path)},
                "model": {"mixed_precision": "bf16"},
                "rl": {"mixed_precision": "none"},
            }
        ],
    )
    assert models.mixed_precision_choice(config, config.cpt) == "native-bf16"  # the demo's CPT
    assert models.mixed_precision_choice(config, config.sft) == "bf16"  # the model's
    assert models.mixed_precision_choice(config, config.rl) == "none"
    assert models.mixed_precision_choice(config) == "bf16"


def _config(tmp_path, choice: str):
    # Every stage the model's choice (the demo sets CPT's own).
    return load_config(
        REPO / "data" / "configs" / "demo.yaml",
        [
            {
                "workspace": {"path": str(tmp_path)},
                "model": {"mixed_precision": choice},
                "cpt": {"mixed_precision": None},
            }
        ],
    )


@pytest.mark.parametrize("choice", ["bf16", "none"])
def test_cpt_sft_and_rl_pass_the_choice_to_their_trainers(tmp_path, choice):
    from pipeline.rl.training import grpo_arguments
    from pipeline.training.trainer import TrainingJob, _training_arguments

    config = _config(tmp_path, choice)
    for stage in ("cpt", "sft"):
        job = TrainingJob(
            stage=stage,
            progress_label=stage,
            base_ref="tiny",
            train_files=[],
            eval_files=[],
            trainer_dir=tmp_path / stage / "trainer",
            model_dir=tmp_path / stage / "model",
            settings=getattr(config, stage),
        )
        assert _training_arguments(config, job, fresh=True, has_eval=False, accumulation=1).bf16 is (choice == "bf16")
    assert grpo_arguments(config, tmp_path / "rl", [0.9, 0.1]).bf16 is (choice == "bf16")


def _one_step_cpt(tmp_path, choice: str):
    """The tiny model (float32), and CPT's job and Trainer arguments for one step under `choice`, on the CPU."""
    from pipeline.training.trainer import TrainingJob, _training_arguments

    rng = random.Random(0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(" ".join(rng.choice("ls cat grep total file".split()) for _ in range(12)) for _ in range(300))
    )
    folder = build_tiny_model(TinyModelConfig(), [corpus], tmp_path / "tiny")
    config = _config(tmp_path, choice)
    job = TrainingJob(
        stage="cpt",
        progress_label="cpt",
        base_ref=str(folder),
        train_files=[],
        eval_files=[],
        trainer_dir=tmp_path / "trainer",
        model_dir=tmp_path / "model",
        settings=config.cpt.model_copy(update={"max_steps": 1, "warmup_fraction": 0.0}),
    )
    args = _training_arguments(config, job, fresh=True, has_eval=False, accumulation=1)
    args.use_cpu = True  # the device machine has a GPU: this is the CPU path
    return models.load_causal_lm(str(folder), "float32"), job, args


@pytest.mark.parametrize("choice", ["bf16", "none"])
def test_a_trainer_step_on_the_cpu_runs_its_matmuls_in_the_chosen_precision(tmp_path, choice):
    """A real optimizer step of the tiny model through the Trainer with the arguments CPT builds: under bf16 the
    projections compute in bfloat16, the weights stay float32 and move."""
    import torch
    from transformers import Trainer

    model, _, args = _one_step_cpt(tmp_path, choice)
    ids = torch.randint(0, model.config.vocab_size, (32,))
    rows = [{"input_ids": ids, "labels": ids.clone()}] * 4

    seen: list[torch.dtype] = []
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda module, inputs, out: seen.append(out.dtype))
    before = model.model.layers[0].mlp.down_proj.weight.detach().clone()
    Trainer(model=model, args=args, train_dataset=rows).train()

    expected = torch.bfloat16 if choice == "bf16" else torch.float32
    assert seen and set(seen) == {expected}
    weight = model.model.layers[0].mlp.down_proj.weight
    assert weight.dtype == torch.float32
    assert not torch.equal(weight.detach(), before)


def test_held_out_cross_entropy_is_measured_in_float32_when_training_runs_under_bf16(tmp_path):
    """SFT's held-out CE "before" is CPT's "after" (heldout_ce.json), and the demo's CPT trains under bf16 autocast
    while SFT trains in float32: the Trainer's evaluation, after a bf16 step (whose forward accelerate wrapped in
    autocast), computes in the weights' float32."""
    import torch

    from pipeline.training.token_loss import install_token_loss
    from pipeline.training.trainer import (
        _packed_trainer_class,
        _training_arguments,
        observation_cross_entropy,
    )

    model, job, args = _one_step_cpt(tmp_path, "bf16")
    install_token_loss(model, "chunked")
    assert args.bf16
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(4):
        ids = torch.randint(0, model.config.vocab_size, (32,), generator=generator)
        shift = ids.roll(-1)
        shift[-1] = -100
        rows.append({"input_ids": ids, "position_ids": torch.arange(32), "shift_labels": shift, "labels": ids})

    seen: list[torch.dtype] = []
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda module, inputs, out: seen.append(out.dtype))
    trainer = _packed_trainer_class()(
        model=model, args=args, train_dataset=rows, eval_dataset=rows, compute_metrics=observation_cross_entropy
    )
    trainer.train()
    assert set(seen) == {torch.bfloat16}  # the step ran under autocast
    seen.clear()
    measured = trainer.evaluate()["eval_observation_ce"]
    assert set(seen) == {torch.float32}
    # What a float32 Trainer reports for the same model: one measurement, whichever stage takes it.
    float32_args = _training_arguments(_config(tmp_path, "none"), job, fresh=True, has_eval=False, accumulation=1)
    float32_args.use_cpu = True
    assert not float32_args.bf16
    reference = _packed_trainer_class()(
        model=model, args=float32_args, eval_dataset=rows, compute_metrics=observation_cross_entropy
    )
    assert measured == reference.evaluate()["eval_observation_ce"]
    assert set(seen) == {torch.float32}
