"""Packed rows train exactly what the sequences one by one would: rows, labels, loss, gradients, a whole step (issue 9)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.training import segment_attention
from pipeline.training.packing import PackedCollator, PackedSequences, pack_rows
from pipeline.training.sequences import IGNORE_INDEX
from pipeline.training.token_loss import install_token_loss
from tests import cpu_flash_attention
from tests.cpu_flash_attention import use_flash_attention

VOCAB = 97


class ListSequences:
    """The sequence-dataset contract (`__getitem__`, `lengths`, `set_epoch`) over lists in memory."""

    def __init__(self, sequences):
        self.sequences = sequences
        self.epochs = []

    def __len__(self):
        return len(self.sequences)

    def __getitem__(self, index):
        return self.sequences[index]

    def lengths(self):
        return [len(s["input_ids"]) for s in self.sequences]

    def set_epoch(self, epoch):
        self.epochs.append(epoch)


def random_sequences(lengths, keep=0.5, seed=0):
    """Token sequences with keep-ratio-like labels: a random subset of positions, -100 elsewhere."""
    rng = np.random.default_rng(seed)
    sequences = []
    for n in lengths:
        ids = rng.integers(0, VOCAB, n).tolist()
        labels = [t if rng.random() < keep else IGNORE_INDEX for t in ids]
        labels[-1] = ids[-1]  # at least one label the sequence can be scored on
        sequences.append({"input_ids": ids, "labels": labels})
    return sequences


def tiny_model(attention="sdpa", seed=0):
    """flash_attention_2 needs tests/cpu_flash_attention.py's kernels installed (`flash_kernels`)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    flash = attention == "flash_attention_2"
    if attention == segment_attention.NAME:
        segment_attention.register()
    config._attn_implementation = "sdpa" if flash else attention
    model = Qwen3ForCausalLM(config)
    return use_flash_attention(model) if flash else model


@pytest.fixture
def flash_kernels(monkeypatch):
    return cpu_flash_attention.install(monkeypatch)


@pytest.mark.parametrize(
    "lengths, capacity, rows",
    [
        ([7, 3, 6, 4, 5, 5], 10, 3),  # three exact pairs
        ([10, 10, 10], 10, 3),  # full rows
        ([1] * 25, 10, 3),  # many short ones fill rows
        ([9, 8, 2, 1], 10, 2),  # best fit: 9+1, 8+2
        ([], 10, 0),
    ],
)
def test_rows_hold_every_sequence_once_within_capacity(lengths, capacity, rows):
    packed = pack_rows(lengths, capacity, seed=0)
    assert len(packed) == rows
    assert sorted(i for row in packed for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= capacity for row in packed)
    assert packed == pack_rows(lengths, capacity, seed=0)  # seeded


def test_a_sequence_longer_than_a_row_is_an_error():
    with pytest.raises(ValueError, match="12 tokens does not fit in a row of 10"):
        pack_rows([3, 12], 10, seed=0)


def test_a_packed_row_is_its_sequences_end_to_end_with_labels_unchanged():
    sequences = random_sequences([5, 9, 3, 12, 7, 4], keep=0.3)
    source = ListSequences(sequences)
    dataset = PackedSequences(source, max_length=16, seed=1)
    seen = []
    for r in range(len(dataset)):
        row = dataset[r]
        offset = 0
        for i in dataset.rows[r]:
            n = len(sequences[i]["input_ids"])
            part = slice(offset, offset + n)
            # Same tokens, same keep-ratio labels, positions from 0, shifted labels inside the sequence only.
            assert row["input_ids"][part] == sequences[i]["input_ids"]
            assert row["labels"][part] == sequences[i]["labels"]
            assert row["position_ids"][part] == list(range(n))
            assert row["shift_labels"][part] == sequences[i]["labels"][1:] + [IGNORE_INDEX]
            offset += n
            seen.append(i)
        assert offset == len(row["input_ids"]) <= 16
    assert sorted(seen) == list(range(len(sequences)))
    dataset.set_epoch(3)
    assert source.epochs == [3]


def test_the_collator_pads_rows_to_full_width_as_an_isolated_unlabelled_tail():
    batch = PackedCollator(pad_token_id=0, width=8)(
        [{"input_ids": [5, 6, 7], "labels": [5, 6, 7], "shift_labels": [6, 7, -100], "position_ids": [0, 1, 2]}]
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0, 0, 0, 0, 0]]
    assert batch["shift_labels"].tolist() == [[6, 7, -100] + [-100] * 5]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0]]


def test_a_batch_with_a_row_longer_than_the_width_takes_the_wider_width():
    """SFT's held-out rows (CPT's windows) may be longer than its training rows: each keeps one shape."""
    collate = PackedCollator(pad_token_id=0, width=4, wider=8)
    short = {"input_ids": [5, 6, 7], "labels": [5, 6, 7], "shift_labels": [6, 7, -100], "position_ids": [0, 1, 2]}
    long = {"input_ids": [5] * 6, "labels": [5] * 6, "shift_labels": [5] * 5 + [-100], "position_ids": list(range(6))}
    assert collate([short])["input_ids"].shape == (1, 4)
    batch = collate([short, long])
    assert batch["input_ids"].shape == (2, 8)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 0, 1]]
    with pytest.raises(ValueError, match="longer than the collator's widths"):
        collate([{**long, "input_ids": [5] * 9}])


