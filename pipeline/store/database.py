"""The DuckDB store: one file per workspace, migrated on open, written in short transactions.

DuckDB lets one read-write process hold a file, exclusively (STACK.md). Every command therefore
opens the store for as long as it needs it, retries while another process holds the lock, and
training reads Parquet snapshots instead of the live file.
"""

import errno
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from pipeline.config.workspace import make_private, make_private_file
from pipeline.errors import UserFixableError
from pipeline.store.migrations import MIGRATIONS, RowSweep

log = logging.getLogger(__name__)


class StoreBusy(UserFixableError):
    """Another process held the store's lock for longer than we were willing to wait."""


def _is_lock_error(exc: Exception) -> bool:
    return "lock" in str(exc).lower()


# How DuckDB says a file is not a store it can read: not DuckDB's at all (an empty file too), cut short by a copy or
# a full disk, a block whose checksum fails (seen at open, where the catalog is read).
_DAMAGED = ("not a valid DuckDB database file", "Could not read enough bytes", "Corrupt database file")


def _damaged(exc: Exception) -> bool:
    return any(words in str(exc) for words in _DAMAGED)


class Store:
    def __init__(
        self, path: Path | str, read_only: bool = False, lock_timeout_s: float = 120.0, existing: bool = False
    ):
        """`existing`: the store must be there already (what a stage after ingest reads), else one line naming the
        fix, not an empty store created where a mistyped `workspace.path` or another directory led."""
        self.path = Path(path)
        self.read_only = read_only
        self.existing = existing or read_only
        self.lock_timeout_s = lock_timeout_s
        self._connection: duckdb.DuckDBPyConnection | None = None

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        if self._connection is None:
            self._connection = self._open()
            if self.read_only:
                self._require_migrated()
            else:
                self.migrate()
        return self._connection

    def _open(self) -> duckdb.DuckDBPyConnection:
        if str(self.path) == ":memory:":  # DuckDB's in-memory database: no file, nothing to keep private
            return duckdb.connect(":memory:")
        if self.existing and not self.path.is_file():
            under = next((folder for folder in self.path.parents if folder.exists()), None)
            if under is not None and not under.is_dir():  # `workspace.path` through a file: no store can be there
                raise self._unwritable(os.strerror(errno.ENOTDIR))
            raise UserFixableError(f"no store at {self.path}: run `simulacra ingest` first (or check `workspace.path`)")
        if not self.read_only:
            try:
                make_private(self.path.parent)  # the workspace (config/workspace.py)
            except OSError as exc:
                raise self._unwritable(exc.strerror or str(exc)) from None
        deadline = time.monotonic() + self.lock_timeout_s
        delay = 0.05
        while True:
            try:
                connection = duckdb.connect(str(self.path), read_only=self.read_only)
                if not self.read_only:
                    make_private_file(self.path)
                return connection
            except duckdb.Error as exc:
                if _damaged(exc):
                    raise self._damaged_store(exc) from None
                if not isinstance(exc, duckdb.IOException):
                    raise
                if "permission denied" in str(exc).lower() or "read-only file system" in str(exc).lower():
                    raise self._unwritable(
                        "permission denied" if "permission" in str(exc).lower() else "read-only file system"
                    ) from None
                if _is_lock_error(exc) and delay == 0.05:  # once: the wait may be minutes, and silent it looked hung
                    log.warning(
                        "%s is held by another process (DuckDB allows one writer): waiting up to %.0fs for it",
                        self.path,
                        self.lock_timeout_s,
                    )
                if not _is_lock_error(exc) or time.monotonic() > deadline:
                    if _is_lock_error(exc):
                        raise StoreBusy(
                            f"{self.path} is held by another process (DuckDB allows one writer); "
                            f"gave up after {self.lock_timeout_s:.0f}s: rerun once that process has finished"
                        ) from exc
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _damaged_store(self, exc: Exception) -> UserFixableError:
        said = str(exc).split("\n")[0].removeprefix("IO Error: ")
        return UserFixableError(
            f"the store {self.path} is damaged or not a DuckDB file ({said}): restore it from a backup, or move it "
            "aside and run `simulacra ingest` again"
        )

    def _unwritable(self, reason: str) -> UserFixableError:
        return UserFixableError(
            f"cannot write the store {self.path} ({reason}): set `workspace.path` to a folder you can write, "
            "or fix its permissions"
        )

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def migrate(self) -> list[int]:
        """Apply the migrations this file has not seen; returns the versions applied."""
        con = self._connection
        assert con is not None
        con.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)"
        )
        done = {row[0] for row in con.execute("SELECT version FROM schema_migrations").fetchall()}
        self._refuse_newer(done)
        applied = []
        for version, name, statements in MIGRATIONS:
            if version in done:
                continue
            with self.transaction() as tx:
                for statement in statements:
                    if isinstance(statement, RowSweep):
                        [(has_rows,)] = tx.execute(f"SELECT EXISTS (SELECT 1 FROM {statement.table})").fetchall()
                        if has_rows:
                            tx.execute(statement.sql)
                    else:
                        tx.execute(statement)
                tx.execute("INSERT INTO schema_migrations VALUES (?, ?, now())", [version, name])
            applied.append(version)
        return applied

    def _refuse_newer(self, done: set[int]) -> None:
        """A store a newer simulacra migrated holds tables this one does not know the meaning of: writing old rows
        into it, or reading it as the old schema, would go wrong without a word."""
        known = max(version for version, _, _ in MIGRATIONS)
        unknown = sorted(version for version in done if version > known)
        if unknown:
            self.close()
            raise UserFixableError(
                f"{self.path} was migrated by a newer simulacra (schema version {unknown[-1]}; this one knows up to "
                f"{known}): upgrade simulacra (`git pull`, then `make`), or set `workspace.path` to another folder"
            )

    def _require_migrated(self) -> None:
        """A reader cannot migrate: a store an older version wrote must be opened for writing first."""
        assert self._connection is not None  # called by .connection once it has opened it
        done = {row[0] for row in self._connection.execute("SELECT version FROM schema_migrations").fetchall()}
        self._refuse_newer(done)
        pending = [f"{version} ({name})" for version, name, _ in MIGRATIONS if version not in done]
        if pending:
            self.close()
            raise UserFixableError(
                f"{self.path} lacks migration(s) {', '.join(pending)}, and a read-only command cannot apply them: "
                "run a command that writes to it first (e.g. `simulacra split`)"
            )

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """All-or-nothing: a process killed inside leaves the store as it was before."""
        con = self.connection
        con.execute("BEGIN TRANSACTION")
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    def execute(self, sql: str, parameters: list[Any] | None = None) -> duckdb.DuckDBPyConnection:
        return self.connection.execute(sql, parameters or [])

    def rows(self, sql: str, parameters: list[Any] | None = None) -> list[dict[str, Any]]:
        cursor = self.connection.execute(sql, parameters or [])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def scalar(self, sql: str, parameters: list[Any] | None = None) -> Any:
        # fetchall, not fetchone: a result read to its end leaves the connection free for `register` and `sql`
        # (DuckDB refuses them while an execute()'s result is unfinished).
        rows = self.connection.execute(sql, parameters or []).fetchall()
        return rows[0][0] if rows else None

    def table_fingerprint(self, relation: str, key_columns: str) -> str:
        """Order-independent digest of a relation's keys: changes when rows are added or removed, or a
        key column changes. Each row's hash is hashed again before the XOR: DuckDB folds the last of
        several columns into `hash(a, b, c)` by XOR, so the same change of that column in an even number
        of rows (two turns' keep ratio 1 -> 0, two trajectories moved between the same pools) cancelled
        out of a plain `bit_xor(hash(...))`, and a stage went on with data it should have recomputed."""
        count, digest = self.connection.execute(  # type: ignore[misc]  # an aggregate: one row
            f"SELECT count(*), coalesce(bit_xor(hash(hash({key_columns}))), 0) FROM {relation}"
        ).fetchone()
        return f"{count}:{digest:x}"


def open_store(config: Any, read_only: bool = False, existing: bool = False) -> Store:
    """The store of a config's workspace; `existing`: refused when there is none yet (Store)."""
    return Store(config.workspace.database_path, read_only=read_only, existing=existing)
