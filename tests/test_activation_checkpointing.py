"""Activation checkpointing reaches the Trainer under the name its transformers knows: 5.24's
`activation_checkpointing`, or `gradient_checkpointing` before (the GPU image's 5.17), for CPT/SFT and RL alike."""

import dataclasses
import warnings
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.training.activation_checkpointing import activation_checkpointing_arguments

REPO = Path(__file__).resolve().parents[1]


def without_activation_checkpointing(arguments_class):
    """`arguments_class` as transformers before 5.24 shaped it: the same fields, less the `activation_checkpointing*`
    ones (a plain dataclass of them: nothing else of the class is needed to build it)."""
    kept = [
        (f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory))
        for f in dataclasses.fields(arguments_class)
        if f.init and not f.name.startswith("activation_checkpointing")
    ]
    return dataclasses.make_dataclass(f"{arguments_class.__name__}Before524", kept)


@dataclasses.dataclass
class OldTrainingArguments:
    gradient_checkpointing: bool = False
    gradient_checkpointing_kwargs: dict | None = None


@dataclasses.dataclass
class NewTrainingArguments(OldTrainingArguments):
    activation_checkpointing: bool | None = None
    activation_checkpointing_kwargs: dict | None = None


@pytest.mark.parametrize(
    "arguments_class, enabled, expected",
    [
        (
            NewTrainingArguments,
            True,
            {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": False}},
        ),
        (NewTrainingArguments, False, {"activation_checkpointing": False}),
        (
            OldTrainingArguments,
            True,
            {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}},
        ),
        (OldTrainingArguments, False, {"gradient_checkpointing": False}),
    ],
)
def test_the_switch_takes_the_name_the_arguments_class_has(arguments_class, enabled, expected):
    assert activation_checkpointing_arguments(arguments_class, enabled) == expected
    arguments_class(**expected)  # accepted as such


def test_the_installed_transformers_gets_the_new_name_without_a_deprecation_warning(tmp_path):
    from transformers import TrainingArguments

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = TrainingArguments(
            output_dir=str(tmp_path),
            use_cpu=True,
            report_to="none",
            **activation_checkpointing_arguments(TrainingArguments, True),
        )
    assert args.activation_checkpointing is True
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False}


@pytest.mark.parametrize("enabled", [True, False])
def test_rl_builds_its_grpo_config_on_a_transformers_without_activation_checkpointing(monkeypatch, tmp_path, enabled):
    import trl

    from pipeline.rl.training import grpo_arguments

    before_524 = without_activation_checkpointing(trl.GRPOConfig)
    monkeypatch.setattr(trl, "GRPOConfig", before_524)
    config = load_config(
        REPO / "data" / "configs" / "demo.yaml",
        [{"workspace": {"path": str(tmp_path)}, "rl": {"gpu": {"gradient_checkpointing": enabled}}}],
    )
    args = grpo_arguments(config, tmp_path / "trainer", [0.9, 0.1])
    assert isinstance(args, before_524)
    assert args.gradient_checkpointing is enabled
    assert args.gradient_checkpointing_kwargs == ({"use_reentrant": False} if enabled else None)
    assert args.importance_sampling_level == "sequence"  # the rest of the GSPO settings went through


def test_rl_turns_activation_checkpointing_on_through_the_installed_grpo_config(tmp_path):
    from pipeline.rl.training import grpo_arguments

    config = load_config(
        REPO / "data" / "configs" / "demo.yaml",
        [{"workspace": {"path": str(tmp_path)}, "rl": {"gpu": {"gradient_checkpointing": True}}}],
    )
    args = grpo_arguments(config, tmp_path / "trainer", [0.9, 0.1])
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True


@pytest.mark.parametrize("enabled", [True, False])
def test_cpt_and_sft_build_their_training_arguments_on_a_transformers_without_activation_checkpointing(
    monkeypatch, tmp_path, enabled
):
    import transformers

    from pipeline.training.trainer import TrainingJob, _training_arguments

    before_524 = without_activation_checkpointing(transformers.TrainingArguments)
    monkeypatch.setattr(transformers, "TrainingArguments", before_524)
    config = load_config(
        REPO / "data" / "configs" / "demo.yaml",
        [{"workspace": {"path": str(tmp_path)}, "cpt": {"gradient_checkpointing": enabled}}],
    )
    job = TrainingJob(
        stage="cpt",
        progress_label="cpt",
        base_ref="tiny",
        train_files=[],
        eval_files=[],
        trainer_dir=tmp_path / "trainer",
        model_dir=tmp_path / "model",
        settings=config.cpt,
    )
    args = _training_arguments(config, job, fresh=True, has_eval=False, accumulation=1)
    assert isinstance(args, before_524)
    assert args.gradient_checkpointing is enabled
    assert args.gradient_checkpointing_kwargs == ({"use_reentrant": False} if enabled else None)