def packed_row(lengths):
    """A row as PackedSequences makes it, of sequences of these lengths (tokens and labels arbitrary)."""
    ids = [7] * sum(lengths)
    return {
        "input_ids": ids,
        "labels": ids,
        "shift_labels": ids,
        "position_ids": [p for n in lengths for p in range(n)],
    }


@pytest.mark.parametrize(
    "row_lengths, width, offsets, longest",
    [
        ([[3]], 8, [0, 3, 8], 5),  # one sequence and its padding tail, a sequence of its own
        ([[3, 2], [6]], 6, [0, 3, 5, 6, 12], 6),  # two rows: the offsets run on across the row boundary
        ([[4, 4], [2, 1, 5]], 8, [0, 4, 8, 10, 11, 16], 5),  # full rows: no tail
        ([[1], [1]], 4, [0, 1, 4, 5, 8], 3),
    ],
)
def test_the_collator_gives_flash_attention_the_packing_as_offsets_over_the_flattened_batch(
    row_lengths, width, offsets, longest
):
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    batch = PackedCollator(pad_token_id=0, width=width)([packed_row(lengths) for lengths in row_lengths])
    assert batch["cu_seq_lens_q"].tolist() == batch["cu_seq_lens_k"].tolist() == offsets
    assert batch["cu_seq_lens_q"].dtype == torch.int32
    assert batch["max_length_q"] == batch["max_length_k"] == longest and isinstance(batch["max_length_q"], int)
    # What transformers itself derives from the positions of a single flattened row (its one-row packed case).
    (library_offsets, _), (library_longest, _) = prepare_fa_kwargs_from_position_ids(batch["position_ids"])
    assert library_offsets.tolist() == offsets and int(library_longest) == longest


def unpacked_loss(model, sequences):
    """The reference: each sequence alone, transformers' usual shifted cross-entropy, mean over all labels."""
    total, count = 0.0, 0
    for s in sequences:
        logits = model(input_ids=torch.tensor([s["input_ids"]])).logits[0, :-1]
        target = torch.tensor(s["labels"][1:])
        total = total + F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum")
        count += int((target != IGNORE_INDEX).sum())
    return total / count


def packed_batch(sequences, max_length):
    dataset = PackedSequences(ListSequences(sequences), max_length, seed=0)
    return PackedCollator(pad_token_id=0, width=max_length)([dataset[i] for i in range(len(dataset))])


def packed_loss(model, sequences, max_length):
    batch = packed_batch(sequences, max_length)
    outputs = model(**batch)
    return outputs["loss_sum"] / outputs["label_count"], len(batch["input_ids"])


