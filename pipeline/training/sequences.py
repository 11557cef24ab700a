"""Token sequences for continual pretraining: whole trajectories in ChatML with keep-ratio label masks.

One sequence per trajectory, so N turns cost one forward pass instead of N prefixes (issue 4):

    <|im_start|>system\\n{CPT system prompt}<|im_end|>\\n
    <|im_start|>user\\n{action 1}<|im_end|>\\n
    <|im_start|>assistant\\n{observation 1}<|im_end|>\\n
    ... one user/assistant pair per turn

Every piece (role header, content, end of turn) is tokenised on its own and the ids concatenated,
so a piece's boundaries are exact and no retokenisation of the joined text can move them. Literal
`<|im_end|>` text inside an action or observation is encoded as plain text, never as the special
token, so data cannot forge a turn boundary.

Labels (everything else is -100, and stays in `input_ids` as context):
- Observation tokens only (SPEC.md, Stage 1). System prompt, actions and role headers never.
- The `<|im_end|>` closing an observation is an observation token: the model learns where an
  observation stops. It is one of the observation's n+1 positions, so it is labelled with the same
  probability k as the others (issue 13).
- Why not "the end token always, content at k": this reading serves SPEC.md's "the keep ratio is the
  fraction of that observation's tokens that count in the loss" (Turn informativeness), and with it
  the loss on a uniform k-subset is an unbiased estimate of k x the full observation loss. The other
  would serve Stage 1's "the model emits the observation directly" (every observation, echoes too,
  teaching where it stops), but it weighs a short echo's end token like its whole content (a 3-token
  echo at k = 0.05: 87% of its loss on the end token), and stopping is learnt at full weight from
  every k = 1 observation anyway.
- Granularity: single tokens, not spans. Because masked tokens stay in the input, the loss on a
  uniformly drawn subset of k*(n+1) positions is an unbiased, lower-variance estimate of k times the
  full observation loss; spans would add variance and favour whatever sits at span starts.
- How many: k*(n+1) for n content tokens plus the end token, stochastically rounded (floor, plus
  one with probability of the fractional part), chosen uniformly among all n+1 positions: every
  position, content or end, is labelled with probability exactly k, even in short observations.
- Which: drawn per epoch by a generator seeded from (seed, trajectory_id, turn_index, epoch), so a
  turn's mask does not depend on batch order, windowing or which other trajectories are in the run,
  a one-epoch run is reproducible, and over several epochs every token of an echo can be labelled.
- The outcome head (`cpt.outcome_head_tokens`, h): an observation's first h positions are labels
  whatever its ratio, and the ratio thins the positions after them. Those first tokens say which
  outcome an action had ("You put the ..." or "Nothing happens."), and the categories follow the
  outcome: after `put X in/on Y` the success echoes the action (echo, k 0.05) and the failure does not
  (action, k 1). Thinned from the first token, the two outcomes of one action were learnt in a ratio of
  k, so CPT taught SmolLM2 that a put fails or shows the receptacle ("On the sofa 1, you see ...") where
  the base model had echoed it (read in `make learn`'s answers, 2026-12-03). The head labels the choice
  of outcome at the data's own rates and still spares the loss the echo's predictable rest. h = 0 is the
  plain per-token reading above.

Storage: the mask of an epoch is drawn when a sequence is read (`ParquetSequences.__getitem__`), not
when it is written. A sequence holds `labels` with every observation token labelled (a keep ratio 0
observation is never labelled, so it is -100 there already), plus one `MaskSpan` per observation with
0 < k < 1: its positions, k and its turn seed. Held-out windows, world-knowledge documents and SFT
data have no span: their labels are the labels of every epoch.

Windows: a trajectory longer than `max_length` is cut into windows at turn boundaries. Each window
repeats the system prompt and then holds whole (action, observation) turns, greedily, as many as
fit; no turn is repeated, so every observation is in exactly one window. A single turn that does
not fit in a window with the system prompt keeps its action and the head of its observation up to
`max_length` (its tail and end token are cut, so the model is never taught to stop early); if not
even one observation token fits after the action, the turn is dropped. A system prompt may fill at
most half a window (SYSTEM_SHARE): a longer one (a long tool list) keeps its head, so the turns
keep the other half instead of every turn being dropped. All three are counted.
"""

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.store.schema import ScoredTurn
from pipeline.training.tiny_model import IM_END, IM_START

