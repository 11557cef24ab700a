"""Attention for decoding steps of several tokens a row, its key/value heads read once.

SmolLM2 (and Llama, Qwen) share each key/value head among several query heads (grouped-query attention:
SmolLM2-135M has 9 query heads over 3). For a one-token query transformers' SDPA path folds the query heads
onto their key/value head and reads the cache as it is; for a query of several tokens with a mask (a
continuous batch's rows are padded, so there is always one) it copies every layer's keys and values once per
query head (`repeat_kv`) first. A decoding step that checks draft tokens (pipeline/llm/prompt_lookup.py) is
such a query, and the copy was most of its time: on 2 cores, 22 rows after 1,500-token prompts, a step of 2
tokens a row took 1.7-1.8 s against 0.22 s for one, `aten::copy_` 71% of it. Folded the same way as a
one-token query (each key/value head's query heads and tokens as one block of queries, the mask repeated
per head), it takes 0.29-0.35 s (measured 2026-12-04; bench/prompt_lookup.py measures whole passes).

Registered with transformers' attention interface as `simulacra_sdpa`; everything else (one-token queries, a
prefill, no mask, no grouping, a position bias) is transformers' own SDPA path.
"""

NAME = "simulacra_sdpa"

# The longest query folded: a decoding step's next token and its drafts. A prefill (hundreds of tokens a row) stays
# on transformers' path, where the folded mask (repeated per head) would be as large as the copy it saves.
LONGEST_FOLDED_QUERY = 16


def packed_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA with a multi-token query folded onto the key/value heads: [rows, heads, q, dim] as
    [rows, kv_heads, groups x q, dim], query head h being the (h mod groups)-th of key/value head h // groups,
    as `repeat_kv` orders them."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    rows, heads, length, dim = query.shape
    if (
        groups == 1
        or not 1 < length <= LONGEST_FOLDED_QUERY
        or attention_mask is None
        or kwargs.get("position_bias") is not None
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    folded = query.reshape(rows, heads // groups, groups * length, dim)
    mask = attention_mask.repeat(1, 1, groups, 1)  # [rows or 1, 1, q, columns] -> one copy per grouped head
    output = torch.nn.functional.scaled_dot_product_attention(
        folded, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    return output.reshape(rows, heads, length, dim).transpose(1, 2).contiguous(), None


def use_packed_attention(model):
    """`model` (loaded for decoding, on SDPA) switched to `simulacra_sdpa`; any other attention is left alone."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return model
    AttentionInterface.register(NAME, packed_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return model
