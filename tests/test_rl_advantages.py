"""What 9:1 means per group (issue 17, item 6), checked on TRL's own advantage code.

A GRPOTrainer built with the stage's settings (pipeline/rl/training.py `grpo_arguments`) and the tiny
model scores one generation batch through `_generate_and_score_completions`, with scripted rewards:
the advantages it returns are the ones the loss uses. Every group's rule reward is [25, 0, 0, 0]; the
main reward ties in one group and varies in the others.
"""

import pytest

from pipeline.config import SimulacraConfig
from pipeline.config.model import TinyModelConfig
from pipeline.rl.training import grpo_arguments
from pipeline.training.tiny_model import random_model, train_tokenizer

GROUP = 4
# prompt -> (main rewards, rule rewards) of its group, in completion order
SCRIPT = {
    0: ([12.0, 12.0, 12.0, 12.0], [25.0, 0.0, 0.0, 0.0]),  # the main reward ties
    1: ([25.0, 5.0, 5.0, 5.0], [25.0, 0.0, 0.0, 0.0]),  # both agree
    2: ([5.0, 25.0, 5.0, 5.0], [25.0, 0.0, 0.0, 0.0]),  # they disagree
    3: ([25.0, 5.0, 5.0, 5.0], [None] * GROUP),  # no verifier
}


def scripted(part: int):
    def reward(prompts, completions, prompt_index, **_):
        return [SCRIPT[index][part][position % GROUP] for position, index in enumerate(prompt_index)]

    reward.__name__ = ("main", "rule")[part]
    return reward


def advantages(tmp_path, aggregation: str | None = None) -> dict[int, list[float]]:
    """Per prompt, its group's advantages; `aggregation` None keeps the stage's default."""
    from trl import GRPOTrainer

    config = SimulacraConfig.model_validate(
        {
            "rl": {
                "num_generations": GROUP,
                "per_device_batch_size": GROUP * len(SCRIPT),
                "gradient_accumulation_steps": 1,
                "steps_per_generation": 1,
                "max_completion_length": 8,
                "reward": {"aggregation": aggregation} if aggregation else {},
            }
        }
    )
    tiny = TinyModelConfig(vocab_size=300)
    tokenizer = train_tokenizer(tiny, ["ls wc cat the file is empty and has 42 lines"] * 50)
    model = random_model(tiny, tokenizer)
    args = grpo_arguments(config, tmp_path, [config.rl.reward.main_weight, config.rl.reward.rule_weight])
    rows = [{"prompt": [{"role": "user", "content": f"ls {index}"}], "prompt_index": index} for index in SCRIPT]
    from datasets import Dataset

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[scripted(0), scripted(1)],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    batch = [row for row in rows for _ in range(GROUP)]
    values = trainer._generate_and_score_completions(batch)["advantages"].tolist()
    return {index: values[GROUP * n : GROUP * (n + 1)] for n, index in enumerate(SCRIPT)}


def test_the_rule_keeps_its_tenth_when_the_main_reward_ties(tmp_path):
    by_group = advantages(tmp_path)
    tied, agree, disagree, unverified = (by_group[i] for i in SCRIPT)
    # Each reward standardised in its group, then weighted 9:1: a tie contributes no contrast, and the
    # rule's contrast keeps its weight, a tenth of a group where both rewards agree.
    assert tied == pytest.approx([a * 0.1 for a in agree], rel=1e-3)
    assert unverified == pytest.approx([a * 0.9 for a in agree], rel=1e-3)
    # Where they disagree, 0.9 x [-0.5, 1.5, -0.5, -0.5] + 0.1 x [1.5, -0.5, -0.5, -0.5]: the main reward's
    # favourite leads, the rule's comes second (one batch-wide scale, TRL's, over every group).
    scale = agree[0] / 1.5
    assert disagree == pytest.approx([-0.3 * scale, 1.3 * scale, -0.5 * scale, -0.5 * scale], rel=1e-3)


def test_summing_first_gives_a_tied_group_the_rule_at_full_scale(tmp_path):
    """Why the stage's default is not TRL's: weighted then normalised per group, a tie leaves the rule alone, and
    the group's std scales its 0.1 x 25 back to the whole advantage ([1.5, -0.5, -0.5, -0.5])."""
    by_group = advantages(tmp_path, "sum_then_normalize")
    assert by_group[0] == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-3)
    assert by_group[0] == pytest.approx(by_group[1], rel=1e-3)
