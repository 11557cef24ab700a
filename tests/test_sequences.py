"""CPT sequences: keep-ratio label masks, what is never a label, turn-boundary windows, world knowledge.

The windows are checked by parsing the token ids back into ChatML messages (independently of the
builder's own bookkeeping), so a builder that mislabelled a token and its tally alike would fail.
"""

import functools
import random
from collections import Counter

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from pipeline.config.model import TinyModelConfig
from pipeline.config.score import KeepRatios
from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.store.schema import SystemPrompt
from pipeline.training.sequences import (
    IGNORE_INDEX,
    MaskSpan,
    ParquetSequences,
    ScoredTurn,
    SequenceBuilder,
    SequenceWriter,
    TokenSequence,
    observation_label_choice,
)
from pipeline.training.tiny_model import IM_END, IM_START, train_tokenizer
from pipeline.training.world_knowledge import CorpusError, iter_documents, mix_world_knowledge

WORDS = (
    "file directory error permission denied total drwxr root user config server request response status "
    "json value key list process memory disk network port http open close read write true false null"
).split()
KEEP = KeepRatios()
CATEGORIES = ("echo", "boilerplate", "transform", "expansion", "retrieval", "action", "other")


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def synthetic_turns(rng: random.Random, n_turns: int, start: int = 0) -> list[ScoredTurn]:
    turns = []
    for i in range(n_turns):
        category = CATEGORIES[(start + i) % len(CATEGORIES)]
        observation = sentence(rng, rng.choice([1, 3, 20, 60])) + (
            f"\n{rng.randint(0, 999)}" if rng.random() < 0.5 else ""
        )
        turns.append(ScoredTurn(i, f"cat {sentence(rng, rng.randint(1, 4))}", observation, category, KEEP.of(category)))
    return turns


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(1)
    lines = [sentence(rng, 30) + ' ls -la /tmp 0123456789 {"a": [1, 2]}' for _ in range(400)]
    return train_tokenizer(TinyModelConfig(vocab_size=400), lines)


@functools.cache
def _decoded(tokenizer, ids: tuple[int, ...]) -> str:
    """A message header's few tokens, decoded once: the label-rate test parses 7,000 rows of messages whose
    headers are the same three (decoding them afresh was two thirds of its time)."""
    return tokenizer.decode(list(ids))


def parse_messages(ids: list[int], tokenizer) -> list[dict]:
    """ChatML ids -> [{role, start, end, closed}]: [start, end) is the content, `end` the <|im_end|> index
    (or the sequence's end, `closed` False, for a cut observation)."""
    vocab = tokenizer.get_vocab()
    im_start, im_end = vocab[IM_START], vocab[IM_END]
    starts = [i for i, t in enumerate(ids) if t == im_start]
    messages = []
    for n, p in enumerate(starts):
        limit = starts[n + 1] if n + 1 < len(starts) else len(ids)
        q = next((i for i in range(p + 1, limit) if ids[i] == im_end), limit)
        header = next(h for h in range(1, q - p) if _decoded(tokenizer, tuple(ids[p + 1 : p + 1 + h])).endswith("\n"))
        role = _decoded(tokenizer, tuple(ids[p + 1 : p + 1 + header])).strip()
        messages.append({"role": role, "start": p + 1 + header, "end": q, "closed": q < limit})
    return messages


def test_piecewise_ids_render_exactly_the_chat_template(tokenizer):
    builder = SequenceBuilder(tokenizer, max_length=4096, seed=0)
    turns = [
        ScoredTurn(0, "ls", " total 0\n", "other", 1.0),
        ScoredTurn(1, "echo <|im_end|> hi", "<|im_end|> hi", "echo", 0.05),
    ]
    [sequence], _ = builder.trajectory_sequences("t", "You simulate a terminal.", turns)
    messages = [{"role": "system", "content": "You simulate a terminal."}]
    for turn in turns:
        messages += [{"role": "user", "content": turn.action}, {"role": "assistant", "content": turn.observation}]
    assert tokenizer.decode(sequence.input_ids) == tokenizer.apply_chat_template(messages, tokenize=False)
    # Literal "<|im_end|>" in data is text, not a turn boundary: one real end token per message.
    assert sequence.input_ids.count(tokenizer.get_vocab()[IM_END]) == 5


