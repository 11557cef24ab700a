"""Whole-trajectory CPT sequences vs the naive per-turn expansion: tokens processed and one-epoch time.

    .venv/bin/python bench/cpt_tokens.py [--corpus data/demo] [--min-turns 10] [--batch-size 8]

Same trajectories (those of the corpus with at least `--min-turns` turns), same tiny model, same
run. Every observation is a target once in both layouts, with all its tokens labelled:
- naive: one sequence per turn t, holding the system prompt, turns 1..t-1 and action t as context
  and observation t as the target: the whole prefix is processed again for every turn;
- whole: one sequence per trajectory (pipeline/training/sequences.py), every observation labelled.
Both are batched the same way, sorted by length (the naive layout's best case: least padding).
One epoch = forward, loss, backward and an AdamW step per batch. Targets (issue 4): at least 5x
fewer tokens and at least 3x less time. Only ratios measured here, in this run, are printed.
"""

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config.model import TinyModelConfig
from pipeline.formats import detect
from pipeline.formats.base import Document, iter_documents
from pipeline.formats.sources import expand
from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.store.schema import RecordError, ScoredTurn, Trajectory
from pipeline.training.sequences import IGNORE_INDEX, PadCollator, SequenceBuilder, TokenSequence
from pipeline.training.tiny_model import build_tiny_model


def read_trajectories(corpus: str, min_turns: int) -> list[Trajectory]:
    found = []
    for item in expand(corpus):
        documents = [d for d in iter_documents(Path(item.path)) if isinstance(d, Document)]
        adapter = detect(documents[0].content) if documents else None
        if adapter is None:
            continue
        for document in documents:
            for record in adapter.records(document):
                try:
                    trajectory = adapter.parse(record.content, None)
                except RecordError:
                    continue
                if len(trajectory.turns) >= min_turns:
                    found.append(trajectory)
    return found


def scored(trajectory: Trajectory) -> list[ScoredTurn]:
    return [ScoredTurn(i, t.action, t.observation, "other", 1.0) for i, t in enumerate(trajectory.turns)]


def whole_sequences(builder: SequenceBuilder, trajectories: list[Trajectory]) -> list[TokenSequence]:
    sequences = []
    for n, trajectory in enumerate(trajectories):
        prompt = render_cpt_system_prompt(trajectory.domain, trajectory.system)
        windows, _ = builder.trajectory_sequences(str(n), prompt, scored(trajectory), full_labels=True)
        sequences += windows
    return sequences


def naive_sequences(builder: SequenceBuilder, trajectories: list[Trajectory]) -> list[TokenSequence]:
    """One sequence per turn: its whole prefix as context, only its own observation labelled."""
    sequences = []
    for n, trajectory in enumerate(trajectories):
        prompt = render_cpt_system_prompt(trajectory.domain, trajectory.system)
        turns = scored(trajectory)
        for t in range(len(turns)):
            [sequence], _ = builder.trajectory_sequences(str(n), prompt, turns[: t + 1], full_labels=True)
            prefix = builder.trajectory_sequences(str(n), prompt, turns[:t], full_labels=True)[0] if t else []
            context = len(prefix[0].input_ids) if prefix else 0
            sequence.labels[:context] = [IGNORE_INDEX] * context
            sequences.append(sequence)
    return sequences


def one_epoch(model_dir: Path, sequences: list[TokenSequence], batch_size: int, pad_id: int, seed: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    collate = PadCollator(pad_id)
    ordered = sorted(sequences, key=lambda s: len(s.input_ids))
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    random.Random(seed).shuffle(batches)
    start = time.perf_counter()
    for batch in batches:
        inputs = collate([{"input_ids": s.input_ids, "labels": s.labels} for s in batch])
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(REPO / "data" / "demo"), help="Trajectories (anything ingest reads).")
    parser.add_argument("--min-turns", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=8192, help="Long enough that no trajectory is windowed.")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()

    trajectories = read_trajectories(options.corpus, options.min_turns)
    if not trajectories:
        raise SystemExit(f"no trajectory with {options.min_turns}+ turns under {options.corpus}")
    from pipeline.training.models import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "text.txt"
        text = "\n".join(t.action + "\n" + t.observation for trajectory in trajectories for t in trajectory.turns)
        corpus.write_text(text, encoding="utf-8")
        model_dir = build_tiny_model(
            TinyModelConfig(max_position_embeddings=options.max_length), [corpus], Path(tmp) / "tiny"
        )
        tokenizer = load_tokenizer(str(model_dir))
        builder = SequenceBuilder(tokenizer, options.max_length, options.seed)
        layouts = {"whole": whole_sequences(builder, trajectories), "naive": naive_sequences(builder, trajectories)}
        figures = {}
        for name, sequences in layouts.items():
            figures[name] = {
                "sequences": len(sequences),
                "tokens": sum(len(s.input_ids) for s in sequences),
                "labels": sum(1 for s in sequences for label in s.labels if label != IGNORE_INDEX),
                "seconds": one_epoch(model_dir, sequences, options.batch_size, tokenizer.pad_token_id, options.seed),
            }

    turns = sum(len(t.turns) for t in trajectories)
    print(
        f"{len(trajectories)} trajectories, {turns} turns ({turns / len(trajectories):.1f} per trajectory), "
        f"tiny model, batch {options.batch_size}, one epoch each"
    )
    print(f"{'layout':<7} {'sequences':>9} {'tokens':>10} {'label tokens':>12} {'epoch s':>8}")
    for name, f in figures.items():
        print(f"{name:<7} {f['sequences']:>9} {f['tokens']:>10} {f['labels']:>12} {f['seconds']:>8.2f}")
    whole, naive = figures["whole"], figures["naive"]
    print(f"tokens: naive / whole = {naive['tokens'] / whole['tokens']:.2f}x (target >= 5x)")
    print(f"time:   naive / whole = {naive['seconds'] / whole['seconds']:.2f}x (target >= 3x)")


if __name__ == "__main__":
    main()
