"""Next-token cross-entropy from hidden states, without a [tokens x vocabulary] logits tensor (issue 9).

A Qwen3-sized vocabulary (151,936) makes the logits the largest tensor of a training step: 8 rows
of 2048 tokens hold 2.5 billion logits, 10 GB in float32, copied again for the softmax gradient
(STACK.md: 62 GiB peak with transformers' loss, 23 GiB with a fused one). Here the loss is
computed from the model body's last hidden states and the output embedding, and only on the
labelled positions (CPT labels a fraction of the observation tokens and nothing else):
- `liger`: Liger-Kernel's fused linear cross-entropy (Triton, CUDA only; the `gpu` extra), which
  computes the loss and both gradients chunk by chunk in one pass;
- `chunked`: the same idea in plain PyTorch (`ChunkedLinearCrossEntropy`): logits for a chunk of
  tokens at a time, in float32, the gradients computed in the forward pass and kept, so at most one
  chunk's logits live at once. Runs everywhere; what CPU training uses.

`install_token_loss(model, implementation)` replaces the model's forward (on the instance, so
DDP, FSDP and DeepSpeed still wrap and call it) with one that runs the body with restarting
`position_ids` and no cache (packed rows, pipeline/training/packing.py), plus the collator's
variable-length offsets under flash-attention and the CPU's per-sequence SDPA, and returns the
summed loss and the label count instead of logits; the Trainer divides (pipeline/training/trainer.py).
The output layer is read directly, so under DeepSpeed ZeRO-3 it is gathered for the read
(pipeline/training/zero3.py).
"""

import contextlib
import logging
from typing import Literal

from pipeline.errors import UserFixableError
from pipeline.training.models import reads_varlen_offsets, takes_varlen_offsets
from pipeline.training.sequences import IGNORE_INDEX
from pipeline.training.zero3 import full_parameters

log = logging.getLogger(__name__)

LossImplementation = Literal["auto", "liger", "chunked"]
# Logits materialised at once by the chunked loss: 2^28 float32 values, 1 GiB (1,766 tokens of a
# 151,936-token vocabulary; a whole batch of the tiny model's 512).
CHUNK_LOGITS = 2**28


def resolve_loss_implementation(choice: LossImplementation) -> Literal["liger", "chunked"]:
    """`auto`: Liger on CUDA when it imports, else chunked. `liger` where it cannot run is an error."""
    import torch

    if choice == "chunked":
        return "chunked"
    available = torch.cuda.is_available() and _liger_imports()
    if choice == "liger" and not available:
        raise UserFixableError(
            "loss: liger needs a CUDA GPU and the liger-kernel package (pip install 'simulacra[gpu]'); "
            "use loss: auto or chunked"
        )
    return "liger" if available else "chunked"


def _liger_imports() -> bool:
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # noqa: F401
    except ImportError:
        return False
    return True