@pytest.mark.parametrize(("words", "turns_per_category"), [((1, 3), 700), ((40, 80), 40)], ids=["short", "long"])
def test_content_and_end_label_rates_per_category_equal_its_keep_ratio(tokenizer, tmp_path, words, turns_per_category):
    """Over many turns and epochs (each a fresh draw), content tokens and end tokens are each labelled at
    the category's keep ratio, however short the observation (issue 13: k x (n+1) labels of which one was
    always the end token left 10-token echoes with no content label at all)."""
    rng = random.Random(7)
    builder = SequenceBuilder(tokenizer, max_length=4096, seed=3)
    path = tmp_path / "train.parquet"
    turns_by_trajectory = {}
    with SequenceWriter(path) as writer:
        for t in range(turns_per_category):
            turns = [
                ScoredTurn(i, "cat notes", sentence(rng, rng.randint(*words)), category, KEEP.of(category))
                for i, category in enumerate(CATEGORIES)
            ]
            turns_by_trajectory[f"traj-{t}"] = turns
            for window in builder.trajectory_sequences(f"traj-{t}", "You simulate a terminal.", turns)[0]:
                writer.write(window)
    dataset = ParquetSequences([path])
    windows = pq.read_table(path, columns=["source", "turn_indices"]).to_pylist()
    tokens, labels = {"content": Counter(), "end": Counter()}, {"content": Counter(), "end": Counter()}
    for epoch in range(10):
        dataset.set_epoch(epoch)
        for index, window in enumerate(windows):
            row = dataset[index]
            assistants = [m for m in parse_messages(row["input_ids"], tokenizer) if m["role"] == "assistant"]
            for message, turn_index in zip(assistants, window["turn_indices"], strict=True):
                category = turns_by_trajectory[window["source"]][turn_index].category
                content = range(message["start"], message["end"])
                tokens["content"][category] += len(content)
                labels["content"][category] += sum(1 for i in content if row["labels"][i] != IGNORE_INDEX)
                tokens["end"][category] += 1
                labels["end"][category] += row["labels"][message["end"]] != IGNORE_INDEX
    for category in CATEGORIES:
        assert tokens["content"][category] >= 10_000, category
        content_rate = labels["content"][category] / tokens["content"][category]
        end_rate = labels["end"][category] / tokens["end"][category]
        assert abs(content_rate - KEEP.of(category)) <= 0.01, (category, "content", content_rate)
        # Fewer end tokens than content tokens: within 4 standard deviations of a binomial draw.
        k, n = KEEP.of(category), tokens["end"][category]
        assert abs(end_rate - k) <= 4 * (k * (1 - k) / n) ** 0.5, (category, "end", end_rate)


def test_no_system_action_or_header_token_is_ever_a_label_and_masked_tokens_stay(tokenizer):
    rng = random.Random(11)
    builder = SequenceBuilder(tokenizer, max_length=300, seed=0)
    masked_seen = 0
    for t in range(40):
        turns = synthetic_turns(rng, 10, start=t)
        windows, _ = builder.trajectory_sequences(f"traj-{t}", "System prompt with words file error.", turns)
        for window in windows:
            messages = parse_messages(window.input_ids, tokenizer)
            allowed = set()
            for message in messages:
                if message["role"] == "assistant":
                    allowed.update(range(message["start"], message["end"] + 1))
            labelled = {i for i, label in enumerate(window.labels_at(t)) if label != IGNORE_INDEX}
            assert labelled <= allowed
            assert all(window.labels[i] == window.input_ids[i] for i in labelled)
            # Every observation is whole in input_ids, labelled or not.
            assistants = [m for m in messages if m["role"] == "assistant"]
            for message, turn_index in zip(assistants, window.turn_indices, strict=True):
                content = window.input_ids[message["start"] : message["end"]]
                assert tokenizer.decode(content) == turns[turn_index].observation
                masked_seen += sum(1 for i in range(message["start"], message["end"]) if i not in labelled)
    assert masked_seen > 1000


