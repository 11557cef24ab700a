"""Expanding what the user points ingestion at (files, folders, globs, `hf://` datasets) into inputs.

An input is one file, or one Hugging Face dataset split; each has an identity (path) and a
content digest, which is how the nightly refresh knows a file is unchanged.
"""

import glob
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import UserFixableError
from pipeline.formats.base import Document, iter_documents

# Files ingestion reads when given a folder; licences, READMEs and configs beside the data are not data.
DATA_SUFFIXES = {".json", ".jsonl", ".ndjson", ".traj", ".txt", ".log", ".parquet", ".yaml", ".yml"}
SKIPPED_NAMES = {"license", "license.txt", "license.md", "readme.md", "readme.txt", "notice", "notice.txt"}


class InputNotFound(UserFixableError, FileNotFoundError):
    pass


@dataclass(frozen=True)
class Input:
    path: str
    size_bytes: int

    @property
    def is_hf(self) -> bool:
        return self.path.startswith("hf://")

    def digest(self) -> str:
        if self.is_hf:
            return _hf_dataset(self.path)._fingerprint
        sha = hashlib.sha256()
        with open(self.path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                sha.update(block)
        return sha.hexdigest()

    def documents(self) -> Iterator:
        if self.is_hf:
            for row, item in enumerate(_hf_dataset(self.path)):
                yield Document(f"{self.path}#row={row}", item)
        else:
            yield from iter_documents(Path(self.path))


def _hf_dataset(uri: str):
    """`hf://name[:split]` through `datasets` (which also reads its local cache when offline)."""
    import datasets

    name, _, split = uri.removeprefix("hf://").partition(":")
    return datasets.load_dataset(name, split=split or "train")


@dataclass(frozen=True)
class NotRead:
    """A path ingestion was pointed at (or found in a folder) and could not read, and why."""

    path: str
    reason: str


def expand(spec: str, not_read: list[NotRead] | None = None) -> list[Input]:
    """The inputs a path, folder, glob or hf:// URI stands for, in a stable order. A folder that
    cannot be listed is appended to `not_read` with the reason (pathlib's rglob skips it silently)."""
    if spec.startswith("hf://"):
        return [Input(spec, 0)]
    path = Path(spec).expanduser()
    if path.is_file():
        return [Input(str(path), path.stat().st_size)]
    if path.is_dir():
        files = sorted(_folder_files(path, not_read if not_read is not None else []))
    else:
        files = sorted(Path(p) for p in glob.glob(spec, recursive=True) if _is_data_file(Path(p)))
    if not files and not path.is_dir():
        raise InputNotFound(f"{spec}: no such file, folder or glob match")
    return [Input(str(p), p.stat().st_size) for p in files]


def _folder_files(folder: Path, not_read: list[NotRead]) -> Iterator[Path]:
    def unlisted(error: OSError) -> None:
        not_read.append(NotRead(str(error.filename), error.strerror or str(error)))

    for root, _, names in os.walk(folder, onerror=unlisted, followlinks=True):
        for name in names:
            if _is_data_file(candidate := Path(root) / name):
                yield candidate


def _is_data_file(path: Path) -> bool:
    return (
        path.is_file()
        and path.suffix.lower() in DATA_SUFFIXES
        and path.name.lower() not in SKIPPED_NAMES
        and not any(part.startswith(".") for part in path.parts[-1:])
    )
