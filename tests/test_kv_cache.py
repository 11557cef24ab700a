"""The reserved KV cache (pipeline/llm/kv_cache.py) decodes exactly as transformers' DynamicCache: the same
logits step by step, through left-padded prompts, rows leaving the batch, a crop, and growth past the
room it reserved (the continuous batch's own tests, tests/test_llm_transformers.py and tests/test_serve.py,
run on it); and the decoder prefills prompts in groups of similar length."""

import pytest
import torch

from pipeline.llm import kv_cache
from pipeline.llm.kv_cache import ReservedCache, ReservedLayer, cache_keyword


@pytest.fixture(scope="module")
def tiny_model(tiny_chat_model):
    from pipeline.training.models import load_causal_lm

    return load_causal_lm(str(tiny_chat_model)).eval()


def _decode(model, cache, steps: int, select_at: int | None, crop_at: int | None):
    """Greedy decoding of 3 left-padded rows; at `select_at` the middle row leaves, at `crop_at` the last
    token is cropped and fed again. Returns every step's logits."""
    torch.manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :7] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    seen = []
    with torch.inference_mode():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, **{cache_keyword(model): cache}, use_cache=True
        ).logits[:, -1]
        last = positions[:, -1]
        for step in range(steps):
            seen.append(logits.clone())
            if step == select_at:
                keep = torch.tensor([0, 2])
                cache.batch_select_indices(keep)
                mask, last, logits = mask[keep], last[keep], logits[keep]
            token = logits.argmax(-1, keepdim=True)
            if step == crop_at:
                cache.crop(-1)
                mask, last = mask[:, :-1], last - 1
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            last = last + 1
            logits = model(
                input_ids=token,
                attention_mask=mask,
                position_ids=last[:, None],
                **{cache_keyword(model): cache},
                use_cache=True,
            ).logits[:, -1]
    return seen


@pytest.mark.parametrize("select_at, crop_at", [(None, None), (5, None), (3, 9)])
def test_reserved_cache_decodes_as_the_dynamic_cache(tiny_model, monkeypatch, select_at, crop_at):
    from transformers import DynamicCache

    monkeypatch.setattr(kv_cache, "MIN_RESERVED_TOKENS", 4)  # the room runs out, and regrows, several times
    expected = _decode(tiny_model, DynamicCache(), 30, select_at, crop_at)
    reserved = ReservedCache()
    got = _decode(tiny_model, reserved, 30, select_at, crop_at)
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        assert torch.allclose(mine, theirs, atol=1e-5)
    assert all(isinstance(layer, ReservedLayer) for layer in reserved.layers)
    assert reserved.get_seq_length() == 12 + 30 - (1 if crop_at is not None else 0)


def test_a_token_is_written_into_reserved_room_without_copying_the_cache():
    layer = ReservedLayer()
    first = torch.randn(2, 3, 10, 4)
    layer.update(first, first + 1)
    buffer = layer._key_buffer
    assert buffer.shape[-2] > 10  # room reserved past the prompt
    new = torch.randn(2, 3, 1, 4)
    keys, values = layer.update(new, new + 1)
    assert layer._key_buffer is buffer  # written in place
    assert torch.equal(keys, torch.cat([first, new], dim=-2)) and torch.equal(
        values, torch.cat([first, new], dim=-2) + 1
    )
    assert layer.get_seq_length() == 11
    # Assigned whole (transformers' crop does this): exactly what was assigned, room again at the next token.
    layer.keys, layer.values = keys[..., 2:, :], values[..., 2:, :]
    assert layer.get_seq_length() == 9
    keys, _ = layer.update(new, new)
    assert torch.equal(keys, torch.cat([first[..., 2:, :], new, new], dim=-2))


def test_a_row_leaving_keeps_the_room_of_the_others():
    layer = ReservedLayer()
    first = torch.randn(3, 3, 10, 4)
    layer.update(first, first + 1)
    layer.batch_select_indices(torch.tensor([0, 2]))
    buffer = layer._key_buffer
    assert layer.get_seq_length() == 10 and buffer.shape[0] == 2 and buffer.shape[-2] > 10
    new = torch.randn(2, 3, 1, 4)
    keys, values = layer.update(new, new + 1)
    assert layer._key_buffer is buffer  # the next token written in place, not copied into new room
    kept = first[[0, 2]]
    assert torch.equal(keys, torch.cat([kept, new], dim=-2)) and torch.equal(values, torch.cat([kept, new], dim=-2) + 1)


@pytest.mark.parametrize(
    "keep, order",
    [
        ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4]),
        ([0, 1, 2, 3], [0, 1, 2, 3]),  # the last row left: nothing moves
        ([1, 2, 3, 4], [4, 1, 2, 3]),  # the first left: the last fills its slot
        ([0, 2, 4], [0, 4, 2]),
        ([3, 4], [3, 4]),
        ([4], [4]),
    ],
)
def test_rows_that_stay_keep_their_slot_and_rows_past_the_end_fill_the_holes(keep, order):
    from pipeline.llm.kv_cache import compacted_order

    assert compacted_order(keep, 5) == order


