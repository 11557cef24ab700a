"""Expanding what the user points ingestion at (files, folders, globs, `hf://` datasets) into inputs.

An input is one file, or one Hugging Face dataset split; each has an identity (path) and a
content digest, which is how the nightly refresh knows a file is unchanged.
"""

import errno
import glob
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import UserFixableError
from pipeline.formats.base import Document, iter_documents
from pipeline.formats.file_encoding import content_suffix

# Files ingestion reads when given a folder; licences, READMEs and configs beside the data are not data.
DATA_SUFFIXES = {".json", ".jsonl", ".ndjson", ".traj", ".txt", ".log", ".parquet", ".yaml", ".yml"}
SKIPPED_NAMES = {"license", "license.txt", "license.md", "readme.md", "readme.txt", "notice", "notice.txt"}


class InputNotFound(UserFixableError, FileNotFoundError):
    pass


class NotAFile(UserFixableError):
    """A path that is there but holds no file to read: a named pipe (opening it would wait for a writer),
    a socket, a device, a symbolic link loop."""


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


@dataclass(frozen=True)
class Skipped:
    """A path a folder walk passed over on purpose, and why: a link back into a folder already walked,
    another name of a file already read, a link loop. Nothing for the user to fix."""

    path: str
    reason: str


def expand(spec: str, not_read: list[NotRead] | None = None, skipped: list[Skipped] | None = None) -> list[Input]:
    """The inputs a path, folder, glob or hf:// URI stands for, in a stable order. A folder that
    cannot be listed is appended to `not_read` with the reason (pathlib's rglob skips it silently);
    what a folder walk passes over on purpose, to `skipped`."""
    if spec.startswith("hf://"):
        return [Input(spec, 0)]
    path = Path(spec).expanduser()
    if path.is_file():
        return [Input(str(path), path.stat().st_size)]
    if path.is_dir():
        not_read, skipped = (not_read if not_read is not None else []), (skipped if skipped is not None else [])
        files = sorted(_folder_files(path, not_read, skipped))
    else:
        files = sorted(Path(p) for p in glob.glob(spec, recursive=True) if _is_data_file(Path(p)))
    if not files and not path.is_dir():
        if (what := _not_a_file(path)) is not None:
            raise NotAFile(f"{spec}: {what}: not read")
        raise InputNotFound(f"{spec}: no such file, folder or glob match")
    return [Input(str(p), p.stat().st_size) for p in files]


def expand_source(
    spec: str, name: str | None, not_read: list[NotRead] | None = None, skipped: list[Skipped] | None = None
) -> list[Input]:
    """`expand(spec)`, for a configured source when `name` is given: a path that names nothing readable is said with
    the source it belongs to. Under `simulacra run` the bare "/data/...: no such file" did not say it came from the
    config, nor which source to correct."""
    try:
        return expand(spec, not_read, skipped)
    except (InputNotFound, NotAFile) as exc:
        if name is None:
            raise
        raise type(exc)(
            f"source `{name}` (ingest.sources): {exc}: correct its `path` in the config, or remove it"
        ) from None


def _not_a_file(path: Path) -> str | None:
    """What a path is that exists but is neither a file nor a folder; None when it is not there."""
    if _loops(path):
        return "a symbolic link loop (it never reaches a file)"
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO), not a file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    return None


def _folder_files(folder: Path, not_read: list[NotRead], skipped: list[Skipped]) -> Iterator[Path]:
    """The data files under `folder`, links followed, each real folder and file once (by device and
    inode): os.walk follows a link back into a folder it is walking (`data/self -> .`) until the path
    grows too long, and read one file 41 times (issue 29.1). Names are walked sorted, so which of two
    names of one file is read does not depend on the order the file system lists them in."""

    def unlisted(error: OSError) -> None:
        not_read.append(NotRead(str(error.filename), error.strerror or str(error)))

    walked = {_identity(folder): folder}
    read: dict[tuple[int, int], Path] = {}
    for root, subfolders, names in os.walk(folder, onerror=unlisted, followlinks=True):
        here = Path(root)
        kept = []
        for name in sorted(subfolders):
            if name.startswith("."):
                # A hidden folder is a tool's, not the user's data: `.git`, `.venv`'s packages' JSON, and
                # `.ipynb_checkpoints`, whose stale copies of the data files were read as trajectories of their own.
                continue
            try:
                identity = _identity(here / name)
            except OSError as exc:
                unlisted(exc)
                continue
            if identity in walked:
                skipped.append(Skipped(str(here / name), _second_visit(here / name, walked[identity], "folder")))
            else:
                walked[identity] = here / name
                kept.append(name)
        subfolders[:] = kept  # os.walk descends into what is left here
        for name in sorted(names):
            candidate = here / name
            if is_data_name(candidate) and _loops(candidate):
                skipped.append(Skipped(str(candidate), "a symbolic link loop: not read"))
                continue
            if not _is_data_file(candidate):
                continue
            identity = _identity(candidate)
            if identity in read:
                skipped.append(Skipped(str(candidate), _second_visit(candidate, read[identity], "file")))
                continue
            read[identity] = candidate
            yield candidate


def _loops(path: Path) -> bool:
    """Whether following `path`'s links never ends (`a -> b -> a`); pathlib's is_file says False and no more."""
    try:
        path.stat()
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _identity(path: Path) -> tuple[int, int]:
    """Device and inode of what `path` leads to, links followed: one per real folder or file."""
    status = path.stat()
    return status.st_dev, status.st_ino


def _second_visit(path: Path, first: Path, kind: str) -> str:
    if kind == "folder" and first in path.parents:
        return f"a link back to {first}, which holds it: a loop, not followed"
    return f"the same {kind} as {first}: read once"


def _is_data_file(path: Path) -> bool:
    return path.is_file() and is_data_name(path)


def visible_files(folder: Path) -> Iterator[Path]:
    """The files under `folder` that are not hidden nor in a hidden folder, as `expand`'s walk reads them, in the walk's
    order: for the walks that read other kinds of file (world-knowledge documents, the tiny model's tokenizer text)."""
    for root, subfolders, names in os.walk(folder):
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        for name in sorted(names):
            if not name.startswith(".") and (Path(root) / name).is_file():
                yield Path(root) / name


def is_data_name(path: Path) -> bool:
    """A name a folder's walk reads: a data suffix (`.gz` over one too), not a licence or README, not hidden."""
    return (
        content_suffix(path) in DATA_SUFFIXES
        and path.name.lower() not in SKIPPED_NAMES
        and not any(part.startswith(".") for part in path.parts[-1:])
    )
