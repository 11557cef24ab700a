"""Where a workspace lives: the DuckDB file, Prefect's home, run outputs and checkpoints.

A workspace is private to its owner (issue 20): Prefect's home holds its database, where the
encryption key of Secret blocks lies beside their ciphertext, and the store holds every
trajectory. Folders the project creates are 0700 and existing ones are made so; the store is 0600.
"""

import stat
from pathlib import Path

from pydantic import Field

from pipeline.config.base import Section
from pipeline.errors import UserFixableError

PRIVATE_FOLDER = 0o700
PRIVATE_FILE = 0o600


class OwnerLockedOut(UserFixableError):
    """An existing folder whose owner took their own read, write or search permission away (a workspace
    made read-only, 0555). Those bits are the user's: we close a folder to others, never open it to its
    owner (issue 29.2: `ingest` left a 0555 workspace 0700)."""

    def __init__(self, folder: Path, mode: int):
        super().__init__(
            f"cannot write {folder}: it is mode {mode:04o}, which withholds rwx from its owner, and an owner's own "
            f"permissions are theirs to change: `chmod u+rwx {folder}`, or set `workspace.path` to another folder"
        )


class NotAFolder(UserFixableError):
    """A workspace (or a folder in it) where a file is: its mode is no matter, and `chmod u+rwx` would not help."""

    def __init__(self, folder: Path):
        super().__init__(f"{folder} is a file, not a folder: set `workspace.path` to a folder, or move the file away")


def make_private(folder: Path) -> Path:
    """Create `folder`, and each missing parent, readable by its owner alone; an existing `folder`
    open to others is closed (a workspace made before issue 20 was 0755), and one its owner cannot
    write is refused (OwnerLockedOut), its mode left as it is. Returns it."""
    missing = [path for path in (folder, *folder.parents) if not path.exists()]
    for path in reversed(missing):
        path.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)  # exist_ok: another process may race us
    status = folder.stat()
    if not stat.S_ISDIR(status.st_mode):  # a file's 0644 read as a folder's was "chmod u+rwx" advice
        raise NotAFolder(folder)
    mode = stat.S_IMODE(status.st_mode)
    if mode & PRIVATE_FOLDER != PRIVATE_FOLDER:
        raise OwnerLockedOut(folder, mode)
    # Never a source checkout (a workspace or Prefect home placed at a repository's root): its modes are the
    # user's, and closing it locks other users out of the code (the sandbox's unprivileged test did). Never a
    # shared folder with the sticky bit (/tmp, /var/tmp): a store opened as /tmp/scratch.duckdb closed /tmp
    # to every other user, and the unprivileged tests with it.
    if mode & 0o077 and not mode & stat.S_ISVTX and not (folder / ".git").exists():
        folder.chmod(PRIVATE_FOLDER)
    return folder


def make_private_file(path: Path) -> None:
    """Close an existing file to everyone but its owner (files are created under the umask)."""
    if path.stat().st_mode & 0o077:
        path.chmod(PRIVATE_FILE)


class WorkspaceConfig(Section):
    path: Path = Field(
        default=Path("simulacra-workspace"),
        description="Folder holding the DuckDB store, Prefect's home, stage outputs and checkpoints. "
        "Relative paths resolve against the current folder, so every command works without a config file.",
    )
    database: str = Field(
        default="simulacra.duckdb",
        description="File name of the DuckDB store inside the workspace. One store per workspace.",
    )
    keep_resume_checkpoints: bool = Field(
        default=False,
        description="Keep a training stage's resume checkpoints (`runs/<stage>/<fingerprint>/trainer/checkpoint-*`: "
        "the weights with the optimizer's state, about 3x the model each, two kept) once the stage has completed. "
        "False deletes them then: the stage's model, metrics and registration are written first, a completed run "
        "is never resumed (a rerun returns its result), and the demo's five took 8 GB beside the 2.6 GB of the rest. "
        "True keeps them, to evaluate or continue from an intermediate step.",
    )

    @property
    def root(self) -> Path:
        return self.path.expanduser().resolve()

    @property
    def database_path(self) -> Path:
        return self.root / self.database

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"