def test_rows_leaving_in_place_copy_only_the_rows_that_move():
    """`keep_rows`: the batch's rows after some leave, in the buffers they had (with their room); only the
    rows past the new end are written, into the slots of rows that left."""
    from pipeline.llm.kv_cache import compacted_order

    layer = ReservedLayer()
    first = torch.randn(5, 3, 10, 4)
    layer.update(first, first + 1)
    buffer = layer._key_buffer
    order = compacted_order([1, 3, 4], 5)  # rows 0 and 2 leave: row 3 moves into slot 0, row 4 into slot 2
    assert order == [3, 1, 4]
    untouched = buffer[1].clone()
    layer.keep_rows(order)
    assert layer._key_buffer.data_ptr() == buffer.data_ptr() and layer._key_buffer.shape[0] == 3
    assert torch.equal(layer.keys, first[order]) and torch.equal(layer.values, first[order] + 1)
    assert torch.equal(buffer[1], untouched)
    new = torch.randn(3, 3, 1, 4)
    keys, _ = layer.update(new, new)
    assert layer._key_buffer.data_ptr() == buffer.data_ptr()  # still room: written in place
    assert torch.equal(keys, torch.cat([first[order], new], dim=-2))
    # The leading padding no row attends to is dropped as a view, with the room kept.
    layer.drop_leading(4)
    assert layer.get_seq_length() == 7 and torch.equal(layer.keys, torch.cat([first[order], new], dim=-2)[..., 4:, :])
    keys, _ = layer.update(new, new)
    assert layer._key_buffer.data_ptr() == buffer[..., 4:, :].data_ptr() and keys.shape[-2] == 8


def _prefilled_alone(model, prompt: list[int]):
    """One prompt prefilled into its own cache, as the decoder's part of a batch."""
    from pipeline.llm.batching import _Batch

    cache = ReservedCache()
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    positions = torch.arange(len(prompt))[None]
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, **{cache_keyword(model): cache}, use_cache=True
    ).logits[:, -1]
    return _Batch([prompt], cache, mask, positions[:, -1], logits.float())


def _greedy_logits(model, batch, steps: int) -> list[torch.Tensor]:
    seen = []
    for _ in range(steps):
        seen.append(batch.logits.clone())
        token = batch.logits.argmax(-1, keepdim=True)
        batch.mask = torch.cat([batch.mask, torch.ones_like(token)], dim=1)
        batch.last_position = batch.last_position + 1
        batch.logits = model(
            input_ids=token,
            attention_mask=batch.mask,
            position_ids=batch.last_position[:, None],
            **{cache_keyword(model): batch.cache},
            use_cache=True,
        ).logits[:, -1]
    return seen


def test_parts_stacked_into_one_batch_decode_as_each_alone(tiny_model):
    """The decoder's prefill parts (prefix families, length groups) of different widths, stacked into one
    batch, left-padded: every row's logits, step by step, are those of its prompt decoded alone; and the
    stacked cache has room, so the first tokens are written without copying it."""
    from pipeline.llm.batching import _stacked

    torch.manual_seed(0)
    prompts = [torch.randint(5, tiny_model.config.vocab_size, (length,)).tolist() for length in (5, 12, 9)]
    with torch.inference_mode():
        alone = [_greedy_logits(tiny_model, _prefilled_alone(tiny_model, prompt), 8) for prompt in prompts]
        batch = _stacked([_prefilled_alone(tiny_model, prompt) for prompt in prompts])
        assert batch.rows == prompts and batch.mask.shape == (3, 12)
        assert batch.mask.sum(-1).tolist() == [5, 12, 9]
        buffer = batch.cache.layers[0]._key_buffer
        together = _greedy_logits(tiny_model, batch, 8)
    assert batch.cache.layers[0]._key_buffer is buffer
    for row in range(3):
        for step in range(8):
            assert torch.allclose(together[step][row], alone[row][step][0], atol=1e-5)


@pytest.mark.parametrize(
    "lengths, groups",
    [
        ([600], [[0]]),
        ([300, 310, 320], [[0, 1, 2]]),  # alike: one prefill
        ([1500, 300, 320, 1400], [[1, 2], [3, 0]]),  # short with short, long with long
        ([100, 1000], [[0], [1]]),  # one padded batch would run 2,000 tokens for 1,100
    ],
)
def test_prompts_are_prefilled_in_groups_of_similar_length(lengths, groups):
    from pipeline.llm.batching import PREFILL_PADDING, length_groups

    found = length_groups(lengths)
    assert found == groups
    assert sorted(i for group in found for i in group) == list(range(len(lengths)))
    for group in found:
        longest = max(lengths[i] for i in group)
        assert len(group) * longest <= (1 + PREFILL_PADDING) * sum(lengths[i] for i in group)
