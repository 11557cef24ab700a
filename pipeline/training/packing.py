"""Padding-free packing: token sequences laid end to end in rows of `max_length` tokens (issue 9).

A batch of padded sequences spends compute on padding and limits the batch to what the longest
sequence allows (issue 9: the CPT stage's padded batches, small batches and full logits together
trained 7x fewer useful tokens per second on one H200 than full rows with a fused loss). Packed, a
row holds several sequences; each keeps its own view of the world:
- positions restart at 0 for every sequence (`position_ids`), as if it were alone;
- attention never crosses a sequence boundary. Transformers (5.x, `masking_utils`) reads the
  boundaries off the restarting `position_ids` when the model is called without a 2D attention
  mask and without a cache, and builds a block-diagonal causal mask for `sdpa`/`eager` and a
  BlockMask for `flex_attention`. STACK.md measured the trap: with a cache (the default
  `use_cache=True`) the boundaries are ignored and the sequences see each other. The model call
  passes `use_cache=False` (pipeline/training/token_loss.py). Flash-attention reads no mask: its
  variable-length kernel takes the boundaries as offsets into the batch flattened to one stream
  (`cu_seq_lens_q/k`, `max_length_q/k`), and transformers (5.17 and 5.24,
  `_is_packed_sequence`) derives them from `position_ids` only for a batch of ONE row; with more
  rows and no offsets it runs plain causal attention over each whole row, across sequences,
  silently. So the collator computes the offsets from the packing for every batch, and the model
  call passes them under flash-attention. tests/test_packing.py checks loss and gradients against
  the sequences run one by one, for each attention path;
- the last token of a sequence predicts nothing: labels are shifted per sequence (`shift_labels`),
  so no loss ever asks the model to guess the first token of the next sequence.

Rows are filled by best-fit decreasing over the sequences' lengths (read once, without loading
the sequences), then put in a seeded order. Under `row_order: stratified` the filling is done within
each stratum the sequences name (an environment, world knowledge), so that a row holds one and the
order of rows can balance them (pipeline/training/row_order.py). The tail of a row that nothing fits
is padding: a sequence of its own in `position_ids` (so it never attends to real tokens, nor they to
it), unlabelled, 0 in `attention_mask` (which only counts tokens: it never reaches attention).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.training.sequences import IGNORE_INDEX


def pack_rows(
    lengths: Sequence[int] | np.ndarray, capacity: int, seed: int, strata: Sequence[str] | None = None
) -> list[list[int]]:
    """Sequence indices grouped in rows of at most `capacity` tokens, every index exactly once, in a seeded
    order; with `strata` (one per sequence), a row holds sequences of one stratum only.

    Best-fit decreasing: longest first, each into the open row it fills most tightly (the row with
    the least room that still fits it), a new row when none fits. `np.argmax` over a boolean
    "some open row has this much room" array finds that row in one vectorised scan, so a million
    sequences pack in seconds."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (too_long := int(lengths.max())) > capacity:
        raise ValueError(f"a sequence of {too_long} tokens does not fit in a row of {capacity}")
    if strata is None:
        rows = _best_fit_decreasing(lengths, capacity)
    else:
        rows = []
        labels = np.asarray(strata, dtype=object)
        for stratum in sorted(set(strata)):
            members = np.flatnonzero(labels == stratum)
            rows += [[int(members[i]) for i in row] for row in _best_fit_decreasing(lengths[members], capacity)]
    order = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i] for i in order]


def _best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    rows: list[list[int]] = []
    has_room = np.zeros(capacity + 1, dtype=bool)  # has_room[r]: some open row has exactly r tokens free
    rows_with_room: list[list[int]] = [[] for _ in range(capacity + 1)]
    for index in np.argsort(-lengths, kind="stable").tolist():
        length = int(lengths[index])
        room = length + int(np.argmax(has_room[length:]))
        if has_room[room]:
            row = rows_with_room[room].pop()
            has_room[room] = bool(rows_with_room[room])
            rows[row].append(index)
        else:
            row, room = len(rows), capacity
            rows.append([index])
        left = room - length
        if left > 0:
            rows_with_room[left].append(row)
            has_room[left] = True
    return rows


