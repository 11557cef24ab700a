"""Ingest: read trajectory files into the store through the format adapters.

Each input file is read record by record; a record becomes a trajectory (content-hash id) or a
quarantine row with its reason and location. Records are written in batches, one transaction per
batch together with the file's progress row, so a killed run resumes after the last committed
record, and a completed, unchanged file is skipped (the nightly refresh). For every file and in
total: records read = trajectories added + duplicates + quarantined.
"""

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from pipeline import formats
from pipeline.config import SimulacraConfig
from pipeline.config.ingest import SourceConfig
from pipeline.formats.base import Document, FormatAdapter, Malformed, raw_text
from pipeline.progress import progress_bar
from pipeline.schema import RecordError, Trajectory, check_limits
from pipeline.sources import Input, expand
from pipeline.stage import StageResult
from pipeline.store import Store

# What a buggy or hostile record can raise inside an adapter; anything else is our bug and stops the run.
PARSE_ERRORS = (RecordError, KeyError, TypeError, ValueError, AttributeError, IndexError)


@dataclass
class Counts:
    records_read: int = 0
    added: int = 0
    duplicates: int = 0
    quarantined: int = 0

    def add(self, other: "Counts") -> None:
        self.records_read += other.records_read
        self.added += other.added
        self.duplicates += other.duplicates
        self.quarantined += other.quarantined

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class _Batch:
    trajectories: list[tuple[str, Trajectory]] = field(default_factory=list)
    quarantined: list[Malformed] = field(default_factory=list)
    records: int = 0


def source_for_path(path: str, name: str | None, format_name: str | None, domain: str | None) -> SourceConfig:
    """A command-line path becomes a source named after it (the folder or file stem) unless named."""
    default = Path(path.rstrip("/")).stem if not path.startswith("hf://") else path.removeprefix("hf://")
    return SourceConfig(name=name or default or "cli", path=path, format=format_name, domain=domain)


def run(
    config: SimulacraConfig,
    store: Store,
    paths: list[str] | None = None,
    format_name: str | None = None,
    source_name: str | None = None,
    domain: str | None = None,
    rescan: bool = False,
) -> StageResult:
    if format_name is not None:
        formats.adapter(format_name)  # unknown names fail before any work
    sources = (
        [source_for_path(p, source_name, format_name, domain) for p in paths]
        if paths
        else list(config.ingest.sources)
    )
    per_source: dict[str, Counts] = {}
    files_read = files_unchanged = 0
    for source in sources:
        inputs = expand(source.path)
        totals = per_source.setdefault(source.name, Counts())
        for item in inputs:
            counts = _ingest_input(config, store, source, item, rescan)
            if counts is None:
                files_unchanged += 1
                continue
            files_read += 1
            totals.add(counts)
    total = Counts()
    for counts in per_source.values():
        total.add(counts)
    metrics = {
        **total.as_dict(),
        "files_read": files_read,
        "files_unchanged": files_unchanged,
        "per_source": {name: c.as_dict() for name, c in per_source.items()},
        "trajectories_in_store": store.scalar("SELECT count(*) FROM trajectories"),
    }
    summary = (
        f"read {total.records_read} records from {files_read} files ({files_unchanged} unchanged, skipped): "
        f"{total.added} added, {total.duplicates} duplicates, {total.quarantined} quarantined"
    )
    table = [{"source": name, **c.as_dict()} for name, c in per_source.items()]
    return StageResult("ingest", metrics=metrics, summary=summary, tables={"ingest-counts": table})


