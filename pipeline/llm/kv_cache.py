"""A KV cache that grows into reserved room, for the continuous batch (pipeline/llm/batching.py).

transformers' `DynamicCache` appends each decoding step's keys and values with `torch.cat`, which
copies every layer's whole cache once per generated token: on 2 CPU cores, decoding 8 rows after
600-token prompts with SmolLM2-135M, `aten::cat` was a third of the profiled time. `ReservedCache`
keeps each layer's keys and values in buffers with room past the end, writes a new token into that
room, and copies only when the room runs out (it then reserves half as much again, so copies are
amortised away). `bench/kv_cache.py`: a step takes 0.95x the time after 600-token prompts, 0.77x after
1,200, 0.81x at 16 rows, with the same tokens (the gain grows with the cache; README, "Performance");
the same logits step by step in tests/test_kv_cache.py.

What attention sees is a view of the filled part of each buffer. Anything that assigns a layer's
`keys`/`values` (transformers' `crop` and `reset`) replaces the buffer with exactly what it
assigns, and the next token reserves again. A batch stacked from prefilled parts is given buffers with room
(`adopt`), and rows leaving keep the others' room (`keep_rows`: the rows past the new end move into the slots
of those that left, and nothing else is copied), so none of these copies the cache again at the next token; a
trim of leading padding (`drop_leading`) is a view.
"""

import inspect
from typing import Any

from transformers.cache_utils import DynamicCache, DynamicLayer

# Room reserved past the filled length when a buffer grows: at least this many tokens, or half the
# length, so a long answer copies its cache O(log n) times rather than once a token.
MIN_RESERVED_TOKENS = 256


class ReservedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of buffers with room to grow."""

    def __init__(self):
        # Tensors once the first keys arrive (update, the setters).
        self._key_buffer: Any = None
        self._value_buffer: Any = None
        # Filled lengths, one each: `crop` and friends assign keys, then values, each computed from its getter.
        self._keys_filled = self._values_filled = 0
        super().__init__()

    @property
    def keys(self):
        return _filled_part(self._key_buffer, self._keys_filled)

    @keys.setter
    def keys(self, tensor) -> None:
        # Assigned whole: exactly this, no room reserved until the next token.
        self._key_buffer, self._keys_filled = tensor, _length(tensor)

    @property
    def values(self):
        return _filled_part(self._value_buffer, self._values_filled)

    @values.setter
    def values(self, tensor) -> None:
        self._value_buffer, self._values_filled = tensor, _length(tensor)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        filled, new = self._keys_filled, key_states.shape[-2]
        if not self._has_room(key_states, value_states, filled + new):
            self._reserve(key_states, value_states, filled, filled + new)
        self._key_buffer[..., filled : filled + new, :] = key_states
        self._value_buffer[..., filled : filled + new, :] = value_states
        self._keys_filled = self._values_filled = filled + new
        return self.keys, self.values

    def adopt(self, key_buffer, value_buffer, filled: int) -> None:
        """Take buffers whose first `filled` positions hold the cache and whose rest is room to grow: a batch
        stacked from prefilled parts (pipeline/llm/batching.py) writes its first tokens without a copy."""
        if not self.is_initialized:
            self.lazy_initialization(key_buffer, value_buffer)
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        self._keys_filled = self._values_filled = filled

    def batch_select_indices(self, indices) -> None:
        """Only the rows `indices` (any order, repeats allowed: a shared prefill copied to each of its rows), with
        their room, where transformers' selection keeps the filled part only and the next token copies it again
        into new room."""
        if self._keys_filled and self._key_buffer.dim() == 4:
            self._key_buffer = self._key_buffer[indices, ...]
            self._value_buffer = self._value_buffer[indices, ...]

    def keep_rows(self, order: list[int]) -> None:
        """Only the rows `order`, in place: a row that stays where it is has `order[i] == i`, and the others
        (`compacted_order`: rows from past the new end) are copied into the slots of rows that left. A row
        leaving the batch copies the rows that move into its slot, where a selection copies every row that
        stays: on 2 cores a selection of 20 rows after 1,500-token prompts took 0.6-0.8 s, three decoding
        steps, and a validation pass of the demo loses 14 of its 23 rows in its first sixteen steps."""
        if not self._keys_filled or self._key_buffer.dim() != 4:
            return
        moves = [(slot, row) for slot, row in enumerate(order) if slot != row]
        for name in ("_key_buffer", "_value_buffer"):
            buffer = getattr(self, name)
            if moves:
                slots, rows = (list(side) for side in zip(*moves))
                buffer[slots, :, : self._keys_filled] = buffer[rows, :, : self._keys_filled]
            setattr(self, name, buffer[: len(order)])

    def drop_leading(self, count: int) -> None:
        """Forget the first `count` positions of every row (the padding no row attends to any more), keeping the
        room past the end: a view, no copy."""
        if self._keys_filled and self._key_buffer.dim() == 4:
            self._key_buffer = self._key_buffer[..., count:, :]
            self._value_buffer = self._value_buffer[..., count:, :]
            self._keys_filled = self._values_filled = self._keys_filled - count

    def _has_room(self, key_states, value_states, needed: int) -> bool:
        return all(
            buffer is not None
            and buffer.dim() == 4
            and buffer.shape[-2] >= needed
            and buffer.shape[:2] == states.shape[:2]
            for buffer, states in ((self._key_buffer, key_states), (self._value_buffer, value_states))
        )

    def _reserve(self, key_states, value_states, filled: int, needed: int) -> None:
        """New buffers with room past `needed`, holding the `filled` tokens cached so far."""
        size = reserved_length(needed)
        keys = key_states.new_empty((*key_states.shape[:2], size, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:2], size, value_states.shape[-1]))
        if filled:
            keys[..., :filled, :] = self._key_buffer[..., :filled, :]
            values[..., :filled, :] = self._value_buffer[..., :filled, :]
        self._key_buffer, self._value_buffer = keys, values


def compacted_order(keep: list[int], rows: int) -> list[int]:
    """The rows `keep` (ascending, of `rows`) as `ReservedLayer.keep_rows` takes them: each kept row below
    `len(keep)` stays in its slot, and the kept rows past that fill the slots of the rows that left."""
    size = len(keep)
    movers = iter(row for row in keep if row >= size)
    staying = {row for row in keep if row < size}
    return [slot if slot in staying else next(movers) for slot in range(size)]


def reserved_length(needed: int) -> int:
    """The length of a buffer that holds `needed` tokens and room to grow."""
    return needed + max(MIN_RESERVED_TOKENS, needed // 2)


def _length(tensor) -> int:
    return tensor.shape[-2] if tensor is not None and tensor.dim() == 4 else 0


def _filled_part(buffer, filled: int):
    return buffer if buffer is None or buffer.dim() != 4 else buffer[..., :filled, :]


class ReservedCache(DynamicCache):
    """A `DynamicCache` (every model and mask utility treats it as one) whose layers are `ReservedLayer`s."""

    def __init__(self):
        super().__init__()
        self.layer_class_to_replicate = ReservedLayer


def cache_keyword(model) -> str:
    """The name a model's forward takes its cache by: transformers 5 renamed `past_key_values` to `cache`
    (the old name warns, and goes in 5.40)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
