"""Ingest: read trajectory files into the store through the format adapters.

Each input file is read record by record; a record becomes a trajectory (content-hash id) or a
quarantine row with its reason and location. Records are written in batches, one transaction per
batch together with the file's progress row, so a killed run resumes after the last committed
record, and a completed, unchanged file is skipped (the nightly refresh). For every file and in
total: records read = trajectories added + duplicates + quarantined.

The project's own JSONL takes a fast path (pipeline/formats/simulacra_jsonl_sql.py): DuckDB checks
and extracts a whole batch of lines, and hands the lines it cannot vouch for to the Python adapter,
so both paths store the same rows and quarantine with the same reasons.
"""

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from pipeline import formats
from pipeline.config import SimulacraConfig
from pipeline.config.ingest import SourceConfig
from pipeline.errors import interrupted
from pipeline.formats import jsonl_lines
from pipeline.formats import simulacra_jsonl_sql as jsonl_sql
from pipeline.formats.base import JSONL_SUFFIXES, Document, FormatAdapter, Malformed, jsonl_document, raw_text
from pipeline.formats.file_encoding import content_stem, sniff
from pipeline.formats.sources import Input, NotRead, Skipped, expand_source
from pipeline.orchestration.faults import maybe_fail
from pipeline.progress import progress_bar
from pipeline.secret_shapes import REDACTED, redact_shapes, sql_redact_rows
from pipeline.stage import StageResult
from pipeline.store.database import Store
from pipeline.store.schema import RecordError, Trajectory, check_limits, storable_metadata

CUT_SHORT = "cut short"  # a compressed file that ends before its end marker: a copy or download that stopped
# What a buggy or hostile record can raise inside an adapter; anything else is our bug and stops the run.
# RecursionError: JSON nested thousands deep, in a tool call's arguments string or in content rendered as text.
PARSE_ERRORS = (RecordError, KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError)


@dataclass
class Counts:
    records_read: int = 0
    added: int = 0
    duplicates: int = 0
    quarantined: int = 0
    # Rows (trajectories, turns, quarantined records) with a credential-shaped run replaced: this run's, not the file's.
    secrets_redacted: int = 0

    def add(self, other: "Counts") -> None:
        self.records_read += other.records_read
        self.added += other.added
        self.duplicates += other.duplicates
        self.quarantined += other.quarantined
        self.secrets_redacted += other.secrets_redacted

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class _Batch:
    # (position in the file, id, trajectory): the position orders duplicates, the first is kept.
    trajectories: list[tuple[int, str, Trajectory]] = field(default_factory=list)
    quarantined: list[Malformed] = field(default_factory=list)
    records: int = 0
    staged: int = 0  # trajectories the SQL fast path staged (jsonl_sql's tables), positions = line numbers