def _ingest_input(
    config: SimulacraConfig, store: Store, source: SourceConfig, item: Input, rescan: bool
) -> Counts | None:
    """Ingest one file; None when it was already completed with this content."""
    digest = item.digest()
    key = [item.path, digest, source.name]
    progress = store.rows(
        "SELECT records_read, added, duplicates, quarantined, completed FROM ingested_files "
        "WHERE path = ? AND sha256 = ? AND source = ?",
        key,
    )
    if progress and progress[0]["completed"] and not rescan:
        return None
    counts = Counts()
    if progress and not rescan:
        row = progress[0]
        counts = Counts(row["records_read"], row["added"], row["duplicates"], row["quarantined"])
    resume_after = counts.records_read
    cfg = config.ingest
    chosen: FormatAdapter | None = _forced_adapter(source)
    batch = _Batch()
    label = Path(item.path).name
    with progress_bar(f"ingest {label}", total=None) as advance:
        index = 0
        for document in item.documents():
            if isinstance(document, Malformed):
                records: Iterator[Document | Malformed] = iter([document])
            else:
                if chosen is None:
                    chosen = formats.detect(document.content)
                records = _records(chosen, document)
            for record in records:
                index += 1
                if index <= resume_after:
                    continue  # committed by an earlier, interrupted run
                batch.records += 1
                parsed = _parse(record, chosen, source, cfg)
                if isinstance(parsed, Malformed):
                    batch.quarantined.append(parsed)
                else:
                    batch.trajectories.append(parsed)
                if batch.records >= cfg.batch_trajectories:
                    _commit(store, source, item, digest, chosen, batch, counts, completed=False)
                    advance(batch.records)
                    batch = _Batch()
        _commit(store, source, item, digest, chosen, batch, counts, completed=True)
        advance(batch.records)
    return counts


def _forced_adapter(source: SourceConfig) -> FormatAdapter | None:
    if source.format is None:
        return None
    if source.format == "generic-jsonl":
        if source.field_mapping is None:
            raise ValueError(f"source {source.name!r}: format generic-jsonl needs `field_mapping` in the config")
        return formats.adapter("generic-jsonl", mapping=source.field_mapping)
    return formats.adapter(source.format)


def _records(adapter: FormatAdapter | None, document: Document) -> Iterator[Document | Malformed]:
    if adapter is None:
        yield Malformed(document.location, "no format adapter recognises this file; pass --format", document.content)
        return
    try:
        yield from adapter.records(document)
    except PARSE_ERRORS as exc:
        yield Malformed(document.location, f"cannot split into records: {exc}", document.content)


def _parse(record: Document | Malformed, adapter: FormatAdapter | None, source: SourceConfig, cfg) -> Any:
    if isinstance(record, Malformed):
        return Malformed(record.location, record.error, raw_text(record.raw, cfg.max_raw_chars_quarantined))
    try:
        trajectory = adapter.parse(record.content, source.domain)
        trajectory.source = source.name
        trajectory.location = record.location
        check_limits(trajectory, cfg.max_action_chars, cfg.max_observation_chars)
        return trajectory.content_id(), trajectory
    except PARSE_ERRORS as exc:
        reason = str(exc) if isinstance(exc, RecordError) else f"{type(exc).__name__}: {exc}"
        return Malformed(record.location, reason, raw_text(record.content, cfg.max_raw_chars_quarantined))


def _commit(
    store: Store,
    source: SourceConfig,
    item: Input,
    digest: str,
    adapter: FormatAdapter | None,
    batch: _Batch,
    counts: Counts,
    completed: bool,
) -> None:
    """Write one batch and the file's progress in one transaction."""
    with store.transaction() as con:
        existing = _existing_ids(con, [trajectory_id for trajectory_id, _ in batch.trajectories])
        fresh: list[tuple[str, Trajectory]] = []
        for trajectory_id, trajectory in batch.trajectories:
            if trajectory_id in existing:
                continue
            existing.add(trajectory_id)  # the same trajectory twice in one batch is one row
            fresh.append((trajectory_id, trajectory))
        if fresh:
            _insert_trajectories(con, fresh)
        if batch.quarantined:
            _insert_quarantine(con, source.name, batch.quarantined)
        counts.records_read += batch.records
        counts.added += len(fresh)
        counts.duplicates += len(batch.trajectories) - len(fresh)
        counts.quarantined += len(batch.quarantined)
        con.execute(
            "INSERT INTO sources VALUES (?, now(), now()) ON CONFLICT (name) DO UPDATE SET last_ingested = now()",
            [source.name],
        )
        con.execute(
            "INSERT OR REPLACE INTO ingested_files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now())",
            [
                item.path,
                digest,
                source.name,
                adapter.name if adapter else None,
                item.size_bytes,
                counts.records_read,
                counts.added,
                counts.duplicates,
                counts.quarantined,
                completed,
            ],
        )


