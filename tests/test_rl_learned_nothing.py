"""A GSPO run that moved no weight is reported as such (issue 16.4): the reason names what happened."""

import pytest

from pipeline.rl.training import GSPOOutcome, learned_nothing_reason, parameter_signature


def outcome(history, changed=None, measured=0):
    return GSPOOutcome(len(history), 1, None, history, True, changed, measured)


@pytest.mark.parametrize(
    "history, changed, expected",
    [
        # Every step's gradient 0 and every group tied: the demo RL.
        (
            [{"grad_norm": 0.0, "frac_reward_zero_std": 1.0}] * 3,
            None,
            "every one of 3 GSPO steps had gradient norm 0: every group",
        ),
        # Weights measured against the start and none moved, whatever was logged.
        ([{"grad_norm": 0.5}] * 2, 0, "no weight changed in 2 GSPO steps (of 10 parameters)"),
        # One step moved: learning happened.
        ([{"grad_norm": 0.0}, {"grad_norm": 0.2}], None, None),
        ([{"grad_norm": 0.0}] * 2, 3, "every one of 2 GSPO steps had gradient norm 0"),
        ([{"grad_norm": 0.3}] * 2, 10, None),
    ],
)
def test_learned_nothing_reasons(history, changed, expected):
    reason = learned_nothing_reason(outcome(history, changed, 10))
    if expected is None:
        assert reason is None
    else:
        assert reason.startswith(expected) and "rl.max_completion_length" in reason


def test_the_reason_names_completions_never_in_the_thinking_format_and_ones_cut_at_the_limit():
    """Found by probing: a thinking RL run whose completions never held a thinking block (each scored 0) was told to
    give num_generations or temperature room to vary."""
    flat = {"grad_norm": 0.0, "frac_reward_zero_std": 1.0}
    untagged = learned_nothing_reason(outcome([{**flat, "completions/missing_tags_rate": 1.0}] * 2, None, 10))
    assert "no completion was in the thinking format" in untagged and "answers.thinking: false" in untagged
    clipped = learned_nothing_reason(outcome([{**flat, "completions/clipped_ratio": 1.0}] * 2, None, 10))
    assert "every completion ran to rl.max_completion_length" in clipped
    some = learned_nothing_reason(outcome([{**flat, "completions/missing_tags_rate": 0.5}] * 2, None, 10))
    assert "thinking format" not in some


def test_a_parameter_signature_sees_an_update():
    import torch

    model = torch.nn.Linear(4, 2)
    before = parameter_signature(model)
    assert parameter_signature(model) == before
    with torch.no_grad():
        model.weight[0, 0] += 1e-3
    after = parameter_signature(model)
    assert after["weight"] != before["weight"] and after["bias"] == before["bias"]