def source_for_path(path: str, name: str | None, format_name: str | None, domain: str | None) -> SourceConfig:
    """A command-line path becomes a source named after it (the folder or file stem) unless named."""
    default = content_stem(Path(path.rstrip("/"))) if not path.startswith("hf://") else path.removeprefix("hf://")
    return SourceConfig(name=name or default or "cli", path=path, format=format_name, domain=domain)  # type: ignore[arg-type]  # pydantic checks the domain


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
        [source_for_path(p, source_name, format_name, domain) for p in paths] if paths else list(config.ingest.sources)
    )
    per_source: dict[str, Counts] = {}
    files_read = files_unchanged = 0
    not_read: list[NotRead] = []
    skipped: list[Skipped] = []  # links back into a folder, second names of a file: read once, nothing to fix
    decoded: list[str] = []  # files read through a decoding, and what they were
    gone: list[str] = []  # files read before that their folder no longer holds
    retired_before = _retired(store)
    for source in sources:
        not_read_before, skipped_before = len(not_read), len(skipped)
        # A command line's own path is named by its error already; a configured source's is said with the source.
        inputs = expand_source(source.path, None if paths else source.name, not_read, skipped)
        totals = per_source.setdefault(source.name, Counts())
        for item in inputs:
            try:
                if not item.is_hf and (kind := sniff(Path(item.path))) is not None:
                    decoded.append(f"{item.path} ({kind})")
                counts = _ingest_input(config, store, source, item, rescan)
            except (OSError, EOFError) as exc:  # unreadable (permissions, I/O, a gzip cut short): the rest goes on
                reason = getattr(exc, "strerror", None) or str(exc)
                not_read.append(NotRead(item.path, f"{CUT_SHORT}: {reason}" if isinstance(exc, EOFError) else reason))
                continue
            if counts is None:
                files_unchanged += 1
                continue
            files_read += 1
            totals.add(counts)
        gone += _supersede_gone(store, source, inputs, not_read[not_read_before:], skipped[skipped_before:])
    retired = _retired(store)
    total = Counts()
    for counts in per_source.values():
        total.add(counts)
    metrics = {
        **total.as_dict(),
        "files_read": files_read,
        "files_unchanged": files_unchanged,
        "per_source": {name: c.as_dict() for name, c in per_source.items()},
        "trajectories_in_store": store.scalar("SELECT count(*) FROM trajectories"),
        "paths_not_read": [{"path": entry.path, "reason": entry.reason} for entry in not_read],
        "paths_skipped": [{"path": entry.path, "reason": entry.reason} for entry in skipped],
        "files_decoded": decoded,
        "files_gone": gone,
        "trajectories_retired": retired,
        "retired_by_this_run": retired - retired_before,
    }
    summary = (
        f"read {total.records_read} records from {files_read} files ({files_unchanged} unchanged, skipped): "
        f"{total.added} added, {total.duplicates} duplicates, {total.quarantined} quarantined"
    )
    if files_unchanged:  # read before: a resumed run's line (what a skip shows later) gives the store's total too
        summary += f"; {metrics['trajectories_in_store']} trajectories in the store"
    if total.secrets_redacted:
        summary += f"; {total.secrets_redacted} row(s) held a credential, redacted"
    if decoded:
        summary += f"; read as UTF-8 from: {', '.join(decoded)}"
    if gone:
        summary += f"; {len(gone)} file(s) read before are no longer in their folder: {', '.join(gone[:5])}"
        summary += ", ..." if len(gone) > 5 else ""
    if retired != retired_before:
        summary += (
            f"; {retired - retired_before:+d} trajectories retired, {retired} in all (no current version of a file "
            "holds them: kept in the store, in no pool after `simulacra split`)"
        )
    if skipped:
        summary += f"; {len(skipped)} path(s) skipped: " + "; ".join(f"{e.path} ({e.reason})" for e in skipped)
    if not_read:
        summary += f"; {len(not_read)} path(s) NOT read: " + "; ".join(f"{e.path} ({e.reason})" for e in not_read)
    table = [{"source": name, **c.as_dict()} for name, c in per_source.items()]
    return StageResult("ingest", metrics=metrics, summary=summary, tables={"ingest-counts": table})


def _retired(store: Store) -> int:
    return store.scalar("SELECT count(*) FROM retired_trajectories")


def _supersede_gone(
    store: Store, source: SourceConfig, inputs: list[Input], not_read: list[NotRead], skipped: list[Skipped]
) -> list[str]:
    """The files of a folder source that its walk no longer finds (deleted, renamed, moved out): their versions are
    superseded, their quarantined records taken back, and the trajectories only they held retired. Only for a
    folder (a glob's or a file's absence is not a deletion one can see), and never for what the walk could not
    look at: a path it could not list or read, or under one, is there as far as anyone knows. Returns the paths."""
    if source.path.startswith("hf://"):
        return []
    folder = Path(source.path).expanduser()
    if not folder.is_dir():
        return []
    root = str(folder)
    present = {item.path for item in inputs} | {entry.path for entry in skipped}
    blocked = [entry.path for entry in not_read]

    def under(path: str) -> bool:
        if root == ".":  # the walk of `.` names its files `x`, not `./x`
            return not path.startswith(("/", "..", "hf://"))
        return path.startswith(root.rstrip(os.sep) + os.sep)

    current = store.rows("SELECT path FROM ingested_files WHERE source = ? AND superseded_at IS NULL", [source.name])
    gone = sorted(
        {
            row["path"]
            for row in current
            if under(row["path"])
            and row["path"] not in present
            and not any(row["path"] == path or row["path"].startswith(path.rstrip(os.sep) + os.sep) for path in blocked)
        }
    )
    if gone:
        with store.transaction() as con:
            for path in gone:
                con.execute(
                    "UPDATE ingested_files SET superseded_at = now() "
                    "WHERE path = ? AND source = ? AND superseded_at IS NULL",
                    [path, source.name],
                )
                _delete_quarantined(con, source.name, path)
    return gone


