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
from pipeline.secret_shapes import redact_shapes
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
    # Why a file read as text did not read as JSON: the reason to give if no adapter reads the text either.
    not_json: str | None = None


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


# How far past the quarantine's cut a credential is looked for: longer than any key a shape spans (an RSA-4096 private
# key is about 3,300 characters), so that a key across the cut is replaced whole and none of its start is kept.
CUT_MARGIN = 8192


def raw_text(content: Any, limit: int) -> str:
    """The raw form of a record for quarantine, credentials replaced (pipeline/secret_shapes.py), then cut at `limit`
    characters."""
    if isinstance(content, (bytes, bytearray)):
        text = bytes(content).decode("utf-8", "backslashreplace")
    elif isinstance(content, str):
        text = content
    else:
        try:
            text = orjson.dumps(content, default=str).decode()
        except TypeError:  # past orjson's 255 levels, or a value `str` cannot render
            try:
                text = repr(content)
            except RecursionError:
                text = f"<a {type(content).__name__} nested too deeply to show>"
    head = redact_shapes(text[: limit + CUT_MARGIN])
    unread = max(0, len(text) - limit - CUT_MARGIN)
    if len(head) <= limit and not unread:
        return head
    return head[:limit] + f"... [{len(head) - limit + unread} more chars]"


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
        lines = data.splitlines()
        if _json_lines(lines):  # JSON Lines under a `.json` name, as many datasets name them: read line by line
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    yield jsonl_document(line, f"{path}:{number}")
            return
        # A file that is not JSON may still be a text-game log with an unusual suffix.
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            yield Malformed(str(path), str(exc), data.decode("utf-8", "backslashreplace"))
            return
        yield Document(str(path), text, not_json=str(exc))


def _json_lines(lines: list[bytes]) -> bool:
    """Whether a file that is not one JSON value is JSON Lines: more than one line, the first an object."""
    filled = (line for line in lines if line.strip())
    first, second = next(filled, None), next(filled, None)
    if first is None or second is None:
        return False
    try:
        return isinstance(orjson.loads(first), dict)
    except orjson.JSONDecodeError:
        return False


def _jsonl_bytes(path: Path, encoding: str | None):
    """A JSONL file's lines as UTF-8 bytes. Plain and gzipped UTF-8 are streamed (a dataset's `.jsonl.gz` can be
    gigabytes); the other encodings are read whole and transcoded (`utf8_bytes`): exports that are rare and small."""
    if encoding is None:
        return path.open("rb")
    if encoding == GZIP_ONLY:
        return gzip.open(path, "rb")
    return io.BytesIO(utf8_bytes(path))


# The values a YAML document may stand for once its aliases are expanded: far above a long SWE-agent demonstration
# (a few thousand), far below what nine nested aliases of nine make of a 600-byte file (a billion).
YAML_EXPANDED_VALUES = 1_000_000


def _yaml_document(path: Path, data: bytes) -> Document | Malformed:
    """SWE-agent writes its demonstrations as YAML; safe_load builds plain data, never objects. Its aliases share
    one value where JSON would repeat it: a document whose expansion is too large ("billion laughs") is refused
    before anything renders it as text, as is one nested too deep for the parser."""
    import yaml

    try:
        content = yaml.safe_load(data.decode("utf-8"))
        expanded = _expanded_values(content, {})
    except UnicodeDecodeError as exc:
        return Malformed(str(path), f"invalid UTF-8 at byte {exc.start}", data.decode("utf-8", "backslashreplace"))
    except yaml.YAMLError as exc:
        return Malformed(str(path), f"invalid YAML: {exc}", data.decode("utf-8"))
    except RecursionError:
        return Malformed(str(path), "YAML nested too deeply to read", data.decode("utf-8"))
    if expanded > YAML_EXPANDED_VALUES:
        return Malformed(
            str(path),
            f"YAML whose aliases expand to more than {YAML_EXPANDED_VALUES:,} values (an alias bomb?)",
            data.decode("utf-8"),
        )
    return Document(str(path), content)


def _expanded_values(value: Any, counted: dict[int, int]) -> int:
    """How many values `value` stands for written out in full, each shared list or mapping counted once per use
    (`counted`, by identity, keeps the walk linear in the document's own size)."""
    if not isinstance(value, (list, dict)):
        return 1
    known = counted.get(id(value))
    if known is None:
        items = value.values() if isinstance(value, dict) else value
        known = counted[id(value)] = 1 + sum(_expanded_values(item, counted) for item in items)
    return known


def _parquet_documents(path: Path) -> Iterator[Document]:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path)
    row = 0
    for batch in table.iter_batches(batch_size=1024):
        for item in batch.to_pylist():
            yield Document(f"{path}#row={row}", item)
            row += 1