def test_windows_start_with_the_system_prompt_and_cover_each_observation_once(tokenizer):
    rng = random.Random(5)
    builder = SequenceBuilder(tokenizer, max_length=200, seed=0)
    prompt = "You simulate the environment of the terminal domain."
    turns = [ScoredTurn(t.turn_index, t.action, t.observation, "other", 1.0) for t in synthetic_turns(rng, 30)]
    windows, tally = builder.trajectory_sequences("long", prompt, turns)
    assert len(windows) > 3
    assert [i for w in windows for i in w.turn_indices] == list(range(len(turns)))
    assert (tally.dropped_turns, tally.truncated_observations) == (0, 0)
    for window in windows:
        assert len(window.input_ids) <= 200
        messages = parse_messages(window.input_ids, tokenizer)
        assert messages[0]["role"] == "system" and messages[0]["start"] > 0
        assert tokenizer.decode(window.input_ids[messages[0]["start"] : messages[0]["end"]]) == prompt
        assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * len(window.turn_indices)
        for user, turn_index in zip(messages[1::2], window.turn_indices):
            assert tokenizer.decode(window.input_ids[user["start"] : user["end"]]) == turns[turn_index].action


def test_a_window_without_any_label_is_left_out_and_counted(tokenizer):
    turns = [ScoredTurn(i, "echo hi", "hi", "echo", 0.0) for i in range(3)]
    windows, tally = SequenceBuilder(tokenizer, 4096, 0).trajectory_sequences("t", "Sys.", turns)
    assert (windows, tally.unlabelled_windows) == ([], 1)


@pytest.mark.parametrize(
    ("action_words", "observation_words", "expected"),
    [
        (2, 10, "whole"),
        (2, 400, "truncated"),  # the observation's head fits after the action: keep it, cut the tail
        (400, 5, "dropped"),  # not one observation token fits after the action: drop, counted
    ],
)
def test_a_turn_longer_than_a_window(tokenizer, action_words, observation_words, expected):
    rng = random.Random(2)
    builder = SequenceBuilder(tokenizer, max_length=128, seed=0)
    turn = ScoredTurn(0, sentence(rng, action_words), sentence(rng, observation_words), "other", 1.0)
    after = ScoredTurn(1, "pwd", "/root", "other", 1.0)
    windows, tally = builder.trajectory_sequences("t", "Terminal.", [turn, after])
    assert all(len(w.input_ids) <= 128 for w in windows)
    assert windows[-1].turn_indices[-1] == 1
    if expected == "whole":
        assert [w.turn_indices for w in windows] == [[0, 1]]
        assert (tally.truncated_observations, tally.dropped_turns) == (0, 0)
    elif expected == "truncated":
        assert (tally.truncated_observations, tally.dropped_turns) == (1, 0)
        assert [w.turn_indices for w in windows] == [[0], [1]] and len(windows[0].input_ids) == 128
        # A cut observation never teaches the model to stop early: no end-of-turn label in its window.
        assert tokenizer.get_vocab()[IM_END] not in windows[0].labels
        assert tally.observation_tokens_cut > 0
    else:
        assert (tally.truncated_observations, tally.dropped_turns) == (0, 1)
        assert [w.turn_indices for w in windows] == [[1]]


def test_a_system_prompt_longer_than_half_a_window_keeps_its_head(tokenizer):
    prompt = "Tools: " + sentence(random.Random(8), 300)
    turns = [ScoredTurn(i, "ls", "file", "other", 1.0) for i in range(3)]
    windows, tally = SequenceBuilder(tokenizer, 128, 0).trajectory_sequences("t", prompt, turns)
    assert tally.truncated_system_prompts == 1 and tally.dropped_turns == 0
    assert [i for w in windows for i in w.turn_indices] == [0, 1, 2]
    system = parse_messages(windows[0].input_ids, tokenizer)[0]
    assert system["end"] + 1 <= 64
    assert prompt.startswith(tokenizer.decode(windows[0].input_ids[system["start"] : system["end"]]))