IGNORE_INDEX = -100
# Most of a window the system prompt may take; the rest is for turns.
SYSTEM_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class MaskSpan:
    """Positions [start, end) of one observation (its end token included when present) of which each
    epoch labels a keep_ratio share, drawn from `seed` (the turn's) and the epoch."""

    start: int
    end: int
    keep_ratio: float
    seed: int


@dataclass(slots=True)
class TokenSequence:
    input_ids: list[int]
    labels: list[int]  # every label any epoch may use; `spans` thin them per epoch
    source: str
    kind: str = "trajectory"  # or "world_knowledge"
    # Turns whose observation this sequence holds (empty for a world-knowledge document).
    turn_indices: list[int] = field(default_factory=list)
    spans: list[MaskSpan] = field(default_factory=list)
    # The part of the pool it stands for (CPT and SFT: the environment's domain, or "world_knowledge"). Under
    # `row_order: stratified` rows are packed within one stratum and ordered so every stretch of an epoch holds
    # each in its share (pipeline/training/row_order.py). "" where nobody said.
    stratum: str = ""

    def labels_at(self, epoch: int) -> list[int]:
        return epoch_labels(self.labels, self.spans, epoch)


@dataclass(slots=True)
class LabelTally:
    """What the sequences hold, per category: observation content tokens and end tokens present, and
    how many of each epoch 0 labels (reported apart, so an end token cannot pass for content); and
    what windowing had to cut or drop."""

    content_tokens: Counter = field(default_factory=Counter)
    content_labels: Counter = field(default_factory=Counter)
    end_tokens: Counter = field(default_factory=Counter)
    end_labels: Counter = field(default_factory=Counter)
    keep_ratios: dict[str, float] = field(default_factory=dict)
    truncated_observations: int = 0
    observation_tokens_cut: int = 0
    dropped_turns: int = 0
    unlabelled_windows: int = 0
    truncated_system_prompts: int = 0

    def merge(self, other: "LabelTally") -> None:
        self.content_tokens.update(other.content_tokens)
        self.content_labels.update(other.content_labels)
        self.end_tokens.update(other.end_tokens)
        self.end_labels.update(other.end_labels)
        self.keep_ratios.update(other.keep_ratios)
        self.truncated_observations += other.truncated_observations
        self.observation_tokens_cut += other.observation_tokens_cut
        self.dropped_turns += other.dropped_turns
        self.unlabelled_windows += other.unlabelled_windows
        self.truncated_system_prompts += other.truncated_system_prompts

    def content_fractions(self) -> dict[str, float]:
        return {c: self.content_labels[c] / n for c, n in sorted(self.content_tokens.items()) if n}

    def end_fractions(self) -> dict[str, float]:
        return {c: self.end_labels[c] / n for c, n in sorted(self.end_tokens.items()) if n}


def turn_seed(seed: int, trajectory_id: str, turn_index: int) -> int:
    key = f"{seed}\x1f{trajectory_id}\x1f{turn_index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def observation_label_choice(n_positions: int, keep_ratio: float, seed: int, epoch: int = 0) -> np.ndarray:
    """Which of an observation's positions (content, then its end token) are labels in this epoch:
    round(k x n) of them, stochastically rounded, uniformly chosen, so each one with probability k."""
    rng = np.random.default_rng([seed, epoch])
    expected = keep_ratio * n_positions
    count = int(expected) + int(rng.random() < expected - int(expected))
    return np.sort(rng.choice(n_positions, size=min(count, n_positions), replace=False))


def epoch_labels(labels: Sequence[int], spans: Sequence[MaskSpan], epoch: int) -> list[int]:
    """`labels` with each span thinned to the positions `observation_label_choice` draws for `epoch`."""
    if not spans:
        return list(labels)
    thinned = np.array(labels, dtype=np.int64)
    for span in spans:
        chosen = span.start + observation_label_choice(span.end - span.start, span.keep_ratio, span.seed, epoch)
        kept = thinned[chosen]
        thinned[span.start : span.end] = IGNORE_INDEX
        thinned[chosen] = kept
    return thinned.tolist()


