"""A JSONL file as chunks of lines for DuckDB: line numbers as the Python path counts them, bytes
as Arrow strings without copying them through Python objects."""

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import SupportsIndex

import numpy as np
import pyarrow as pa

# DuckDB scans an Arrow table one record batch per thread: a chunk in one batch runs on one core.
ARROW_BATCH_ROWS = 2048
# What `bytes.strip()` removes: a line of only these is blank, and `iter_documents` skips it.
BLANK = b" \t\n\r\x0b\x0c"


@dataclass
class LineChunk:
    """Up to N non-blank lines of a file: their line numbers and their bytes (a view of the
    memory-mapped file: the page cache, not a copy)."""

    numbers: np.ndarray  # int64, 1-based line numbers
    starts: np.ndarray  # int64 offsets into `data`
    ends: np.ndarray  # int64 offsets into `data` (exclusive, newline included)
    data: memoryview

    @property
    def records(self) -> int:
        return len(self.numbers)

    def line(self, index: SupportsIndex) -> bytes:
        return bytes(self.data[self.starts[index] : self.ends[index]])


def line_chunks(path: Path, skip_records: int, size: int) -> Iterator[LineChunk]:
    """The non-blank lines of a file in chunks of `size`, after the first `skip_records` of them
    (committed by an earlier run). Lines end at b"\\n" only, as when iterating a binary file, so
    line numbers are the Python path's.

    The file is memory-mapped: a chunk's lines are views of the page cache, which DuckDB reads
    as Arrow strings (copying them into fresh memory costs a page fault per 4 KiB, more than the
    copy). Like any reader, it assumes the file is not truncated while being ingested. The mapping
    is not closed by hand: it goes with the last view of it."""
    if not path.stat().st_size:
        return
    with path.open("rb") as handle:
        view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    total = len(view)
    numbers: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    position = number = 0
    while position < total:
        newline = view.find(b"\n", position)
        end = total if newline < 0 else newline + 1
        number += 1
        # Only a line that starts with whitespace can be blank: the others need no copy to check.
        if view[position] in BLANK and not view[position:end].strip(BLANK):
            position = end
            continue
        position, start = end, position
        if skip_records:
            skip_records -= 1
            continue
        numbers.append(number)
        starts.append(start)
        ends.append(end)
        if len(numbers) == size:
            yield _chunk(view, numbers, starts, ends)
            numbers, starts, ends = [], [], []
    if numbers:
        yield _chunk(view, numbers, starts, ends)


def _chunk(view: mmap.mmap, numbers: list[int], starts: list[int], ends: list[int]) -> LineChunk:
    base = starts[0]
    return LineChunk(
        np.array(numbers, np.int64),
        np.array(starts, np.int64) - base,
        np.array(ends, np.int64) - base,
        memoryview(view)[base : ends[-1]],
    )


def line_table(chunk: LineChunk) -> pa.Table:
    """The chunk as an Arrow table (line_no, line), without the lines that are not UTF-8 (the
    Python path quarantines those). Built from buffers, not Python objects: `pa.array` on Python
    values imports pandas, a third of a second."""
    keep = np.arange(chunk.records)
    lines = _string_array(chunk, keep)
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        keep = np.array([i for i in keep if _is_utf8(chunk.line(i))], np.int64)
        lines = _string_array(chunk, keep)
    table = pa.Table.from_arrays([int64_array(chunk.numbers[keep]), lines], names=["line_no", "line"])
    return pa.Table.from_batches(table.to_batches(max_chunksize=ARROW_BATCH_ROWS))


def int64_array(values: np.ndarray) -> pa.Array:
    values = np.ascontiguousarray(values, np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _string_array(chunk: LineChunk, indices: np.ndarray) -> pa.LargeStringArray:
    starts, ends = chunk.starts[indices], chunk.ends[indices]
    if not len(indices) or np.all(starts[1:] == ends[:-1]):  # adjacent lines: a view of the bytes
        base = int(starts[0]) if len(indices) else 0
        offsets = np.append(starts, ends[-1] if len(indices) else 0) - base
        values = pa.py_buffer(memoryview(chunk.data)[base : base + int(offsets[-1])])
    else:
        offsets = np.concatenate(([0], np.cumsum(ends - starts)))
        values = pa.py_buffer(b"".join(chunk.data[a:b] for a, b in zip(starts, ends)))
    return pa.LargeStringArray.from_buffers(len(indices), pa.py_buffer(offsets.astype(np.int64)), values)


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
