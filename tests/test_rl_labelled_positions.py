"""RL's log-probabilities on a CPU: TRL's fused LM head projects the completion's positions only, with the same
log-probabilities, entropies and gradients as its whole-row head (pipeline/rl/labelled_positions.py)."""

import pytest
import torch

from pipeline.rl.labelled_positions import score_labelled_positions_only
from tests.test_packing import VOCAB, tiny_model

trl_utils = pytest.importorskip("trl.trainer.utils")


def tiny_policy():
    model = tiny_model("sdpa")  # a 2-layer Qwen3 over 97 tokens, grouped-query attention
    trl_utils.add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    return model


def scored(model, monkeypatch):
    """Log-probabilities, entropies and the policy's gradients for a batch as GRPOTrainer builds it (left-padded
    prompts, right-padded completions, labels on the completions only), and how many positions the head projected."""
    projected = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def counting(hidden, *args):
        projected.append(hidden.shape[0])
        return apply(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", counting)
    ids = torch.randint(1, VOCAB, (3, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # a shorter prompt, padded on the left
    mask[1, -3:] = 0  # a shorter completion, padded on the right
    completion = 6
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-completion] = -100
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    logps, entropy = out.log_probs[:, -completion:], out.entropy[:, -completion:]
    (logps.sum() + entropy.sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return logps.detach(), entropy.detach(), grads, projected, int((labels[:, 1:] != -100).sum())


def test_the_cpu_head_projects_the_completions_only_with_the_same_values_and_gradients(monkeypatch):
    # TRL's own choice, as a fresh process has it (a test before this one in the process may have trained RL, which
    # makes the choice for the process); the choice in place is restored after the test.
    monkeypatch.setattr(trl_utils, "_use_triton", getattr(trl_utils._use_triton, "trl_choice", trl_utils._use_triton))
    model = tiny_policy()
    whole_logps, whole_entropy, whole_grads, whole_rows, labelled = scored(model, monkeypatch)
    assert whole_rows == [3 * 19]  # TRL's own choice on a CPU: every position of every row

    assert score_labelled_positions_only()
    assert score_labelled_positions_only()  # a second call changes nothing
    logps, entropy, grads, rows, _ = scored(model, monkeypatch)
    assert rows == [labelled] and labelled == 6 + 6 + 3
    torch.testing.assert_close(logps, whole_logps)
    torch.testing.assert_close(entropy, whole_entropy)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, whole_grads[name], msg=name)
    # Another device keeps TRL's own choice.
    assert trl_utils._use_triton(torch.device("meta")) is False


def test_a_trl_without_the_choice_is_left_as_it_is(monkeypatch):
    monkeypatch.delattr(trl_utils, "_use_triton")
    assert score_labelled_positions_only() is False
    assert not hasattr(trl_utils, "_use_triton")