@dataclass(slots=True)
class TurnBlock:
    """One turn's ids: user header, action, end, assistant header, observation, end; its observation
    positions labelled (all, or none for a keep ratio of 0), to be thinned to `keep_ratio` per epoch."""

    turn: ScoredTurn
    ids: list[int]
    labels: list[int]
    observation_start: int
    observation_end: int  # index of the <|im_end|> closing the observation
    keep_ratio: float
    seed: int

    @property
    def positions_end(self) -> int:
        """End of the observation's positions present (a cut observation has lost its tail and end)."""
        return min(len(self.ids), self.observation_end + 1)

    def mask_span(self, offset: int, head: int = 0) -> MaskSpan | None:
        """The span each epoch thins, for the block placed at `offset` of its window: the observation's
        positions after its first `head` (the outcome head, always labelled); None if the labels are fixed
        (keep ratio 0: none; 1: all; or an observation no longer than its head)."""
        start = self.observation_start + head
        if not 0 < self.keep_ratio < 1 or start >= self.positions_end:
            return None
        return MaskSpan(offset + start, offset + self.positions_end, self.keep_ratio, self.seed)


class SequenceBuilder:
    def __init__(self, tokenizer, max_length: int, seed: int, outcome_head: int = 0):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.seed = seed
        # Positions at the start of a thinned observation that are always labels (the module's docstring).
        self.outcome_head = outcome_head
        vocab = tokenizer.get_vocab()
        missing = [t for t in (IM_START, IM_END) if t not in vocab]
        if missing:
            raise ValueError(f"tokenizer has no {' / '.join(missing)} token; CPT sequences are ChatML")
        self.im_start, self.im_end = vocab[IM_START], vocab[IM_END]
        self.eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else self.im_end
        self.headers = {
            role: [self.im_start] + self.encode([f"{role}\n"])[0] for role in ("system", "user", "assistant")
        }
        self.footer = [self.im_end] + self.encode(["\n"])[0]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        # verbose=False: a long document is chunked afterwards, so the model_max_length warning is noise.
        encoded = self.tokenizer(list(texts), add_special_tokens=False, split_special_tokens=True, verbose=False)
        return encoded["input_ids"]

    def turn_block(
        self, trajectory_id: str, turn: ScoredTurn, action: list[int], observation: list[int], full_labels: bool
    ) -> TurnBlock:
        user = self.headers["user"] + action + self.footer
        assistant_header = self.headers["assistant"]
        ids = user + assistant_header + observation + self.footer
        start = len(user) + len(assistant_header)
        end = start + len(observation)
        keep_ratio = 1.0 if full_labels else turn.keep_ratio
        labels = [IGNORE_INDEX] * len(ids)
        if keep_ratio > 0:
            labels[start : end + 1] = ids[start : end + 1]
        return TurnBlock(
            turn, ids, labels, start, end, keep_ratio, turn_seed(self.seed, trajectory_id, turn.turn_index)
        )

    def _cut(self, block: TurnBlock, room: int, tally: LabelTally) -> TurnBlock | None:
        """A turn too long for any window: keep what fits if that includes an observation token."""
        if room <= block.observation_start:
            tally.dropped_turns += 1
            return None
        if room <= block.observation_end:
            tally.truncated_observations += 1
            tally.observation_tokens_cut += block.observation_end + 1 - room
        return TurnBlock(
            block.turn,
            block.ids[:room],
            block.labels[:room],
            block.observation_start,
            block.observation_end,
            block.keep_ratio,
            block.seed,
        )

    def trajectory_sequences(
        self, trajectory_id: str, system_prompt: str, turns: Sequence[ScoredTurn], full_labels: bool = False
    ) -> tuple[list[TokenSequence], LabelTally]:
        """The windows of one trajectory. `full_labels` labels every observation token (keep ratio 1),
        which is how held-out cross-entropy is measured."""
        tally = LabelTally()
        encoded = self.encode([system_prompt] + [t.action for t in turns] + [t.observation for t in turns])
        room_for_prompt = int(self.max_length * SYSTEM_SHARE) - len(self.headers["system"]) - len(self.footer)
        if len(encoded[0]) > room_for_prompt:
            tally.truncated_system_prompts += 1
        system = self.headers["system"] + encoded[0][:room_for_prompt] + self.footer
        actions, observations = encoded[1 : 1 + len(turns)], encoded[1 + len(turns) :]
        room = self.max_length - len(system)

        windows: list[list[TurnBlock]] = []
        current: list[TurnBlock] = []
        used = 0
        for turn, action, observation in zip(turns, actions, observations):
            block = self.turn_block(trajectory_id, turn, action, observation, full_labels)
            if len(block.ids) > room:
                if current:
                    windows.append(current)
                current, used = [], 0
                cut = self._cut(block, room, tally)
                if cut is not None:
                    windows.append([cut])
                continue
            if used + len(block.ids) > room:
                windows.append(current)
                current, used = [], 0
            current.append(block)
            used += len(block.ids)
        if current:
            windows.append(current)

        sequences = []
        for blocks in windows:
            ids, labels, spans, offsets = list(system), [IGNORE_INDEX] * len(system), [], []
            for block in blocks:
                offsets.append(len(ids))
                if (span := block.mask_span(len(ids), self.outcome_head)) is not None:
                    spans.append(span)
                ids += block.ids
                labels += block.labels
            if all(label == IGNORE_INDEX for label in labels):
                tally.unlabelled_windows += 1
                continue
            turn_indices = [b.turn.turn_index for b in blocks]
            sequence = TokenSequence(ids, labels, trajectory_id, turn_indices=turn_indices, spans=spans)
            _count_labels(tally, blocks, offsets, sequence.labels_at(0))
            sequences.append(sequence)
        return sequences, tally

    def document_sequences(self, source: str, text: str) -> list[TokenSequence]:
        """A world-knowledge document: every token labelled (the first of a chunk has no context to be
        predicted from, so it is not counted), ending with end-of-sequence, chunked to `max_length`."""
        ids = self.encode([text])[0] + [self.eos]
        sequences = []
        for begin in range(0, len(ids), self.max_length):
            chunk = ids[begin : begin + self.max_length]
            if len(chunk) < 2:
                continue
            sequences.append(TokenSequence(chunk, [IGNORE_INDEX] + chunk[1:], source, "world_knowledge"))
        return sequences


