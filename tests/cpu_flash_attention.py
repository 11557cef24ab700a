"""flash-attn's two kernels written with SDPA, so transformers' own flash-attention path runs on a CPU.

transformers' `flash_attention_2` goes through `integrations/flash_attention.py` and
`modeling_flash_attention_utils._flash_attention_forward`, which picks a kernel from the arguments
it gets: the variable-length one (`flash_attn_varlen_func`) when the call carries
`cu_seq_lens_q/k` and `max_length_q/k` (or, for a batch of one row, when `position_ids` restart),
else the plain one (`flash_attn_func`), causal over each whole row. That choice is the code under
test (the cross-sequence trap of packing.py); only the kernels need a GPU. `install(monkeypatch)`
replaces transformers' kernel loader with these two, which compute what flash-attn computes (causal
attention within each `cu_seqlens` segment; GQA by broadcasting key/value heads) and count their
calls. A model is built with `sdpa` (its constructor refuses flash_attention_2 without flash-attn)
and switched with `use_flash_attention(model)`: attention modules read the implementation from the
config at every call.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class KernelCalls:
    varlen: int = 0  # flash_attn_varlen_func: one stream of sequences, isolated by offsets
    whole_rows: int = 0  # flash_attn_func: causal over each row, whatever it holds


def _attend(q, k, v, softmax_scale, causal):
    """[batch, tokens, heads, head_dim] in and out, as flash-attn lays them out."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=softmax_scale, enable_gqa=True
    )
    return out.transpose(1, 2)


def install(monkeypatch) -> KernelCalls:
    from transformers import modeling_flash_attention_utils as flash_utils

    calls = KernelCalls()

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        calls.whole_rows += 1
        return _attend(q, k, v, softmax_scale, causal)

    def flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False
    ):
        # flash-attn's kernels take the longest length as an int: a tensor here would fail there.
        assert isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int), (type(max_seqlen_q), type(max_seqlen_k))
        assert torch.equal(cu_seqlens_q, cu_seqlens_k) and cu_seqlens_q.dtype == torch.int32
        bounds = cu_seqlens_q.tolist()
        assert bounds[0] == 0 and bounds[-1] == q.shape[0], bounds  # the offsets cover the flattened batch
        assert max(b - a for a, b in zip(bounds, bounds[1:])) == max_seqlen_q
        calls.varlen += 1
        out = torch.empty_like(q)
        for start, end in zip(bounds, bounds[1:]):
            out[start:end] = _attend(q[None, start:end], k[None, start:end], v[None, start:end], softmax_scale, causal)[
                0
            ]
        return out

    def lazy_import_flash_attention(implementation, *args, **kwargs):
        kernels = (flash_attn_func, flash_attn_varlen_func, None, flash_utils._pad_input, flash_utils._unpad_input)
        return kernels, (flash_utils._lazy_define_process_function(flash_attn_varlen_func), dict)

    monkeypatch.setattr(flash_utils, "lazy_import_flash_attention", lazy_import_flash_attention)
    return calls


def use_flash_attention(model):
    model.config._attn_implementation = "flash_attention_2"
    return model