@pytest.mark.parametrize(
    "attention, checkpointing",
    [
        ("sdpa", False),  # transformers' mask over the whole row
        ("simulacra_segments", False),  # the CPU path: each sequence on its own
        ("simulacra_segments", True),
        ("eager", False),
        ("sdpa", True),  # checkpointing recomputes layers
        # transformers' flash-attention path with CPU kernels (tests/cpu_flash_attention.py): the path a GPU
        # host with flash-attn gets, several rows to a micro-batch
        ("flash_attention_2", False),
        ("flash_attention_2", True),
    ],
)
def test_packed_loss_and_gradients_equal_the_sequences_run_alone(request, monkeypatch, attention, checkpointing):
    kernels = request.getfixturevalue("flash_kernels") if attention == "flash_attention_2" else None
    sequences = random_sequences([30, 20, 11, 45, 8, 25, 17], keep=0.5)
    reference = tiny_model(attention)
    expected = unpacked_loss(reference, sequences)
    expected.backward()

    model = tiny_model(attention)
    if checkpointing:
        model.train()
        model.gradient_checkpointing_enable({"use_reentrant": False})
    install_token_loss(model, "chunked")
    if kernels:
        kernels.varlen = kernels.whole_rows = 0
    calls = []
    if attention == segment_attention.NAME:  # every attention call is one sequence's, causal, with no mask
        sdpa = F.scaled_dot_product_attention

        def recorded(query, key, value, attn_mask=None, **kwargs):
            calls.append((query.shape[2], attn_mask is None and kwargs["is_causal"]))
            return sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", recorded)
    loss, rows = packed_loss(model, sequences, max_length=64)
    loss.backward()
    if attention == segment_attention.NAME:
        # The 7 sequences and the rows' padding tails, in each of the 2 layers (twice with recomputation).
        segments = packed_batch(sequences, 64)["cu_seq_lens_q"].diff().tolist()
        assert len(segments) > 7 and all(causal for _, causal in calls)
        assert [length for length, _ in calls] == segments * 2 * (1 + checkpointing)
    assert 1 < rows < len(sequences)  # several sequences did share rows, and a micro-batch held several rows
    if kernels:  # every layer's attention ran on the offsets (twice each with recomputation)
        assert (kernels.varlen, kernels.whole_rows) == (2 * (1 + checkpointing), 0)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_flash_attention_over_several_rows_without_the_offsets_is_refused(flash_kernels):
    """The trap itself: transformers' flash path, given restarting positions but no offsets for a batch of
    several rows, attends causally over each whole row (across sequences). The model call refuses it."""
    sequences = random_sequences([30, 20, 11, 45, 8, 25, 17], keep=0.5)
    model = tiny_model("flash_attention_2")
    dataset = PackedSequences(ListSequences(sequences), 64, seed=0)
    batch = PackedCollator(pad_token_id=0, width=64)([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        isolated = model.model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            use_cache=False,
            cu_seq_lens_q=batch["cu_seq_lens_q"],
            cu_seq_lens_k=batch["cu_seq_lens_k"],
            max_length_q=batch["max_length_q"],
            max_length_k=batch["max_length_k"],
        )
        crossing = model.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    assert flash_kernels.whole_rows == 2  # the second call: plain causal attention, in both layers
    assert not torch.allclose(isolated.last_hidden_state, crossing.last_hidden_state, atol=1e-3)

    install_token_loss(model, "chunked")
    without_offsets = {k: v for k, v in batch.items() if not k.startswith(("cu_seq_lens", "max_length"))}
    with pytest.raises(ValueError, match="needs the offsets PackedCollator adds"):
        model(**without_offsets)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_packed_loss_equals_the_sequences_run_alone_under_flex_attention(monkeypatch):
    """flex attention (the CUDA path without flash-attn): the BlockMask transformers builds from restarting
    positions. Forward only: FlexAttention has no backward on CPU. Uncompiled (compiling flex attention on a
    CPU takes minutes; the mask and the attention are the same ops), torch.compile made the identity for the test."""
    from transformers.integrations import flex_attention

    monkeypatch.setattr(torch, "compile", lambda function=None, **options: function or (lambda f: f))
    monkeypatch.setattr(flex_attention.WrappedFlexAttention, "_instance", None)
    monkeypatch.setattr(flex_attention.WrappedFlexAttention, "_is_flex_compiled", False)
    sequences = random_sequences([30, 20, 11, 45, 8, 25, 17], keep=0.5)
    with torch.no_grad():
        expected = unpacked_loss(tiny_model("flex_attention"), sequences)
        model = tiny_model("flex_attention")
        install_token_loss(model, "chunked")
        loss, rows = packed_loss(model, sequences, max_length=64)
    assert 1 < rows < len(sequences)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_held_out_rows_report_per_row_sums_of_per_token_losses():
    sequences = random_sequences([30, 20, 11], keep=1.0)
    model = tiny_model()
    with torch.no_grad():
        expected = unpacked_loss(model, sequences)
        install_token_loss(model, "chunked")
        dataset = PackedSequences(ListSequences(sequences), 64, seed=0)
        batch = PackedCollator(0, 64)([dataset[i] for i in range(len(dataset))])
        outputs = model(**batch, per_row=True)
    assert outputs["row_label_counts"].sum().item() == sum(len(s["input_ids"]) - 1 for s in sequences)
    per_token = outputs["row_loss_sums"].sum() / outputs["row_label_counts"].sum()
    assert per_token.item() == pytest.approx(expected.item(), rel=1e-5)


def test_a_step_of_two_micro_batches_averages_over_all_its_labelled_tokens(tmp_path):
    """Gradient accumulation with unequal label counts: the step's gradient is that of the mean over every
    labelled token of the step, not the mean of the two micro-batch means (Trainer's num_items_in_batch)."""
    from transformers import TrainerCallback, TrainingArguments

    from pipeline.training.trainer import _packed_trainer_class

    # Two rows of very different label density (keep ratio 0.05 vs 1).
    sequences = random_sequences([60], keep=0.05, seed=1) + random_sequences([60], keep=1.0, seed=2)
    reference = tiny_model()
    unpacked_loss(reference, sequences).backward()
    expected = {name: p.grad.clone() for name, p in reference.named_parameters()}

    class GradientProbe(TrainerCallback):
        grads = None

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            self.grads = {name: p.grad.clone() for name, p in model.named_parameters()}

    model = tiny_model()
    install_token_loss(model, "chunked")
    probe = GradientProbe()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=2,
        max_steps=1,
        max_grad_norm=0,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    rows = PackedSequences(ListSequences(sequences), max_length=64, seed=0)
    assert len(rows) == 2
    trainer = _packed_trainer_class()(
        model=model, args=args, train_dataset=rows, data_collator=PackedCollator(0, 64), callbacks=[probe]
    )
    trainer.train()
    for name, grad in probe.grads.items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)