def _count_labels(
    tally: LabelTally, blocks: Sequence[TurnBlock], offsets: Sequence[int], labels: Sequence[int]
) -> None:
    """Content and end tokens of each observation in a window, and how many of each `labels` holds."""
    for block, offset in zip(blocks, offsets):
        category = block.turn.category
        tally.keep_ratios[category] = block.keep_ratio
        start, end = offset + block.observation_start, offset + block.observation_end
        content_end = min(offset + len(block.ids), end)
        tally.content_tokens[category] += content_end - start
        tally.content_labels[category] += sum(1 for label in labels[start:content_end] if label != IGNORE_INDEX)
        if block.positions_end > block.observation_end:
            tally.end_tokens[category] += 1
            tally.end_labels[category] += labels[end] != IGNORE_INDEX


def sequence_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("input_ids", pa.list_(pa.int32())),
            ("labels", pa.list_(pa.int32())),
            ("mask_start", pa.list_(pa.int32())),
            ("mask_end", pa.list_(pa.int32())),
            ("mask_keep", pa.list_(pa.float64())),
            ("mask_seed", pa.list_(pa.uint64())),
            ("source", pa.string()),
            ("kind", pa.string()),
            ("turn_indices", pa.list_(pa.int32())),
            ("stratum", pa.string()),
        ]
    )


