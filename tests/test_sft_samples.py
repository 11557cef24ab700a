"""SFT training sequences: loss on the assistant output only (thinking + observation + end token)."""

import pytest

from pipeline.sft.candidates import render_thinking_output
from pipeline.sft.samples import sft_sequence
from pipeline.store.schema import ScoredTurn
from pipeline.training.sequences import IGNORE_INDEX, SequenceBuilder
from pipeline.training.tiny_model import IM_END


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from pipeline.config.model import TinyModelConfig
    from pipeline.training.tiny_model import train_tokenizer

    lines = ["ls -la\ntotal 4 notes.txt <think> </think> reasoning about the shell\n"] * 50
    return train_tokenizer(TinyModelConfig(vocab_size=300), lines)


HISTORY = (
    ScoredTurn(0, "echo hi", "hi", "echo", 0.05),
    ScoredTurn(1, "cat notes.txt", "buy milk <|im_end|>", "retrieval", 1.0),
)
TARGET = render_thinking_output("ls lists the files", "notes.txt\n")


def _labelled_text(tokenizer, sequence):
    ids = [label for label in sequence.labels if label != IGNORE_INDEX]
    return tokenizer.decode(ids)


def test_labels_are_exactly_the_assistant_output_and_its_end(tokenizer):
    builder = SequenceBuilder(tokenizer, 4096, 0)
    built = sft_sequence(builder, "t1", "SYSTEM PROMPT", HISTORY, "ls", TARGET, 2)
    sequence = built.sequence
    assert built.history_dropped == 0 and len(sequence.input_ids) == len(sequence.labels)
    assert _labelled_text(tokenizer, sequence) == TARGET + IM_END
    # Labelled positions are one contiguous span at the end (before the closing newline), and every
    # label equals its input id: the system prompt, history observations, actions and headers are context.
    labelled = [i for i, label in enumerate(sequence.labels) if label != IGNORE_INDEX]
    assert labelled == list(range(labelled[0], labelled[-1] + 1))
    assert all(sequence.labels[i] == sequence.input_ids[i] for i in labelled)
    text = tokenizer.decode(sequence.input_ids)
    assert text.startswith("<|im_start|>system\nSYSTEM PROMPT<|im_end|>\n<|im_start|>user\necho hi<|im_end|>")
    assert text.endswith("<|im_start|>user\nls<|im_end|>\n<|im_start|>assistant\n" + TARGET + "<|im_end|>\n")
    # A literal <|im_end|> in a history observation is text, not the special token: 7 real ones
    # (system, two history turns of two messages, the action, the target).
    assert sequence.input_ids.count(tokenizer.convert_tokens_to_ids(IM_END)) == 7


def _labelled_spans(tokenizer, sequence) -> list[str]:
    """The labelled runs of positions, each decoded: one per assistant answer that is a label."""
    spans: list[list[int]] = []
    previous = None
    for position, label in enumerate(sequence.labels):
        if label == IGNORE_INDEX:
            continue
        if previous != position - 1:
            spans.append([])
        spans[-1].append(label)
        previous = position
    return [tokenizer.decode(span) for span in spans]


def test_direct_samples_label_every_history_observation_as_an_answer(tokenizer):
    """`label_history` (direct SFT): each kept history observation and its end token are labels, as the
    target is; the system prompt, the actions and the role headers stay context. A literal `<|im_end|>`
    inside an observation is a label as text, the real end token after it too."""
    builder = SequenceBuilder(tokenizer, 4096, 0)
    plain = sft_sequence(builder, "t1", "SYSTEM PROMPT", HISTORY, "ls", "notes.txt\n", 2)
    built = sft_sequence(builder, "t1", "SYSTEM PROMPT", HISTORY, "ls", "notes.txt\n", 2, label_history=True)
    sequence = built.sequence
    assert sequence.input_ids == plain.sequence.input_ids  # the same tokens; only the labels differ
    assert _labelled_spans(tokenizer, plain.sequence) == ["notes.txt\n" + IM_END]
    assert _labelled_spans(tokenizer, sequence) == [
        "hi" + IM_END,
        "buy milk <|im_end|>" + IM_END,
        "notes.txt\n" + IM_END,
    ]
    assert all(sequence.labels[i] in (IGNORE_INDEX, sequence.input_ids[i]) for i in range(len(sequence.labels)))
    labels = [sum(1 for label in s.labels if label != IGNORE_INDEX) for s in (plain.sequence, sequence)]
    assert built.history_labels == labels[1] - labels[0] > 0 and plain.history_labels == 0


def test_a_dropped_history_turn_is_neither_context_nor_label(tokenizer):
    full = sft_sequence(SequenceBuilder(tokenizer, 4096, 0), "t1", "S", HISTORY, "ls", "notes.txt\n", 2).sequence
    built = sft_sequence(
        SequenceBuilder(tokenizer, len(full.input_ids) - 3, 0), "t1", "S", HISTORY, "ls", "notes.txt\n", 2, True
    )
    assert built.history_dropped == 1
    assert _labelled_spans(tokenizer, built.sequence) == ["buy milk <|im_end|>" + IM_END, "notes.txt\n" + IM_END]


def test_a_long_sample_drops_its_oldest_history_first(tokenizer):
    full = sft_sequence(SequenceBuilder(tokenizer, 4096, 0), "t1", "S", HISTORY, "ls", TARGET, 2).sequence
    short = len(full.input_ids) - 3
    built = sft_sequence(SequenceBuilder(tokenizer, short, 0), "t1", "S", HISTORY, "ls", TARGET, 2)
    assert built.history_dropped == 1
    assert "echo hi" not in tokenizer.decode(built.sequence.input_ids)
    assert "cat notes.txt" in tokenizer.decode(built.sequence.input_ids)
    assert _labelled_text(tokenizer, built.sequence) == TARGET + IM_END


def test_a_target_that_cannot_fit_is_skipped_not_cut(tokenizer):
    built = sft_sequence(SequenceBuilder(tokenizer, 40, 0), "t1", "S", HISTORY, "ls", TARGET * 5, 2)
    assert built.sequence is None and built.history_dropped == 2


def test_can_fit_asks_of_the_smallest_sample_a_query_can_give(tokenizer):
    from pipeline.sft.samples import can_fit, shortest_prompt

    long_system, short_system = "SYSTEM PROMPT " * 30, "S"
    reference = "notes.txt\n"
    smallest = sft_sequence(
        SequenceBuilder(tokenizer, 4096, 0), "t", short_system, (), "ls", render_thinking_output("", reference), 0
    ).sequence
    exact = len(smallest.input_ids)
    # The shortest template decides, whichever position it has among the ten; history never counts.
    builder = SequenceBuilder(tokenizer, exact, 0)
    assert shortest_prompt(builder, [long_system, short_system]) == short_system
    assert shortest_prompt(builder, [short_system, long_system]) == short_system
    assert can_fit(builder, short_system, "ls", reference)
    assert not can_fit(SequenceBuilder(tokenizer, exact - 1, 0), short_system, "ls", reference)
    assert not can_fit(builder, long_system, "ls", reference)
    # What it passes can still be cut by history and thinking later (counted then), never the reverse:
    # a query it refuses has no sample that fits.
    real = sft_sequence(
        builder, "t", short_system, HISTORY, "ls", render_thinking_output("ls lists the files", reference), 0
    )
    assert real.sequence is None