def test_masks_are_seeded_per_turn_and_independent_of_windowing(tokenizer):
    turns = synthetic_turns(random.Random(9), 14)

    def labels_by_turn(max_length: int, seed: int, epoch: int = 0) -> dict[int, list[int]]:
        windows, _ = SequenceBuilder(tokenizer, max_length, seed).trajectory_sequences("same-id", "Sys.", turns)
        found = {}
        for window in windows:
            labels = window.labels_at(epoch)
            assistants = [m for m in parse_messages(window.input_ids, tokenizer) if m["role"] == "assistant"]
            for message, turn_index in zip(assistants, window.turn_indices):
                found[turn_index] = labels[message["start"] : message["end"] + 1]
        return found

    one_window, many_windows = labels_by_turn(8192, seed=4), labels_by_turn(160, seed=4)
    assert len(many_windows) > 5
    assert all(one_window[i] == many_windows[i] for i in many_windows)
    assert one_window == labels_by_turn(8192, seed=4)
    assert one_window != labels_by_turn(8192, seed=5)
    # Another epoch, another draw; the same epoch, the same draw.
    assert one_window != labels_by_turn(8192, seed=4, epoch=1)
    assert labels_by_turn(8192, seed=4, epoch=1) == labels_by_turn(160, seed=4, epoch=1)


@pytest.mark.parametrize(
    ("n_positions", "keep_ratio", "expected"),
    [
        (100, 1.0, 100),  # keep everything, the end token included
        (100, 0.0, 0),  # keep nothing, not even the end token
        (100, 0.5, 50),
        (10, 0.1, 1),  # 0.1 x 10 positions = 1, any of them: content or end
    ],
)
def test_observation_label_choice_counts(n_positions, keep_ratio, expected):
    chosen = observation_label_choice(n_positions, keep_ratio, seed=123)
    assert len(chosen) == expected
    assert len(set(chosen.tolist())) == len(chosen) and all(0 <= i < n_positions for i in chosen)