class PackedSequences:
    """A map-style dataset of packed rows over a sequence dataset.

    The wrapped dataset has `__len__`, `__getitem__(i) -> {"input_ids", "labels"}` (labels of the
    current epoch), `lengths()` (every sequence's token count) and `set_epoch(epoch)`, forwarded
    here so per-epoch labels follow the Trainer's epochs. Rows are packed once, from the lengths:
    labels may change between epochs, lengths never do. `by_stratum`, over a dataset with `strata()` (one per
    sequence): rows of one stratum each, which `row_strata` names per row (all "" otherwise)."""

    def __init__(self, sequences, max_length: int, seed: int, by_stratum: bool = False):
        self.sequences = sequences
        strata = sequences.strata() if by_stratum and hasattr(sequences, "strata") else None
        self.rows = pack_rows(sequences.lengths(), max_length, seed, strata)
        self.row_strata = [strata[row[0]] if strata is not None else "" for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sequences, "set_epoch"):
            self.sequences.set_epoch(epoch)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        input_ids: list[int] = []
        labels: list[int] = []
        shift_labels: list[int] = []
        position_ids: list[int] = []
        for sequence_index in self.rows[index]:
            sequence = self.sequences[sequence_index]
            input_ids += sequence["input_ids"]
            labels += sequence["labels"]
            # Token t predicts label t+1 of its own sequence; a sequence's last token predicts nothing.
            shift_labels += sequence["labels"][1:] + [IGNORE_INDEX]
            position_ids += range(len(sequence["input_ids"]))
        return {"input_ids": input_ids, "labels": labels, "shift_labels": shift_labels, "position_ids": position_ids}


class PackedCollator:
    """Stacks packed rows into tensors `width` tokens wide (the row length, so every batch has one
    shape: compiled attention kernels such as flex attention's are built once). A batch with a row longer
    than `width` is `wider` wide: SFT trains on rows shorter than the CPT windows its held-out
    cross-entropy is measured on, and each of the two keeps one shape.

    With them, flash-attention's variable-length offsets over the batch read as one stream of
    `rows x width` tokens: `cu_seq_lens_q/k`, int32, where each sequence starts (a padding tail is
    a sequence; a row's end is always a boundary), the total last; `max_length_q/k`, the longest
    sequence as a Python int (flash-attn's kernels take an int; a tensor would cost a device sync
    per layer)."""

    def __init__(self, pad_token_id: int, width: int, wider: int | None = None):
        self.pad_token_id = pad_token_id
        self.width = width
        self.wider = wider

    def _width(self, rows: list[dict[str, list[int]]]) -> int:
        longest = max((len(row["input_ids"]) for row in rows), default=0)
        if longest <= self.width:
            return self.width
        if self.wider is not None and longest <= self.wider:
            return self.wider
        raise ValueError(
            f"a packed row of {longest} tokens is longer than the collator's widths ({self.width}, {self.wider})"
        )

    def __call__(self, rows: list[dict[str, list[int]]]):
        import torch

        width = self._width(rows)
        shape = (len(rows), width)
        batch: dict[str, Any] = {  # tensors, and the two maximum lengths (ints)
            "input_ids": torch.full(shape, self.pad_token_id, dtype=torch.long),
            "labels": torch.full(shape, IGNORE_INDEX, dtype=torch.long),
            "shift_labels": torch.full(shape, IGNORE_INDEX, dtype=torch.long),
            # The padding tail counts from 0: a sequence of its own, isolated like the others.
            "position_ids": torch.arange(width).repeat(len(rows), 1),
            "attention_mask": torch.zeros(shape, dtype=torch.long),
        }
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            for name in ("input_ids", "labels", "shift_labels", "position_ids"):
                batch[name][i, :n] = torch.tensor(row[name])
            batch["position_ids"][i, n:] = torch.arange(width - n)
            batch["attention_mask"][i, :n] = 1
        # A sequence starts wherever positions restart at 0 (the packing's own boundaries, padding tails
        # included); offsets count across rows, as flash-attention flattens the batch before attending.
        starts = (batch["position_ids"].reshape(-1) == 0).nonzero().reshape(-1)
        offsets = torch.cat([starts, torch.tensor([shape[0] * shape[1]])]).to(torch.int32)
        longest = int(offsets.diff().max())
        batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = offsets
        batch["max_length_q"] = batch["max_length_k"] = longest
        return batch
