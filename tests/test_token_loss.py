"""The loss without full logits equals the loss with them, in value and gradients; which implementation runs."""

import pytest
import torch
import torch.nn.functional as F

from pipeline.errors import UserFixableError
from pipeline.training import token_loss
from pipeline.training.token_loss import linear_cross_entropy_sum, resolve_loss_implementation


def full_logits_loss(hidden, weight, bias, targets, softcap):
    logits = hidden @ weight.T + (0 if bias is None else bias)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


@pytest.mark.parametrize(
    "tokens, chunk_logits, with_bias, softcap",
    [
        (37, 10 * 50, False, None),  # 10 tokens a chunk: 4 chunks, the last one short
        (37, 2**28, False, None),  # one chunk
        (5, 50, True, None),  # one token a chunk, a bias
        (23, 7 * 50, False, 3.0),  # logit soft-capping (Gemma-style models)
        (0, 10 * 50, False, None),  # nothing labelled: a zero loss, zero gradients
    ],
)
def test_chunked_cross_entropy_equals_full_logits_in_loss_and_gradients(
    monkeypatch, tokens, chunk_logits, with_bias, softcap
):
    monkeypatch.setattr(token_loss, "CHUNK_LOGITS", chunk_logits)
    torch.manual_seed(0)
    hidden = torch.randn(tokens, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    bias = torch.randn(50, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 50, (tokens,))

    expected = full_logits_loss(hidden, weight, bias, targets, softcap)
    (3.0 * expected).backward()  # a non-unit upstream gradient, as a normalised loss passes back
    reference = [t.grad.clone() for t in (hidden, weight, bias) if t is not None]
    for t in (hidden, weight, bias):
        if t is not None:
            t.grad = None

    loss = linear_cross_entropy_sum(hidden, weight, bias, targets, "chunked", softcap)
    (3.0 * loss).backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for got, want in zip([t.grad for t in (hidden, weight, bias) if t is not None], reference):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "choice, expected",
    [("chunked", "chunked"), ("auto", "chunked")],  # no CUDA here: auto falls back
)
def test_loss_implementation_choice_on_cpu(choice, expected):
    assert resolve_loss_implementation(choice) == expected


def test_liger_without_a_gpu_is_a_user_error_naming_the_field():
    with pytest.raises(UserFixableError, match="loss: liger needs a CUDA GPU"):
        resolve_loss_implementation("liger")