@pytest.mark.parametrize(("n_positions", "keep_ratio"), [(2, 0.05), (4, 0.1), (11, 0.05), (7, 0.5), (60, 0.1)])
def test_every_position_end_token_included_is_labelled_with_probability_k(n_positions, keep_ratio):
    # Issue 13: the end token (the last position) used to take one of the k x (n+1) labels every time.
    trials = 20_000
    hits = np.zeros(n_positions)
    for seed in range(trials // 2):
        for epoch in (0, 1):
            hits[observation_label_choice(n_positions, keep_ratio, seed, epoch)] += 1
    rates = hits / trials
    assert np.all(np.abs(rates - keep_ratio) <= 0.012), rates


def test_over_epochs_every_token_of_an_echo_is_labelled(tokenizer, tmp_path):
    turns = [ScoredTurn(0, "echo deploy build test", "deploy build test release fix merge", "echo", 0.05)]
    [window], _ = SequenceBuilder(tokenizer, 4096, 0).trajectory_sequences("t", "Sys.", turns)
    [message] = [m for m in parse_messages(window.input_ids, tokenizer) if m["role"] == "assistant"]
    observation = set(range(message["start"], message["end"] + 1))
    with SequenceWriter(tmp_path / "train.parquet") as writer:
        writer.write(window)
    dataset = ParquetSequences([tmp_path / "train.parquet"])
    seen, per_epoch = set(), []
    for epoch in range(300):
        dataset.set_epoch(epoch)
        labelled = {i for i, label in enumerate(dataset[0]["labels"]) if label != IGNORE_INDEX}
        assert labelled <= observation
        per_epoch.append(len(labelled))
        seen |= labelled
    assert seen == observation
    assert np.mean(per_epoch) == pytest.approx(0.05 * len(observation), rel=0.25)
    # A one-epoch run is reproducible: a new reader of the same file draws epoch 0 the same way.
    again = ParquetSequences([tmp_path / "train.parquet"])
    dataset.set_epoch(0)
    assert again[0] == dataset[0] == {"input_ids": window.input_ids, "labels": window.labels_at(0)}


def test_the_outcome_head_is_labelled_every_epoch_and_the_rest_at_the_keep_ratio(tokenizer, tmp_path):
    """`cpt.outcome_head_tokens`: an observation's first h positions are labels whatever its ratio (they say
    which outcome the action had); the positions after them are thinned at the ratio as before. An observation
    no longer than its head is labelled whole; keep ratios 0 and 1 are untouched."""
    rng = random.Random(5)
    head = 4
    builder = SequenceBuilder(tokenizer, 4096, seed=0, outcome_head=head)
    turns = [ScoredTurn(i, "put apple in/on fridge", sentence(rng, 30), "echo", 0.05) for i in range(40)]
    turns += [
        ScoredTurn(40, "put key in/on desk", "ok", "echo", 0.05),  # shorter than the head, end token included
        ScoredTurn(41, "ls", sentence(rng, 10), "action", 1.0),
        ScoredTurn(42, "echo x", sentence(rng, 10), "echo", 0.0),
    ]
    with SequenceWriter(tmp_path / "train.parquet") as writer:
        windows, tally = builder.trajectory_sequences("t", "Sys.", turns)
        for window in windows:
            writer.write(window)
    dataset = ParquetSequences([tmp_path / "train.parquet"])
    heads = rest = rest_labelled = 0
    for epoch in range(20):
        dataset.set_epoch(epoch)
        for index in range(len(dataset)):
            row = dataset[index]
            assistants = [m for m in parse_messages(row["input_ids"], tokenizer) if m["role"] == "assistant"]
            for message, turn_index in zip(assistants, windows[index].turn_indices, strict=True):
                positions = range(message["start"], message["end"] + 1)
                labelled = [row["labels"][i] != IGNORE_INDEX for i in positions]
                if turn_index == 42:
                    assert not any(labelled)
                elif turn_index in (40, 41):
                    assert all(labelled), turn_index
                else:
                    assert all(labelled[:head]), (epoch, turn_index)
                    heads += head
                    rest += len(labelled) - head
                    rest_labelled += sum(labelled[head:])
    assert heads and rest > 5 * heads
    k, n = 0.05, rest
    assert abs(rest_labelled / n - k) <= 4 * (k * (1 - k) / n) ** 0.5
    # The tally reports what epoch 0 labels, the heads included: more than the ratio alone would give.
    assert tally.content_fractions()["echo"] > 0.05 + 0.5 * head / 30


def test_eval_sequences_label_every_observation_token(tokenizer):
    turns = synthetic_turns(random.Random(3), 8)
    windows, tally = SequenceBuilder(tokenizer, 4096, 0).trajectory_sequences("e", "Sys.", turns, full_labels=True)
    assert all(fraction == 1.0 for fraction in tally.content_fractions().values())
    assert all(fraction == 1.0 for fraction in tally.end_fractions().values())
    [window] = windows
    assert window.spans == []
    for message in parse_messages(window.input_ids, tokenizer):
        labelled = [window.labels[i] != IGNORE_INDEX for i in range(message["start"], message["end"] + 1)]
        assert all(labelled) if message["role"] == "assistant" else not any(labelled)


@pytest.mark.parametrize(
    ("system", "present", "absent"),
    [
        (
            SystemPrompt(task_description="Fix the bug."),
            ["Fix the bug."],
            ["# Action space", "# Initial state", "# Demonstrations"],
        ),
        (
            SystemPrompt(
                task_description="Book a flight.",
                tools=[{"type": "function", "function": {"name": "book", "parameters": {}}}],
                initial_state="user id 42",
                demonstrations="> search\nresults",
                simulation_instructions="Inject an intermittent API error.",
            ),
            [
                "# Action space",
                '"name": "book"',
                "# Initial state\nuser id 42",
                "# Demonstrations",
                "# Simulation instructions",
            ],
            [],
        ),
    ],
)
def test_cpt_system_prompt_holds_the_parts_a_trajectory_has(system, present, absent):
    prompt = render_cpt_system_prompt("terminal", system)
    assert prompt.startswith("# Task\nYou simulate the environment of the terminal domain")
    assert all(text in prompt for text in present)
    assert not any(text in prompt for text in absent)


def test_world_knowledge_documents_are_fully_labelled_chunks(tokenizer):
    builder = SequenceBuilder(tokenizer, max_length=64, seed=0)
    text = sentence(random.Random(4), 150)
    chunks = builder.document_sequences("doc", text)
    assert len(chunks) > 1 and all(len(c.input_ids) <= 64 for c in chunks)
    assert all(
        c.kind == "world_knowledge" and c.labels[0] == IGNORE_INDEX and c.labels[1:] == c.input_ids[1:] for c in chunks
    )
    assert chunks[-1].input_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode([t for c in chunks for t in c.input_ids][:-1]) == text


def test_world_knowledge_mix_reaches_the_token_ratio(tokenizer, tmp_path):
    rng = random.Random(6)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "law.txt").write_text(sentence(rng, 300), encoding="utf-8")
    (corpus / "news.jsonl").write_bytes(b"\n".join(orjson.dumps({"text": sentence(rng, 80)}) for _ in range(30)))
    (corpus / "README.md").write_text("What this corpus is: not a document.", encoding="utf-8")
    (corpus / ".git").mkdir()  # a cloned corpus: its repository's files are not documents
    (corpus / ".git" / "description.txt").write_text("Unnamed repository; edit this file to name it.")
    builder = SequenceBuilder(tokenizer, max_length=128, seed=0)
    # The ratio counts loss tokens: a chunk of n tokens holds n - 1 labels (issue 13).
    mixed = list(mix_world_knowledge(builder, [str(corpus)], trajectory_label_tokens=10_000, ratio=0.2, seed=1))
    assert sum(1 for s in mixed for label in s.labels if label != IGNORE_INDEX) == 2000
    everything = list(mix_world_knowledge(builder, [str(corpus)], trajectory_label_tokens=10_000, ratio=5.0, seed=1))
    assert len({s.source for s in everything}) == 31  # a corpus smaller than the ratio asks is used once, whole
    order = [source for source, _ in iter_documents([str(corpus)], 1)]
    assert order == [source for source, _ in iter_documents([str(corpus)], 1)]
    assert order != [source for source, _ in iter_documents([str(corpus)], 2)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"text": "ok"}\n{"body": "no text"}\n', r"news.jsonl:2: field `text` missing"),
        (b'{"text": "ok"}\n{not json\n', r"news.jsonl:2: not valid JSON"),
    ],
)
def test_world_knowledge_errors_name_the_file_and_line(tmp_path, content, message):
    (tmp_path / "news.jsonl").write_bytes(content)
    with pytest.raises(CorpusError, match=message):
        list(iter_documents([str(tmp_path / "news.jsonl")], 0))