def _existing_ids(con, ids: list[str]) -> set[str]:
    if not ids:
        return set()
    candidates = pa.table({"trajectory_id": pa.array(ids, pa.string())})
    con.register("batch_ids", candidates)
    try:
        rows = con.execute(
            "SELECT trajectory_id FROM trajectories WHERE trajectory_id IN (SELECT trajectory_id FROM batch_ids)"
        ).fetchall()
    finally:
        con.unregister("batch_ids")
    return {row[0] for row in rows}


def _json(value: Any) -> str | None:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode() if value else None


def _insert_trajectories(con, fresh: list[tuple[str, Trajectory]]) -> None:
    # Column-wise comprehensions into Arrow, then one INSERT per table: the per-turn Python work is
    # a few list appends, and DuckDB does the rest in bulk.
    trajectories = pa.table(
        {
            "trajectory_id": pa.array([i for i, _ in fresh], pa.string()),
            "source": pa.array([t.source for _, t in fresh], pa.string()),
            "format": pa.array([t.format for _, t in fresh], pa.string()),
            "domain": pa.array([t.domain for _, t in fresh], pa.string()),
            "task": pa.array([t.task for _, t in fresh], pa.string()),
            "task_description": pa.array([t.system.task_description for _, t in fresh], pa.string()),
            "action_space": pa.array([t.system.action_space for _, t in fresh], pa.string()),
            "tools": pa.array([_json(t.system.tools) for _, t in fresh], pa.string()),
            "initial_state": pa.array([t.system.initial_state for _, t in fresh], pa.string()),
            "demonstrations": pa.array([t.system.demonstrations for _, t in fresh], pa.string()),
            "simulation_instructions": pa.array([t.system.simulation_instructions for _, t in fresh], pa.string()),
            "outcome_reward": pa.array([t.outcome_reward for _, t in fresh], pa.float64()),
            "num_turns": pa.array([len(t.turns) for _, t in fresh], pa.int32()),
            "metadata": pa.array([_json(t.metadata) for _, t in fresh], pa.string()),
            "location": pa.array([t.location for _, t in fresh], pa.string()),
        }
    )
    all_turns = [turn for _, t in fresh for turn in t.turns]
    turns = pa.table(
        {
            "trajectory_id": pa.array([i for i, t in fresh for _ in t.turns], pa.string()),
            "turn_index": pa.array([n for _, t in fresh for n in range(len(t.turns))], pa.int32()),
            "action": pa.array([turn.action for turn in all_turns], pa.string()),
            "observation": pa.array([turn.observation for turn in all_turns], pa.string()),
            "tool_name": pa.array([turn.tool_name for turn in all_turns], pa.string()),
            "is_error": pa.array([turn.is_error for turn in all_turns], pa.bool_()),
            "metadata": pa.array([_json(turn.metadata) for turn in all_turns], pa.string()),
        }
    )
    con.register("new_trajectories", trajectories)
    con.register("new_turns", turns)
    try:
        con.execute(
            "INSERT INTO trajectories SELECT *, now() AS ingested_at FROM new_trajectories"
        )
        con.execute("INSERT INTO turns SELECT * FROM new_turns")
    finally:
        con.unregister("new_trajectories")
        con.unregister("new_turns")


def _insert_quarantine(con, source: str, rows: list[Malformed]) -> None:
    # The id hashes what was wrong and where, so re-reading the same bad file adds no second row.
    ids = [
        hashlib.blake2b(f"{source}\0{m.location}\0{m.error}".encode("utf-8", "backslashreplace"), digest_size=16).hexdigest()
        for m in rows
    ]
    table = pa.table(
        {
            "quarantine_id": pa.array(ids, pa.string()),
            "source": pa.array([source] * len(rows), pa.string()),
            "location": pa.array([m.location for m in rows], pa.string()),
            "error": pa.array([m.error for m in rows], pa.string()),
            "raw": pa.array([m.raw.encode("utf-8", "backslashreplace").decode() for m in rows], pa.string()),
        }
    )
    con.register("new_quarantine", table)
    try:
        con.execute(
            "INSERT OR IGNORE INTO quarantine SELECT DISTINCT ON (quarantine_id) quarantine_id, source, location, "
            "error, raw, now() FROM new_quarantine"
        )
    finally:
        con.unregister("new_quarantine")
