"""What a file's bytes are before they are JSON: gzip-compressed, UTF-16/32, or UTF-8 with a BOM.

Exporters write all of these under a `.jsonl` name (PowerShell's `Out-File` writes UTF-16 with a
BOM; a gzip file keeps the name it was given), and datasets ship JSONL gzipped as `.jsonl.gz`, which is
read as the `.jsonl` it holds (`content_suffix`). Read as UTF-8 lines, a UTF-16 file splits on the
newline's first byte and leaves its NUL as a phantom last record, and a gzip file becomes lines of
binary. `sniff` reads a file's first bytes and names what it is; `utf8_bytes` turns such a file into
UTF-8 (the whole file in memory: these are the exception, the plain files keep streaming).
"""

import codecs
import gzip
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"
GZIP_ONLY = "gzip-compressed"  # what `sniff` calls gzipped plain UTF-8
# Longest first: UTF-32 LE's BOM begins with UTF-16 LE's.
BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32"),
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32"),
    (codecs.BOM_UTF8, "utf-8", "UTF-8 with a byte-order mark"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16"),
)


def _text_encoding(head: bytes) -> tuple[str, int, str] | None:
    """(codec, BOM length, what to call it) of text that is not plain UTF-8, from its first bytes."""
    for bom, codec, name in BOMS:
        if head.startswith(bom):
            return codec, len(bom), name
    # No BOM: JSON starts with an ASCII character, so UTF-16 shows a NUL beside it.
    if len(head) >= 2 and head[0] and not head[1]:
        return "utf-16-le", 0, "UTF-16 without a byte-order mark"
    if len(head) >= 2 and not head[0] and head[1]:
        return "utf-16-be", 0, "UTF-16 without a byte-order mark"
    return None


# A compression suffix names how the bytes are stored; the suffix before it, what they are.
COMPRESSED_SUFFIXES = {".gz"}


def content_suffix(path: Path) -> str:
    """The suffix that says what a file holds, lower case: `.jsonl` for `runs.jsonl` and `runs.jsonl.gz`. Parquet
    compresses within; pyarrow reads no `.parquet.gz`, which stays a `.gz`."""
    suffixes = [suffix.lower() for suffix in Path(path).suffixes]
    if len(suffixes) >= 2 and suffixes[-1] in COMPRESSED_SUFFIXES and suffixes[-2] != ".parquet":
        return suffixes[-2]
    return suffixes[-1] if suffixes else ""


def content_stem(path: Path) -> str:
    """The name without what `content_suffix` read: `runs` for `runs.jsonl.gz`, as for `runs.jsonl`."""
    path = Path(path)
    if path.suffix.lower() in COMPRESSED_SUFFIXES:
        path = path.with_suffix("")
    return path.stem


def sniff(path: Path) -> str | None:
    """What the file is when it is not plain UTF-8 ("gzip-compressed", "UTF-16", ...); None if plain."""
    with Path(path).open("rb") as handle:
        head = handle.read(4)
    if head.startswith(GZIP_MAGIC):
        with gzip.open(path, "rb") as inner:
            text = _text_encoding(inner.read(4))
        return GZIP_ONLY + (f" {text[2]}" if text else "")
    text = _text_encoding(head)
    return text[2] if text else None


def not_utf8_text(path: Path) -> bool:
    """A file that is not UTF-8 text: gzip, or a NUL byte in its first 8 KiB (git's test for binary), which no UTF-8
    text holds and UTF-16/32 text does."""
    with Path(path).open("rb") as handle:
        head = handle.read(8192)
    return head.startswith(GZIP_MAGIC) or b"\x00" in head


def utf8_bytes(path: Path) -> bytes:
    """The file's content as UTF-8: decompressed, transcoded, its BOM dropped. Undecodable bytes
    become U+FFFD, so the record holding them is quarantined by the JSON parser, not the whole file."""
    data = Path(path).read_bytes()
    if data.startswith(GZIP_MAGIC):
        data = gzip.decompress(data)
    text = _text_encoding(data[:4])
    if text is None:
        return data
    codec, bom, _ = text
    return data[bom:].decode(codec, "replace").encode("utf-8")