def _ingest_input(
    config: SimulacraConfig, store: Store, source: SourceConfig, item: Input, rescan: bool
) -> Counts | None:
    """Ingest one file; None when it was already completed with this content."""
    digest = item.digest()
    key = [item.path, digest, source.name]
    progress = store.rows(
        "SELECT records_read, added, duplicates, quarantined, completed, format, superseded_at IS NULL AS current, "
        "trajectories_recorded FROM ingested_files WHERE path = ? AND sha256 = ? AND source = ?",
        key,
    )
    # Other versions of this path still current: the one this read replaces, or a newer one whose read was left unfinished.
    others = store.scalar(
        "SELECT count(*) FROM ingested_files WHERE path = ? AND source = ? AND sha256 <> ? AND superseded_at IS NULL",
        [item.path, source.name, digest],
    )
    if progress and progress[0]["completed"] and not rescan:
        row = progress[0]
        if source.format is None or row["format"] == source.format:
            if row["current"] and row["trajectories_recorded"] and not others:
                return None
            # Read again: an earlier version of the file is back (its quarantined records were taken back when the newer
            # one was read), a newer version's read was left unfinished, or it was read before ingest recorded which
            # trajectories a file holds (migration 15). Its trajectories are duplicates; the read makes it current.
        # Or read before in another format (a wrong `--format`, whose every record went to quarantine): read again in
        # the one asked now. Either way the earlier read's quarantined records are taken back, so that the file's
        # counts are this read's.
        rescan = True
        _begin_version(store, source, item, digest)
    elif not progress and others:
        # A new version of a file read before: what was wrong with the old one is no longer so (this read finds what
        # is wrong with this one). The old version's trajectories stay in the pools until this read completes.
        _begin_version(store, source, item, digest)
    counts = Counts()
    if progress and not rescan:
        row = progress[0]
        counts = Counts(row["records_read"], row["added"], row["duplicates"], row["quarantined"])
    resume_after = counts.records_read
    cfg = config.ingest
    chosen: FormatAdapter | None = _forced_adapter(source)
    label = Path(item.path).name
    plain = item.is_hf or sniff(Path(item.path)) is None  # the fast path maps the file's bytes as UTF-8 lines
    with progress_bar(f"ingest {label}", total=None) as advance:
        if cfg.sql_fast_path and plain and not item.is_hf and Path(item.path).suffix.lower() in JSONL_SUFFIXES:
            adapter = chosen or _detect_jsonl(Path(item.path))
            if adapter is not None and adapter.name == jsonl_sql.FORMAT:
                _ingest_jsonl_sql(config, store, source, item, digest, adapter, counts, advance)
                return counts
        batch = _Batch()
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
                _add(batch, index, _parse(record, chosen, source, cfg))
                if batch.records >= cfg.batch_trajectories:
                    _commit(store, source, item, digest, chosen, batch, counts, completed=False)
                    advance(batch.records)
                    batch = _Batch()
                    maybe_fail(config, "ingest", f"after committing {counts.records_read} records of {item.path}")
        _commit(store, source, item, digest, chosen, batch, counts, completed=True)
        advance(batch.records)
    return counts


def _add(batch: _Batch, position: int, parsed: Any) -> None:
    if isinstance(parsed, Malformed):
        batch.quarantined.append(parsed)
    else:
        trajectory_id, trajectory = parsed
        batch.trajectories.append((position, trajectory_id, trajectory))


