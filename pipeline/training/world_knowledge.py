"""The world-knowledge corpus of CPT: plain documents mixed in at a token ratio (SPEC.md, Stage 1).

Sources (`cpt.world_knowledge`), each one of:
- a text file (`.txt`, `.md`): the whole file is one document;
- a JSONL file (`.jsonl`, `.ndjson`): one document per line, its `text` field;
- a Parquet file: one document per row, its `text` column;
- a folder: every such file below it, in sorted order (hidden files, READMEs and licences skipped);
- `hf://<dataset>` or `hf://<dataset>:<split>` (default split `train`, the syntax of ingestion's
  sources): a Hugging Face dataset with a `text` column, through `datasets.load_dataset` (a local
  cache or folder works offline).

Documents are drawn in one seeded order across all sources and taken until their loss tokens reach
`world_knowledge_token_ratio` x the trajectories' loss tokens (issue 13: the mix is a share of the
gradient, and a fully labelled document weighs ~4x a trajectory token, most of which are context);
a corpus too small for the ratio is used once, whole (repeating it would teach memorisation, not
knowledge), and the ratio reached is reported.
"""

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from pipeline.errors import UserFixableError
from pipeline.formats.sources import SKIPPED_NAMES, visible_files
from pipeline.secret_shapes import redact_shapes
from pipeline.store.content_digests import ContentDigests
from pipeline.training.sequences import IGNORE_INDEX, SequenceBuilder, TokenSequence

TEXT_SUFFIXES = {".txt", ".md"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}
PARQUET_SUFFIXES = {".parquet"}
HF_PREFIX = "hf://"


class CorpusError(UserFixableError, ValueError):
    """A world-knowledge source that cannot be read; the message names the source and the field."""


@dataclass(slots=True)
class _Source:
    name: str
    texts: Sequence[str]  # a list, or a lazily indexed dataset column


def _jsonl_texts(path: Path) -> list[str]:
    texts = []
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise CorpusError(f"{path}:{number}: not valid JSON ({exc})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise CorpusError(f"{path}:{number}: field `text` missing or not a string")
            texts.append(text)
    return texts


def _parquet_texts(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    if "text" not in pq.read_schema(path).names:
        raise CorpusError(f"{path}: no `text` column")
    return [t for t in pq.read_table(path, columns=["text"]).column("text").to_pylist() if isinstance(t, str)]


def _file_source(path: Path) -> _Source:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return _Source(str(path), [path.read_text(encoding="utf-8")])
    if suffix in JSONL_SUFFIXES:
        return _Source(str(path), _jsonl_texts(path))
    if suffix in PARQUET_SUFFIXES:
        return _Source(str(path), _parquet_texts(path))
    raise CorpusError(f"{path}: unsupported world-knowledge file (expected .txt, .md, .jsonl, .ndjson or .parquet)")


def _hf_source(spec: str) -> _Source:
    from datasets import load_dataset

    name, _, split = spec[len(HF_PREFIX) :].partition(":")
    try:
        dataset = load_dataset(name, split=split or "train")
    except Exception as exc:  # the datasets library raises many kinds; all mean "cannot read this source"
        raise CorpusError(f"cpt.world_knowledge: cannot load {spec}: {exc}") from exc
    if "text" not in dataset.column_names:
        raise CorpusError(f"{spec}: no `text` column (columns: {', '.join(dataset.column_names)})")
    return _Source(spec, dataset["text"])


def _is_document_file(path: Path) -> bool:
    """A corpus file in a folder: a known suffix, not hidden, not the folder's README or licence."""
    return (
        path.is_file()
        and path.suffix.lower() in TEXT_SUFFIXES | JSONL_SUFFIXES | PARQUET_SUFFIXES
        and not path.name.startswith(".")
        and path.name.lower() not in SKIPPED_NAMES
    )


def open_sources(specs: Sequence[str]) -> list[_Source]:
    sources = []
    for spec in specs:
        if spec.startswith(HF_PREFIX):
            sources.append(_hf_source(spec))
            continue
        path = Path(spec).expanduser()
        if path.is_dir():
            files = sorted(p for p in visible_files(path) if _is_document_file(p))
            if not files:
                raise CorpusError(f"cpt.world_knowledge: folder {path} holds no .txt/.md/.jsonl/.parquet file")
            sources.extend(_file_source(p) for p in files)
        elif path.is_file():
            sources.append(_file_source(path))
        else:
            raise CorpusError(f"cpt.world_knowledge: {spec} does not exist")
    return sources


def iter_documents(specs: Sequence[str], seed: int) -> Iterator[tuple[str, str]]:
    """(source#index, text) for every document of every source, in one seeded order, credentials redacted."""
    sources = open_sources(specs)
    sizes = np.array([len(s.texts) for s in sources], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    for position in np.random.default_rng(seed).permutation(int(offsets[-1])):
        which = int(np.searchsorted(offsets, position, side="right") - 1)
        index = int(position - offsets[which])
        text = sources[which].texts[index]
        if text and text.strip():
            # A corpus is the user's documents (a runbook, a wiki export): a key in one would be trained on, where
            # ingest redacts the trajectories' own (pipeline/secret_shapes.py).
            yield f"{sources[which].name}#{index}", redact_shapes(text)


def mix_world_knowledge(
    builder: SequenceBuilder, specs: Sequence[str], trajectory_label_tokens: int, ratio: float, seed: int
) -> Iterator[TokenSequence]:
    """Document sequences holding `ratio` x `trajectory_label_tokens` labels (loss tokens), or the whole
    corpus if smaller. A chunk of n tokens holds n - 1 labels: its first token has no context."""
    budget = int(round(ratio * trajectory_label_tokens))
    if budget < 1 or not specs:
        return
    taken = 0
    for source, text in iter_documents(specs, seed):
        for sequence in builder.document_sequences(source, text):
            left = budget - taken
            if left < 1:
                return
            if len(sequence.input_ids) - 1 > left:
                kept = sequence.input_ids[: left + 1]
                sequence = TokenSequence(kept, [IGNORE_INDEX] + kept[1:], source, sequence.kind)
            yield sequence
            taken += len(sequence.input_ids) - 1


def corpus_fingerprint(specs: Sequence[str], digests: ContentDigests) -> str:
    """Changes when a spec changes, or a document file the specs read is added, removed or edited,
    by its bytes (issue 8.4: an edit of the same size or a copy with its times kept counts); an
    unchanged file is not read again. An `hf://` source is identified by its spec (pin a revision
    by downloading it to a folder)."""
    digest = hashlib.sha256()
    for spec in specs:
        digest.update(spec.encode() + b"\0")
        path = Path(spec).expanduser()
        files = sorted(p for p in visible_files(path) if _is_document_file(p)) if path.is_dir() else [path]
        for file in files:
            if file.is_file():
                digest.update(f"{file}\0{digests.sha256(file)}\0".encode())
    return digest.hexdigest()[:16]
