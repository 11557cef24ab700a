"""How a training stage's summary names the model it started from (pipeline/training/runs.py `model_words`):
SFT and RL start from the newest registered checkpoint of the stage before, so the summary says which."""

from pipeline.training.runs import model_words


def test_a_stage_checkpoint_is_named_by_its_stage_and_run(tmp_path):
    model = tmp_path / "workspace" / "runs" / "cpt" / "726c0c7f7749cda5" / "model"
    assert model_words(str(model)) == "cpt run 726c0c7f"
    assert model_words(str(tmp_path / "ws" / "runs" / "sft" / "547d633a0a60615e" / "model")) == "sft run 547d633a"


def test_a_local_folder_is_named_by_its_name_and_a_hub_id_as_given(tmp_path):
    folder = tmp_path / "models" / "SmolLM2-135M-Instruct"
    folder.mkdir(parents=True)
    assert model_words(str(folder)) == "SmolLM2-135M-Instruct"
    assert model_words("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    # A folder called `model` outside a runs tree is a local folder like any other.
    other = tmp_path / "exports" / "model"
    other.mkdir(parents=True)
    assert model_words(str(other)) == "model"
