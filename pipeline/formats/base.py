"""What a format adapter is, and how files are read into documents before an adapter sees them.

A file yields *documents* (a JSONL line, a whole JSON file, a text log, a Parquet row). An adapter
splits a document into *records* (a tau-bench file is a list of runs; an AgentBench file maps task
types to runs) and parses each record into a `Trajectory`. Parsing raises `RecordError` for a
malformed record; the ingest stage quarantines it with its location and goes on.
"""

import gzip
import io
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson

from pipeline.formats.file_encoding import GZIP_ONLY, content_suffix, sniff, utf8_bytes
from pipeline.store.schema import RecordError, Trajectory

JSONL_SUFFIXES = {".jsonl", ".ndjson"}
TEXT_SUFFIXES = {".txt", ".log"}
PARQUET_SUFFIXES = {".parquet"}
YAML_SUFFIXES = {".yaml", ".yml"}


@dataclass(slots=True)
class Malformed:
    """A record that did not parse: it goes to the `quarantine` table."""

    location: str
    error: str
    raw: str


@dataclass(slots=True)
class Document:
    location: str
    content: Any


class FormatAdapter(ABC):
    """Subclasses set `name` and `default_domain` and implement `detect` and `parse`."""

    name: ClassVar[str]
    default_domain: ClassVar[str] = "other"
    description: ClassVar[str] = ""

    @abstractmethod
    def detect(self, content: Any) -> bool:
        """Whether a document (the first of a file) is in this format."""
        raise NotImplementedError

    def records(self, document: Document) -> Iterator[Document]:
        """Split a document into records. Default: the document is one record."""
        yield document

    @abstractmethod
    def parse(self, record: Any, domain: str | None) -> Trajectory:
        """Turn one record into a trajectory; `domain` is the source's override, if any."""
        raise NotImplementedError


def raw_text(content: Any, limit: int) -> str:
    """The raw form of a record for quarantine, cut at `limit` characters."""
    if isinstance(content, (bytes, bytearray)):
        text = bytes(content).decode("utf-8", "backslashreplace")
    elif isinstance(content, str):
        text = content
    else:
        try:
            text = orjson.dumps(content, default=str).decode()
        except TypeError:
            text = repr(content)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def _decode_json(data: bytes, location: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "utf-8" in str(exc).lower() or "surrogate" in str(exc).lower():
            raise RecordError(f"invalid UTF-8: {exc}") from None
        raise RecordError(f"invalid JSON: {exc}") from None


def jsonl_document(line: bytes, location: str) -> Document | Malformed:
    """One JSONL line as a document, or `Malformed` when it is not JSON (or not UTF-8)."""
    try:
        return Document(location, _decode_json(line, location))
    except RecordError as exc:
        return Malformed(location, str(exc), line.decode("utf-8", "backslashreplace"))


def iter_documents(path: Path) -> Iterator[Document | Malformed]:
    """Yield the documents of one file, or `Malformed` for the parts that cannot be decoded. A file
    that is gzip-compressed or not UTF-8 (pipeline/formats/file_encoding.py) is read as UTF-8 first; a
    `.gz` name is read as the suffix before it (`runs.jsonl.gz` as JSONL)."""
    suffix = content_suffix(path)
    if suffix in PARQUET_SUFFIXES:
        yield from _parquet_documents(path)
        return
    encoding = sniff(path)
    encoded = encoding is not None
    if suffix in JSONL_SUFFIXES:
        with _jsonl_bytes(path, encoding) as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                yield jsonl_document(line, f"{path}:{number}")
        return
    data = path.read_bytes() if not encoded else utf8_bytes(path)
    if suffix in YAML_SUFFIXES:
        yield _yaml_document(path, data)
        return
    if suffix in TEXT_SUFFIXES:
        try:
            yield Document(str(path), data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            yield Malformed(str(path), f"invalid UTF-8 at byte {exc.start}", data.decode("utf-8", "backslashreplace"))
        return
    try:
        yield Document(str(path), _decode_json(data, str(path)))
    except RecordError as exc:
        # A file that is not JSON may still be a text-game log with an unusual suffix.
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            yield Malformed(str(path), str(exc), data.decode("utf-8", "backslashreplace"))
            return
        yield Document(str(path), text)


def _jsonl_bytes(path: Path, encoding: str | None):
    """A JSONL file's lines as UTF-8 bytes. Plain and gzipped UTF-8 are streamed (a dataset's `.jsonl.gz` can be
    gigabytes); the other encodings are read whole and transcoded (`utf8_bytes`): exports that are rare and small."""
    if encoding is None:
        return path.open("rb")
    if encoding == GZIP_ONLY:
        return gzip.open(path, "rb")
    return io.BytesIO(utf8_bytes(path))


def _yaml_document(path: Path, data: bytes) -> Document | Malformed:
    """SWE-agent writes its demonstrations as YAML; safe_load builds plain data, never objects."""
    import yaml

    try:
        return Document(str(path), yaml.safe_load(data.decode("utf-8")))
    except UnicodeDecodeError as exc:
        return Malformed(str(path), f"invalid UTF-8 at byte {exc.start}", data.decode("utf-8", "backslashreplace"))
    except yaml.YAMLError as exc:
        return Malformed(str(path), f"invalid YAML: {exc}", data.decode("utf-8"))


def _parquet_documents(path: Path) -> Iterator[Document]:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path)
    row = 0
    for batch in table.iter_batches(batch_size=1024):
        for item in batch.to_pylist():
            yield Document(f"{path}#row={row}", item)
            row += 1