def _chunked_call(hidden, weight, bias, targets, softcap):
    import torch

    class ChunkedLinearCrossEntropy(torch.autograd.Function):
        """Sum of cross-entropies of `hidden @ weight.T (+ bias)` against `targets`, chunk by chunk.

        Forward computes, per chunk, float32 logits, their log-sum-exp and loss, and (when a gradient
        is wanted) d loss / d logits = softmax - one-hot, folded at once into the gradients of the
        hidden states and of the weight; the chunk's logits are then freed. Backward only scales
        the stored gradients by the incoming one (a scalar: the loss is a sum)."""

        @staticmethod
        def forward(ctx, hidden, weight, bias, targets, softcap):
            wants_grad = ctx.needs_input_grad[:3]
            chunk = max(1, CHUNK_LOGITS // weight.shape[0])
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_hidden = torch.empty_like(hidden) if wants_grad[0] else None
            grad_weight = torch.zeros_like(weight, dtype=torch.float32) if wants_grad[1] else None
            grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and wants_grad[2] else None
            for start in range(0, hidden.shape[0], chunk):
                part, target = hidden[start : start + chunk], targets[start : start + chunk]
                logits = (part @ weight.T).float()
                if bias is not None:
                    logits = logits + bias.float()
                if softcap is not None:
                    capped = softcap * torch.tanh(logits / softcap)
                else:
                    capped = logits
                log_normaliser = torch.logsumexp(capped, dim=-1)
                total += (log_normaliser - capped.gather(1, target[:, None]).squeeze(1)).sum()
                if not any(wants_grad):
                    continue
                grad_logits = torch.exp(capped - log_normaliser[:, None])
                grad_logits[torch.arange(len(target), device=target.device), target] -= 1
                if softcap is not None:
                    grad_logits *= 1 - (capped / softcap) ** 2
                if grad_hidden is not None:
                    grad_hidden[start : start + chunk] = (grad_logits.to(weight.dtype) @ weight).to(hidden.dtype)
                if grad_weight is not None:
                    grad_weight += grad_logits.T @ part.float()
                if grad_bias is not None:
                    grad_bias += grad_logits.sum(0)
            ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
            ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
            return total

        @staticmethod
        def backward(ctx, grad_total):
            grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
            weight_dtype, bias_dtype = ctx.dtypes
            return (
                None if grad_hidden is None else grad_hidden * grad_total.to(grad_hidden.dtype),
                None if grad_weight is None else (grad_weight * grad_total).to(weight_dtype),
                None if grad_bias is None else (grad_bias * grad_total).to(bias_dtype),
                None,
                None,
            )

    return ChunkedLinearCrossEntropy.apply(hidden, weight, bias, targets, softcap)


def linear_cross_entropy_sum(hidden, weight, bias, targets, implementation: Literal["liger", "chunked"], softcap=None):
    """Sum over tokens of the cross-entropy of `hidden @ weight.T + bias` (logits) against `targets`.
    hidden [N, H], weight [V, H], targets [N] (no ignored entries: the caller selects labelled rows)."""
    if not len(targets):
        # Nothing labelled in this micro-batch: a zero that still reaches every parameter it would have,
        # so distributed gradient reduction sees the same parameters on every process.
        return (hidden.sum() + weight.sum()) * 0.0
    if implementation == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return liger_fused_linear_cross_entropy(hidden, weight, targets, bias=bias, reduction="sum", softcap=softcap)
    return _chunked_call(hidden, weight, bias, targets, softcap)


def install_token_loss(model, implementation: Literal["liger", "chunked"]) -> None:
    """Make `model(input_ids, position_ids, shift_labels)` return the summed next-token loss over
    labelled positions ("loss_sum") and their number ("label_count"); with `per_row=True` (held-out
    evaluation, no gradient, in the weights' precision even under autocast) per-row sums and counts
    ("row_loss_sums", "row_label_counts").
    The instance is a training instance from then on (no logits, no generation); what is saved from
    it is an ordinary model folder."""
    import torch

    body = model.get_decoder()
    head = model.get_output_embeddings()
    softcap = getattr(model.config, "final_logit_softcapping", None)
    log.info("token loss: %s linear cross-entropy over labelled positions", implementation)

    def forward(
        input_ids,
        position_ids,
        shift_labels,
        per_row: bool = False,
        cu_seq_lens_q=None,
        cu_seq_lens_k=None,
        max_length_q=None,
        max_length_k=None,
        **batch_only,
    ):
        # `labels` and `attention_mask` stay in the batch for the Trainer (label and token counts);
        # the model needs neither: attention is isolated per sequence through position_ids (or, under
        # flash-attention, the offsets), and the padding tail is a sequence of its own that no label points into.
        varlen = {}
        attention = model.config._attn_implementation
        if takes_varlen_offsets(attention):
            if cu_seq_lens_q is None and len(input_ids) > 1 and reads_varlen_offsets(attention):
                # Without offsets flash-attention attends across the sequences of a row (packing.py).
                raise ValueError("flash-attention over several packed rows needs the offsets PackedCollator adds")
            if cu_seq_lens_q is not None:
                varlen = {
                    "cu_seq_lens_q": cu_seq_lens_q,
                    "cu_seq_lens_k": cu_seq_lens_k,
                    "max_length_q": max_length_q,
                    "max_length_k": max_length_k,
                }
        # Held-out evaluation (`per_row`) runs in the weights' own precision, never under the bf16 autocast that
        # accelerate wraps this forward in for training: a stage's CE "before" is often the "after" of the stage
        # that trained its base (pipeline/training/trainer.py, heldout_ce.json), and the demo's CPT trains under
        # bf16 while its SFT trains in float32. The demo's CPT checkpoint measured 0.7993 under bf16 and 0.8000
        # in float32 on the same windows: a third of the +0.005 SFT was reported to add.
        precision = torch.autocast(input_ids.device.type, enabled=False) if per_row else contextlib.nullcontext()
        with precision:
            hidden = body(input_ids=input_ids, position_ids=position_ids, use_cache=False, **varlen).last_hidden_state
        labelled = shift_labels != IGNORE_INDEX
        if not per_row:
            # The head is read, never called: under ZeRO-3 it is gathered for the read (pipeline/training/zero3.py).
            with full_parameters(head.weight, head.bias):
                loss_sum = linear_cross_entropy_sum(
                    hidden[labelled], head.weight, head.bias, shift_labels[labelled], implementation, softcap
                )
            return {"loss_sum": loss_sum, "label_count": labelled.sum()}
        rows = torch.arange(len(input_ids), device=input_ids.device)[:, None].expand_as(labelled)[labelled]
        with full_parameters(head.weight, head.bias):
            losses = _token_losses(hidden[labelled], head.weight, head.bias, shift_labels[labelled], softcap)
        sums = torch.zeros(len(input_ids), dtype=torch.float32, device=hidden.device).index_add_(0, rows, losses)
        return {"row_loss_sums": sums, "row_label_counts": labelled.sum(dim=1)}

    model.forward = forward


def _token_losses(hidden, weight, bias, targets, softcap):
    """Per-token cross-entropy without gradient, a chunk of logits at a time (held-out evaluation)."""
    import torch

    chunk = max(1, CHUNK_LOGITS // weight.shape[0])
    losses = []
    with torch.no_grad():
        for start in range(0, hidden.shape[0], chunk):
            logits = (hidden[start : start + chunk] @ weight.T).float()
            if bias is not None:
                logits = logits + bias.float()
            if softcap is not None:
                logits = softcap * torch.tanh(logits / softcap)
            losses.append(torch.nn.functional.cross_entropy(logits, targets[start : start + chunk], reduction="none"))
    return torch.cat(losses) if losses else hidden.new_zeros(0, dtype=torch.float32)