class SequenceWriter:
    """Appends sequences to a Parquet file a row group at a time, so a pool of any size is written in
    bounded memory; the file appears under its name only when closed without error.

    Columns: `input_ids`; `labels`, every label any epoch may use; `mask_start`, `mask_end`,
    `mask_keep`, `mask_seed`, one entry per `MaskSpan` (empty lists where the labels are fixed:
    held-out windows, world knowledge, SFT); `source`, `kind`, `turn_indices` for inspection; `stratum`, what
    the row order balances (pipeline/training/row_order.py)."""

    def __init__(self, path: Path, rows_per_group: int = 1024):
        import pyarrow.parquet as pq

        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.rows_per_group = rows_per_group
        self.schema = sequence_schema()
        self.writer = pq.ParquetWriter(self.partial, self.schema)
        self.pending: list[TokenSequence] = []

    def write(self, sequence: TokenSequence) -> None:
        self.pending.append(sequence)
        if len(self.pending) >= self.rows_per_group:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self.pending:
            return
        columns = {
            "input_ids": [s.input_ids for s in self.pending],
            "labels": [s.labels for s in self.pending],
            "mask_start": [[span.start for span in s.spans] for s in self.pending],
            "mask_end": [[span.end for span in s.spans] for s in self.pending],
            "mask_keep": [[span.keep_ratio for span in s.spans] for s in self.pending],
            "mask_seed": [[span.seed for span in s.spans] for s in self.pending],
            "source": [s.source for s in self.pending],
            "kind": [s.kind for s in self.pending],
            "turn_indices": [s.turn_indices for s in self.pending],
            "stratum": [s.stratum for s in self.pending],
        }
        self.writer.write_table(pa.table(columns, schema=self.schema))
        self.pending = []

    def __enter__(self) -> "SequenceWriter":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self._flush()
        self.writer.close()
        if kind is None:
            self.partial.rename(self.path)
        else:
            self.partial.unlink(missing_ok=True)


def read_sequences(path: Path, batch_rows: int = 1024):
    """The sequences a `SequenceWriter` wrote, in order, as `TokenSequence`s, a row group at a time."""
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
        for row in batch.to_pylist():
            masks = (row[column] for column in ParquetSequences.MASK_COLUMNS)
            spans = [MaskSpan(*fields) for fields in zip(*masks, strict=True)]
            yield TokenSequence(
                row["input_ids"],
                row["labels"],
                row["source"],
                row["kind"],
                row["turn_indices"],
                spans,
                row.get("stratum") or "",
            )


class ParquetSequences:
    """A map-style dataset over sequences Parquet files: rows as {input_ids, labels} lists, the labels
    those of the current epoch (`set_epoch`, called by the trainer before each epoch; 0 until then).

    `lengths()` gives every row's token count without reading the rows, for length-aware batching."""

    MASK_COLUMNS = ("mask_start", "mask_end", "mask_keep", "mask_seed")

    def __init__(self, paths: Sequence[Path]):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.paths = list(paths)
        columns = ["input_ids", "labels", *self.MASK_COLUMNS]
        tables = [pq.read_table(p, columns=columns, memory_map=True) for p in paths]
        self.table = pa.concat_tables(tables) if tables else sequence_schema().empty_table().select(columns)
        self.epoch = 0

    def __len__(self) -> int:
        return self.table.num_rows

    def lengths(self) -> np.ndarray:
        import pyarrow.compute as pc

        return pc.list_value_length(self.table.column("input_ids")).to_numpy().astype(np.int64)

    def strata(self) -> list[str]:
        """Every row's stratum ("" for files written before the column existed)."""
        import pyarrow.parquet as pq

        strata: list[str] = []
        for path in self.paths:
            if "stratum" in pq.read_schema(path).names:
                strata += [value or "" for value in pq.read_table(path, columns=["stratum"]).column(0).to_pylist()]
            else:
                strata += [""] * pq.read_metadata(path).num_rows
        return strata

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def spans(self, index: int) -> list[MaskSpan]:
        starts, ends, keeps, seeds = (self.table.column(c)[index].as_py() for c in self.MASK_COLUMNS)
        return [MaskSpan(*fields) for fields in zip(starts, ends, keeps, seeds)]

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        labels = self.table.column("labels")[index].as_py()
        return {
            "input_ids": self.table.column("input_ids")[index].as_py(),
            "labels": epoch_labels(labels, self.spans(index), self.epoch),
        }


class PadCollator:
    """Right-pads a batch: pad id in `input_ids`, -100 in `labels`, 0 in `attention_mask`."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict[str, list[int]]]):
        import torch

        width = max(len(f["input_ids"]) for f in features)
        input_ids = torch.full((len(features), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(features), width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(features), width), dtype=torch.long)
        for row, feature in enumerate(features):
            n = len(feature["input_ids"])
            input_ids[row, :n] = torch.tensor(feature["input_ids"])
            labels[row, :n] = torch.tensor(feature["labels"])
            attention_mask[row, :n] = 1
        return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