def test_a_credential_in_a_world_knowledge_document_is_never_trained_on(tokenizer, tmp_path):
    """Ingest redacts the trajectories; a corpus document (a runbook) went into CPT's sequences as written."""
    key = "sk-proj-" + "abcdefghijklmnopqrstuvwxyz0123"
    (tmp_path / "runbook.txt").write_text(f"Before the deploy: export OPENAI_API_KEY={key} and run it.\n")
    [(_, text)] = iter_documents([str(tmp_path)], 0)
    assert text == "Before the deploy: export OPENAI_API_KEY=[redacted-secret] and run it.\n"
    builder = SequenceBuilder(tokenizer, max_length=128, seed=0)
    trained = list(mix_world_knowledge(builder, [str(tmp_path)], trajectory_label_tokens=10_000, ratio=1.0, seed=1))
    assert "proj-abcdef" not in tokenizer.decode([t for sequence in trained for t in sequence.input_ids])


def test_world_knowledge_missing_source_is_an_error(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        list(iter_documents([str(tmp_path / "nowhere.txt")], 0))


def test_world_knowledge_from_an_hf_dataset(tmp_path, monkeypatch):
    # A local folder through `datasets.load_dataset`, as an offline cache or a downloaded dataset is read.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "dataset"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"text": "alpha beta"}\n{"text": "gamma"}\n', encoding="utf-8")
    documents = list(iter_documents([f"hf://{folder}:train"], 0))
    assert sorted(text for _, text in documents) == ["alpha beta", "gamma"]
    (folder / "train.jsonl").write_text('{"body": "x"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match="no `text` column"):
        list(iter_documents([f"hf://{folder}"], 0))


def test_a_sequence_file_appears_only_when_complete(tmp_path):
    path = tmp_path / "train.parquet"
    rows = [TokenSequence([7, 8, i], [IGNORE_INDEX, 8, i], f"t{i}", turn_indices=[i]) for i in range(5)]
    with pytest.raises(RuntimeError, match="killed"):
        with SequenceWriter(path, rows_per_group=2) as writer:
            for row in rows:
                writer.write(row)
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
    with SequenceWriter(path, rows_per_group=2) as writer:
        for row in rows:
            writer.write(row)
    dataset = ParquetSequences([path])
    assert len(dataset) == 5 and dataset[4] == {"input_ids": [7, 8, 4], "labels": [IGNORE_INDEX, 8, 4]}


def test_the_dataset_reads_lengths_and_draws_the_masks_of_its_epoch(tmp_path):
    """The interface a (packing) collator relies on: len, lengths() without reading rows, set_epoch,
    rows with the labels of the current epoch; fixed-label rows (no span) the same in every epoch."""
    span = MaskSpan(start=2, end=42, keep_ratio=0.25, seed=99)
    thinned = TokenSequence(list(range(50)), [IGNORE_INDEX] * 2 + list(range(2, 50)), "t", spans=[span])
    fixed = TokenSequence([5, 6, 7], [IGNORE_INDEX, 6, 7], "wk", "world_knowledge")
    with SequenceWriter(tmp_path / "a.parquet") as writer:
        writer.write(thinned)
    with SequenceWriter(tmp_path / "b.parquet") as writer:
        writer.write(fixed)
    dataset = ParquetSequences([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    assert len(dataset) == 2 and dataset.lengths().tolist() == [50, 3]
    draws = []
    for epoch in (0, 1, 0):
        dataset.set_epoch(epoch)
        row = dataset[0]
        labelled = [i for i, label in enumerate(row["labels"]) if label != IGNORE_INDEX]
        # 0.25 x 40 span positions, the 8 positions after the span always labelled.
        assert len([i for i in labelled if i < 42]) == 10 and labelled[-8:] == list(range(42, 50))
        assert all(row["labels"][i] == i for i in labelled) and row["input_ids"] == thinned.input_ids
        assert dataset[1] == {"input_ids": [5, 6, 7], "labels": [IGNORE_INDEX, 6, 7]}
        draws.append(labelled)
    assert draws[0] == draws[2] != draws[1]
    assert draws[0] == [i for i, label in enumerate(thinned.labels_at(0)) if label != IGNORE_INDEX]


@pytest.mark.parametrize(("processes", "forwarded"), [(1, [0, 0, 1, 1]), (2, [])])
def test_accelerate_forwards_set_epoch_to_the_dataset_only_on_one_process(tmp_path, processes, forwarded):
    """Why the CPT stage sets the epoch with its own callback (pipeline/training/mask_epochs.py): under
    several processes, the epoch the Trainer gives its data loader never reaches the dataset."""
    from accelerate.data_loader import BatchSamplerShard, DataLoaderShard, SeedableRandomSampler
    from torch.utils.data import BatchSampler

    class Recording(ParquetSequences):
        def set_epoch(self, epoch: int) -> None:
            calls.append(epoch)
            super().set_epoch(epoch)

    calls: list[int] = []
    with SequenceWriter(tmp_path / "train.parquet") as writer:
        for i in range(8):
            writer.write(TokenSequence([1, 2, i], [IGNORE_INDEX, 2, i], f"t{i}"))
    dataset = Recording([tmp_path / "train.parquet"])
    batches = BatchSampler(SeedableRandomSampler(dataset), batch_size=2, drop_last=False)
    if processes > 1:
        batches = BatchSamplerShard(batches, num_processes=processes, process_index=0)
    loader = DataLoaderShard(dataset, batch_sampler=batches, collate_fn=list)
    for epoch in range(2):
        loader.set_epoch(epoch)
        list(loader)
    assert calls == forwarded