def _detect_jsonl(path: Path) -> FormatAdapter | None:
    """The adapter the Python path would choose: the first line that is JSON decides."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                document = jsonl_document(line, f"{path}:{number}")
                if isinstance(document, Document):
                    return formats.detect(document.content)
    return None


def _ingest_jsonl_sql(
    config: SimulacraConfig,
    store: Store,
    source: SourceConfig,
    item: Input,
    digest: str,
    adapter: FormatAdapter,
    counts: Counts,
    advance,
) -> None:
    """The fast path: one chunk of `batch_trajectories` lines per transaction, as the Python path."""
    cfg = config.ingest
    path = Path(item.path)
    for chunk in jsonl_lines.line_chunks(path, counts.records_read, cfg.batch_trajectories):
        batch = _stage_chunk(store, source, path, adapter, chunk, cfg)
        try:
            _commit(store, source, item, digest, adapter, batch, counts, completed=False)
        finally:
            jsonl_sql.drop_staged(store.connection)
        advance(batch.records)
        maybe_fail(config, "ingest", f"after committing {counts.records_read} records of {item.path}")
    _commit(store, source, item, digest, adapter, _Batch(), counts, completed=True)


def _stage_chunk(store: Store, source: SourceConfig, path: Path, adapter: FormatAdapter, chunk, cfg) -> _Batch:
    """Stage what DuckDB can vouch for; parse the rest with the Python adapter, as the Python path."""
    batch = _Batch(records=chunk.records)
    try:
        staged = jsonl_sql.stage(
            store.connection, chunk, source.domain, cfg.max_action_chars, cfg.max_observation_chars
        )
        batch.staged, routed = staged.rows, staged.routed
    except duckdb.Error as exc:
        # ctrl-C mid-query reaches here as a duckdb.Error too (InterruptException, or InvalidInputException
        # naming the KeyboardInterrupt when it came while DuckDB read the registered Arrow table): routing
        # that chunk the Python way would swallow the interrupt and ingest on to the end.
        if interrupted(exc):
            raise
        # DuckDB refused something (a construct its reader rejects): this chunk goes the Python way.
        jsonl_sql.drop_staged(store.connection)
        routed = list(range(chunk.records))
    for index in routed:
        number = int(chunk.numbers[index])
        document = jsonl_document(chunk.line(index), f"{path}:{number}")
        records = iter([document]) if isinstance(document, Malformed) else _records(adapter, document)
        for record in records:
            _add(batch, number, _parse(record, adapter, source, cfg))
    return batch


# A file version's progress row; completed or not, the version being read is current, and records its trajectories.
PROGRESS_ROW = (
    "INSERT OR REPLACE INTO ingested_files (path, sha256, source, format, size_bytes, records_read, added, duplicates, "
    "quarantined, completed, updated_at, superseded_at, trajectories_recorded) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now(), NULL, true)"
)


def _begin_version(store: Store, source: SourceConfig, item: Input, digest: str) -> None:
    """Start reading a version of a file from its first record: the quarantined records of the file (at the file
    itself, a line, an item or a row of it, whichever version they came from) are taken back, and the version's
    progress row says nothing read yet, in one transaction. A run killed before its first batch then resumes this
    read; and were the file put back as it was, the unfinished version beside the old one has it read again,
    which brings its quarantined records back."""
    with store.transaction() as con:
        _delete_quarantined(con, source.name, item.path)
        con.execute(PROGRESS_ROW, [item.path, digest, source.name, None, item.size_bytes, 0, 0, 0, 0, False])


def _delete_quarantined(con, source: str, path: str) -> None:
    """The quarantined records of one file of a source: at the file itself, a line, an item or a row of it."""
    con.execute(
        "DELETE FROM quarantine WHERE source = ? AND (location = ? OR starts_with(location, ? || ':') "
        "OR starts_with(location, ? || '[') OR starts_with(location, ? || '#'))",
        [source, path, path, path, path],
    )


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
        reason = "no format adapter recognises this file; pass --format"
        if document.not_json is not None:  # a `.json` cut short, say: what to fix is the file, not the format
            reason = f"{document.not_json}, and no format adapter recognises it as text; fix the file or pass --format"
        yield Malformed(document.location, reason, document.content)
        return
    try:
        yield from adapter.records(document)
    except PARSE_ERRORS as exc:
        yield Malformed(document.location, f"cannot split into records: {exc}", document.content)


def _parse(record: Document | Malformed, adapter: FormatAdapter | None, source: SourceConfig, cfg) -> Any:
    if isinstance(record, Malformed):
        return Malformed(record.location, record.error, raw_text(record.raw, cfg.max_raw_chars_quarantined))
    try:
        trajectory = adapter.parse(record.content, source.domain)  # type: ignore[union-attr]  # a Document: an adapter split it
        trajectory.source = source.name
        trajectory.location = record.location
        check_limits(trajectory, cfg.max_action_chars, cfg.max_observation_chars)
        storable_metadata(trajectory)
        return trajectory.content_id(), trajectory
    except PARSE_ERRORS as exc:
        reason = str(exc) if isinstance(exc, RecordError) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, RecursionError):
            reason = f"nested too deeply to read ({reason})"
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
        added = _insert_new(con, source, item, digest, batch, counts) if batch.trajectories or batch.staged else 0
        if batch.quarantined:
            counts.secrets_redacted += _insert_quarantine(con, source.name, batch.quarantined)
        counts.records_read += batch.records
        counts.added += added
        counts.duplicates += len(batch.trajectories) + batch.staged - added
        counts.quarantined += len(batch.quarantined)
        con.execute(
            "INSERT INTO sources VALUES (?, now(), now()) ON CONFLICT (name) DO UPDATE SET last_ingested = now()",
            [source.name],
        )
        con.execute(
            PROGRESS_ROW,
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
        if completed:
            # This version is the file now: every other version of the path is superseded, in the transaction that
            # completes this one, and a trajectory only they held is retired (the view `retired_trajectories`).
            con.execute(
                "UPDATE ingested_files SET superseded_at = now() "
                "WHERE path = ? AND source = ? AND sha256 <> ? AND superseded_at IS NULL",
                [item.path, source.name, digest],
            )


def _insert_new(con, source: SourceConfig, item: Input, digest: str, batch: _Batch, counts: Counts) -> int:
    """Insert the batch's trajectories whose id the store does not hold, the first occurrence of
    each (by position in the file), credentials redacted; returns how many. Every record's id, a
    duplicate's too, is recorded as held by this version of the file (`file_trajectories`)."""
    candidates = []
    if batch.trajectories:
        trajectories, turns = _arrow_rows(batch.trajectories)
        con.register("new_trajectories", trajectories)
        con.register("new_turns", turns)
        candidates.append("SELECT position, trajectory_id FROM new_trajectories")
    if batch.staged:
        candidates.append("SELECT position, trajectory_id FROM jsonl_keys")
    try:
        con.execute(
            f"INSERT OR IGNORE INTO file_trajectories SELECT DISTINCT ?, ?, ?, trajectory_id "
            f"FROM ({' UNION ALL '.join(candidates)})",
            [item.path, digest, source.name],
        )
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE batch_chosen AS
            SELECT c.position, c.trajectory_id FROM ({" UNION ALL ".join(candidates)}) c
            ANTI JOIN trajectories t ON t.trajectory_id = c.trajectory_id
            QUALIFY row_number() OVER (PARTITION BY c.trajectory_id ORDER BY c.position) = 1"""
        )
        if batch.trajectories:
            con.execute(
                f"INSERT INTO trajectories ({', '.join(TRAJECTORY_COLUMNS)}, ingested_at) "
                f"SELECT {', '.join(TRAJECTORY_COLUMNS)}, now() FROM new_trajectories SEMI JOIN batch_chosen USING (position)"
            )
            con.execute(
                f"INSERT INTO turns ({', '.join(TURN_COLUMNS)}) "
                f"SELECT {', '.join(TURN_COLUMNS)} FROM new_turns SEMI JOIN batch_chosen USING (position)"
            )
        if batch.staged:
            jsonl_sql.insert_chosen(con, source.name, f"{Path(item.path)}:")
        counts.secrets_redacted += _redact_added(con)
        added = con.execute("SELECT count(*) FROM batch_chosen").fetchall()[0][0]
        con.execute("DROP TABLE batch_chosen")  # on failure, the rollback takes it away
        return added
    finally:
        if batch.trajectories:
            con.unregister("new_trajectories")
            con.unregister("new_turns")


def _redact_added(con) -> int:
    """Replace every credential-shaped run (pipeline/secret_shapes.py) in the rows this batch added, both paths
    alike, in the batch's transaction: data is untrusted, and an agent's shell prints keys (`env`, `cat
    ~/.aws/credentials`) that would otherwise reach CPT's windows, SFT's prompts and the judge. The rows are
    found with RE2 over the batch's text (a scan; none match in the demo's or the public data) and rewritten
    only where they match. Returns how many rows changed."""
    changed = 0
    # Where a record was read is no training text, but a keyed file's keys are part of it.
    for table, columns in (("trajectories", (*TRAJECTORY_TEXT, "location")), ("turns", TURN_TEXT)):
        updated = con.execute(
            sql_redact_rows(table, columns, "trajectory_id IN (SELECT trajectory_id FROM batch_chosen)")
        ).fetchall()
        changed += updated[0][0] if updated else 0
    return changed


def _json(value: Any) -> str | None:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode() if value else None


TRAJECTORY_COLUMNS = (
    "trajectory_id",
    "source",
    "format",
    "domain",
    "task",
    "task_description",
    "action_space",
    "tools",
    "initial_state",
    "demonstrations",
    "simulation_instructions",
    "outcome_reward",
    "num_turns",
    "metadata",
    "location",
)
TURN_COLUMNS = ("trajectory_id", "turn_index", "action", "observation", "tool_name", "is_error", "metadata")
# The stored text of a trajectory and of a turn (what prompts, training samples and judges are built from): every
# column but the keys, what the store derives, and where the record was read.
TRAJECTORY_TEXT = tuple(
    c
    for c in TRAJECTORY_COLUMNS
    if c not in ("trajectory_id", "source", "format", "domain", "outcome_reward", "num_turns", "location")
)
TURN_TEXT = tuple(c for c in TURN_COLUMNS if c not in ("trajectory_id", "turn_index", "is_error"))


def _arrow_rows(rows: list[tuple[int, str, Trajectory]]) -> tuple[pa.Table, pa.Table]:
    # Column-wise comprehensions into Arrow, then one INSERT per table: the per-turn Python work is
    # a few list appends, and DuckDB does the rest in bulk.
    trajectories = pa.table(
        {
            "position": pa.array([p for p, _, _ in rows], pa.int64()),
            "trajectory_id": pa.array([i for _, i, _ in rows], pa.string()),
            "source": pa.array([t.source for *_, t in rows], pa.string()),
            "format": pa.array([t.format for *_, t in rows], pa.string()),
            "domain": pa.array([t.domain for *_, t in rows], pa.string()),
            "task": pa.array([t.task for *_, t in rows], pa.string()),
            "task_description": pa.array([t.system.task_description for *_, t in rows], pa.string()),
            "action_space": pa.array([t.system.action_space for *_, t in rows], pa.string()),
            "tools": pa.array([_json(t.system.tools) for *_, t in rows], pa.string()),
            "initial_state": pa.array([t.system.initial_state for *_, t in rows], pa.string()),
            "demonstrations": pa.array([t.system.demonstrations for *_, t in rows], pa.string()),
            "simulation_instructions": pa.array([t.system.simulation_instructions for *_, t in rows], pa.string()),
            "outcome_reward": pa.array([t.outcome_reward for *_, t in rows], pa.float64()),
            "num_turns": pa.array([len(t.turns) for *_, t in rows], pa.int32()),
            "metadata": pa.array([_json(t.metadata) for *_, t in rows], pa.string()),
            "location": pa.array([t.location for *_, t in rows], pa.string()),
        }
    )
    all_turns = [turn for *_, t in rows for turn in t.turns]
    turns = pa.table(
        {
            "position": pa.array([p for p, _, t in rows for _ in t.turns], pa.int64()),
            "trajectory_id": pa.array([i for _, i, t in rows for _ in t.turns], pa.string()),
            "turn_index": pa.array([n for *_, t in rows for n in range(len(t.turns))], pa.int32()),
            "action": pa.array([turn.action for turn in all_turns], pa.string()),
            "observation": pa.array([turn.observation for turn in all_turns], pa.string()),
            "tool_name": pa.array([turn.tool_name for turn in all_turns], pa.string()),
            "is_error": pa.array([turn.is_error for turn in all_turns], pa.bool_()),
            "metadata": pa.array([_json(turn.metadata) for turn in all_turns], pa.string()),
        }
    )
    return trajectories, turns


def _insert_quarantine(con, source: str, rows: list[Malformed]) -> int:
    """Insert the malformed records with their reasons; a credential-shaped run in one (its raw text, or an
    error that quotes it) is replaced first. Returns how many records held one."""
    # The id hashes what was wrong and where, so re-reading the same bad file adds no second row.
    ids = [
        hashlib.blake2b(
            f"{source}\0{m.location}\0{m.error}".encode("utf-8", "backslashreplace"), digest_size=16
        ).hexdigest()
        for m in rows
    ]
    # The raw text was redacted before it was cut (pipeline/formats/base.py `raw_text`), so that no key across the
    # cut keeps its start; here the reason and where the record was (a keyed file's keys are part of it) are.
    raws = [m.raw.encode("utf-8", "backslashreplace").decode() for m in rows]
    errors = [redact_shapes(m.error) for m in rows]
    locations = [redact_shapes(m.location) for m in rows]
    redacted = sum(
        1
        for m, error, location, raw in zip(rows, errors, locations, raws, strict=True)
        if (error, location) != (m.error, m.location) or REDACTED in raw
    )
    table = pa.table(
        {
            "quarantine_id": pa.array(ids, pa.string()),
            "source": pa.array([source] * len(rows), pa.string()),
            "location": pa.array(locations, pa.string()),
            "error": pa.array(errors, pa.string()),
            "raw": pa.array(raws, pa.string()),
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
    return redacted
