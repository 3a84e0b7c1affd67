"""The results store's SQLite file: where it is, whether it can be used (checked before a matrix and a
report), and the short-lived connections every read and write goes through."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dtlab.errors import DtlabError
from dtlab.results.schema import _READABLE_VERSIONS, _SCHEMA_VERSION, ensure_schema

DB_FILENAME = "dtlab.sqlite"
RUNS_DIRNAME = "runs"
_BUSY_TIMEOUT_S = 30.0
_SQLITE_HEADER = b"SQLite format 3\x00"


class ResultsDatabase:
    """The SQLite index of one results folder (and where its raw files go); ResultStore builds on it."""

    def __init__(self, path: str | os.PathLike[str]):
        path = Path(path)
        if path.suffix == ".sqlite":
            self.root, self.db_path = path.parent, path
        else:
            self.root, self.db_path = path, path / DB_FILENAME
        self.runs_dir = self.root / RUNS_DIRNAME

    # --- connections ---------------------------------------------------------

    def exists(self) -> bool:
        return self.db_path.is_file()

    def check(self, *, writable: bool) -> None:
        """Raise DtlabError (one line: the file and what to do) for a store that cannot be used: not a
        SQLite database, another schema version, or not writable when runs are to be recorded.

        Runs before a matrix starts and before a report reads; it never changes the file.
        """
        db = self.db_path
        if not db.exists():  # created on the first record: where it would go must take it
            if writable:
                existing = next(folder for folder in (db.parent, *db.parent.parents) if folder.exists())
                if not os.access(existing, os.W_OK | os.X_OK):
                    raise DtlabError(
                        f"results store {self.root}: cannot be written ({existing} is read-only for this "
                        "user); make it writable, or give DTLAB_RESULTS_DIR, then run again (nothing was "
                        "recorded)")
            return
        if not db.is_file():
            raise DtlabError(f"results store {db}: is not a file; move it aside and run again")
        with db.open("rb") as handle:
            header = handle.read(len(_SQLITE_HEADER))
        if header and header != _SQLITE_HEADER:
            raise self._corrupt("not a SQLite database")
        try:
            # immutable: no lock and no -shm file, so this reads even a store on a read-only mount
            readonly = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
            with contextlib.closing(readonly) as conn:
                problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
                version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as error:
            raise self._corrupt(str(error)) from None
        if problems != ["ok"]:
            raise self._corrupt(f"integrity check: {problems[0]}")
        if version not in _READABLE_VERSIONS:
            raise DtlabError(
                f"results store {db}: schema version {version}, this dtlab reads versions 1 to "
                f"{_SCHEMA_VERSION}; use the dtlab revision that wrote it, or move {self.root} aside "
                "to start a new store"
            )
        if writable:
            try:  # takes the write lock and gives it back: the database file is not changed
                connection = sqlite3.connect(db, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
                with contextlib.closing(connection) as conn:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("ROLLBACK")
            except sqlite3.OperationalError as error:
                raise DtlabError(
                    f"results store {db}: cannot be written ({error}); make {self.root} writable for this "
                    "user, then run again (nothing was recorded)"
                ) from None

    def _corrupt(self, why: str) -> DtlabError:
        broken = self.db_path.with_name(self.db_path.name + ".broken")
        return DtlabError(
            f"results store {self.db_path}: not a usable dtlab results database ({why}); move it aside "
            f"(mv {self.db_path} {broken}) and run again: the raw results in {self.runs_dir} stay"
        )

    @contextlib.contextmanager
    def _connect(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """One short-lived connection per operation; a write is one IMMEDIATE transaction."""
        if write:
            self.root.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.db_path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            self._use_wal(conn)
            conn.execute("PRAGMA synchronous=FULL")
            if write:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    ensure_schema(conn)
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            else:
                yield conn
        finally:
            conn.close()

    @staticmethod
    def _use_wal(conn: sqlite3.Connection) -> None:
        """WAL is a property of the database file, switched on once. The switch needs the file alone and
        fails at once, without SQLite's busy timeout, while another writer of a new store is mid-transaction
        ("database is locked", seen with 4 writers at load 2): so it is retried until the busy timeout."""
        deadline = time.monotonic() + _BUSY_TIMEOUT_S
        while True:
            try:
                if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                    return
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        if not self.exists():
            return []
        try:
            with self._connect(write=False) as conn:
                has_table = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name='runs'"
                ).fetchone()
                return conn.execute(sql, params).fetchall() if has_table else []
        except sqlite3.DatabaseError as error:
            raise self._corrupt(str(error)) from None
