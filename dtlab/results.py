"""The results store: every matrix cell's outcome, recorded once and never lost.

Layout, one folder per cluster (``dtlab.paths.results_dir_for(cluster_name)``)::

    results/<cluster>/
      dtlab.sqlite                        one row per attempt (SQLite, WAL, append-only)
      runs/<cell_key>/attempt-<n>/
        result.json                       the trainer's result (ok attempts)
        failure.json                      reason, node, exit code, log tail (failed attempts)
        logs/<node>.log                   per-node logs of that attempt

API (the harness, ``dtlab.bench``, is the writer; ``dtlab.report`` only reads)::

    from dtlab.cell import Cell
    from dtlab.results import ResultStore
    store = ResultStore.for_cluster("lab")            # or ResultStore(<results dir or .sqlite path>)
    cell = Cell("ddp", gpus=2, epochs=20, seed=3, profile="study", trainer_config={...})
    cell.key                                          # "ddp-g2-e20-s3": stable, file-name safe
    if not store.is_done(cell.key, config_hash):      # resume: an ok attempt with this hash exists?
        attempt = store.reserve_attempt(cell)         # Attempt(number, dir, log_dir): stream logs there
        ...run the cell...
        provenance = Provenance(config_hash=..., git_rev=..., inventory="lab",
                                node_versions={"node1": {...}}, log_dir=attempt.log_dir,
                                harness_time_s=123.4, attempt=attempt.number)
        store.record_ok(cell, result, provenance)
        # or on failure:
        store.record_failure(cell, provenance, reason="exit 1 on node2", node="node2", exit_code=1,
                             log_tail=[...])
    store.runs(status="ok")          # list[Run], oldest first; status=None for all, "failed" for failures
    store.latest_ok_runs(profile)    # one Run per cell key: its newest ok attempt (what the report uses)
    store.delete_all(confirm=True)   # the only way anything recorded goes away

Guarantees:
- Append-only: each attempt is a new row; SQLite triggers refuse UPDATE and DELETE on recorded
  runs, so a failure recorded after an ok result (or a ``--force`` rerun) adds, never replaces.
- Atomic: files are written to a temporary name and renamed; each row is one transaction, written
  after its files, so a crash leaves at most an unreferenced file, never a row without its JSON.
- Validated: an ok result must match ``trainer/result_schema.json`` and the cell (framework,
  epochs, seed) or ``record_ok`` raises ``DtlabError`` and records nothing.
- Attempt numbers are unique per cell key and allocated by the store (``reserve_attempt`` or
  ``attempt=None``); recording an attempt number that is already recorded raises ``DtlabError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from dtlab.cell import Cell
from dtlab.errors import DtlabError
from dtlab.files import atomic_copy, atomic_write_text
from dtlab.paths import results_dir_for
from trainer import result as trainer_result
from trainer import strategies

DB_FILENAME = "dtlab.sqlite"
RUNS_DIRNAME = "runs"
STATUSES = ("ok", "failed")
_SCHEMA_VERSION = 4
# 0: a new file; 1 to 3: read as they are and upgraded by the first write.
_READABLE_VERSIONS = (0, 1, 2, 3, _SCHEMA_VERSION)
_LOG_TAIL_LINES = 50
_BUSY_TIMEOUT_S = 30.0
_MAX_ATTEMPT_PROBES = 1000  # bounds the search for a free attempt directory
_SQLITE_HEADER = b"SQLite format 3\x00"

# Columns each version added, by the version that added them: an upgrade adds the ones after its own.
_V2_COLUMNS = ("fault TEXT NOT NULL DEFAULT ''", "fault_record TEXT")
_V3_COLUMNS = (f"strategy TEXT NOT NULL DEFAULT '{strategies.DEFAULT}'",)
_V4_COLUMNS = ("model TEXT NOT NULL DEFAULT ''",)
_DDL = (
    """CREATE TABLE IF NOT EXISTS runs (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    cell_key        TEXT    NOT NULL,
    attempt         INTEGER NOT NULL CHECK (attempt >= 1),
    framework       TEXT    NOT NULL,
    gpus            INTEGER NOT NULL,
    epochs          INTEGER NOT NULL,
    seed            INTEGER NOT NULL,
    profile         TEXT    NOT NULL,
    trainer_config  TEXT    NOT NULL,          -- JSON object
    config_hash     TEXT    NOT NULL,
    git_rev         TEXT,
    inventory       TEXT,
    node_versions   TEXT    NOT NULL,          -- JSON object
    status          TEXT    NOT NULL CHECK (status IN ('ok', 'failed')),
    reason          TEXT,
    failed_node     TEXT,
    exit_code       INTEGER,
    log_tail        TEXT,                      -- JSON list of lines
    harness_time_s  REAL,
    trainer_time_s  REAL,
    result_json     TEXT,                      -- the trainer's result (ok; optional partial on failure)
    run_dir         TEXT    NOT NULL,          -- relative to the store's root
    recorded_at     TEXT    NOT NULL,
    fault           TEXT    NOT NULL DEFAULT '',  -- the cell's fault plan (Fault.spec); '' undisturbed
    fault_record    TEXT,                      -- JSON: what the fault plan did in this attempt's run
    strategy        TEXT    NOT NULL DEFAULT 'ddp',  -- the cell's parallelism strategy (version 3)
    model           TEXT    NOT NULL DEFAULT '',  -- a run's models: entry; '' the profile's (version 4)
    UNIQUE (cell_key, attempt)
)""",
    "CREATE INDEX IF NOT EXISTS runs_by_cell ON runs (cell_key, config_hash, status)",
    """CREATE TRIGGER IF NOT EXISTS runs_are_append_only_update BEFORE UPDATE ON runs
BEGIN SELECT RAISE(ABORT, 'dtlab results are append-only: recorded runs are never updated'); END""",
    """CREATE TRIGGER IF NOT EXISTS runs_are_append_only_delete BEFORE DELETE ON runs
BEGIN SELECT RAISE(ABORT, 'dtlab results are append-only: use ResultStore.delete_all(confirm=True)'); END""",
)


@dataclass(frozen=True)
class Attempt:
    """A reserved attempt: its number and the folder its files (and live logs) go to."""

    cell_key: str
    number: int
    dir: Path

    @property
    def log_dir(self) -> Path:
        return self.dir / "logs"


@dataclass(frozen=True)
class Run:
    """One recorded attempt of one cell, as read back from the store."""

    id: int
    cell: Cell
    attempt: int
    status: str
    config_hash: str
    git_rev: str | None
    inventory: str | None
    node_versions: dict[str, Any]
    reason: str | None
    failed_node: str | None
    exit_code: int | None
    log_tail: list[str]
    harness_time_s: float | None
    trainer_time_s: float | None
    result: dict[str, Any] | None
    run_dir: Path
    recorded_at: str
    # What a fault plan did in this attempt's run (dtlab.faults.FaultRecord.as_dict); None otherwise.
    fault_record: dict[str, Any] | None = None

    @property
    def cell_key(self) -> str:
        return self.cell.key

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"


@cache
def _result_validator():
    import jsonschema

    return jsonschema.Draft202012Validator(trainer_result.load_schema())


def _column(row: Mapping[str, Any], name: str) -> Any:
    """A column that an older store (read before its first write upgrades it) does not have."""
    return row[name] if name in row.keys() else None  # noqa: SIM118 (sqlite3.Row: `in` looks at values)


def validate_result(result: Mapping[str, Any], *, where: str = "result") -> None:
    """Raise DtlabError naming the first schema violation of a trainer result."""
    errors = sorted(_result_validator().iter_errors(result), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        location = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise DtlabError(
            f"{where}: {location}: {first.message}{more}; "
            "the trainer must write JSON matching trainer/result_schema.json"
        )


def newest_per_cell(runs: Iterable[Run], profile: str | None = None) -> list[Run]:
    """The newest of the given runs for each cell key (of one profile, if given), oldest cell first."""
    newest: dict[str, Run] = {}
    for run in sorted(runs, key=lambda run: run.id):
        if profile is None or run.cell.profile == profile:
            newest[run.cell_key] = run
    return sorted(newest.values(), key=lambda run: run.id)


def result_strategy(result: Mapping[str, Any]) -> str:
    """The strategy a trainer result says it trained with; results from before strategies: the default."""
    return (result.get("hyperparameters") or {}).get("strategy", strategies.DEFAULT)


def unreadable_reason(run: Run) -> str | None:
    """Why an ok run's stored result cannot be reported (a field missing or malformed), or None."""
    if run.status != "ok":
        return None
    if not isinstance(run.result, Mapping):
        return "no result JSON"
    try:
        validate_result(run.result, where="result")
    except DtlabError as error:
        return str(error).removeprefix("result: ").split("; the trainer must")[0]
    return None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _tail(lines: str | Sequence[str] | None) -> list[str]:
    if lines is None:
        return []
    if isinstance(lines, str):
        lines = lines.splitlines()
    return [str(line) for line in lines][-_LOG_TAIL_LINES:]


@dataclass(frozen=True)
class Provenance:
    """What every recorded attempt carries, ok or failed: the config it ran (its hash), the code (git
    revision), the cluster (inventory name, each node's environment), its logs, how long the harness
    took, which attempt it was (None: the next free one), and its fault record (faulted cells)."""

    config_hash: str
    git_rev: str | None
    inventory: str | None
    node_versions: Mapping[str, Any] | None = None
    log_dir: str | os.PathLike[str] | None = None
    harness_time_s: float | None = None
    attempt: int | None = None
    fault_record: Mapping[str, Any] | None = None


class ResultStore:
    """SQLite index plus raw files under one results folder. See the module docstring."""

    def __init__(self, path: str | os.PathLike[str]):
        path = Path(path)
        if path.suffix == ".sqlite":
            self.root, self.db_path = path.parent, path
        else:
            self.root, self.db_path = path, path / DB_FILENAME
        self.runs_dir = self.root / RUNS_DIRNAME

    @classmethod
    def for_cluster(cls, cluster_name: str) -> ResultStore:
        return cls(results_dir_for(cluster_name))

    def __repr__(self) -> str:
        return f"ResultStore({str(self.root)!r})"

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
                    self._ensure_schema(conn)
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

    @staticmethod
    def _ensure_schema(conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == _SCHEMA_VERSION:
            return
        if version not in _READABLE_VERSIONS:
            raise DtlabError(
                f"results store: schema version {version}, this dtlab reads versions 1 to "
                f"{_SCHEMA_VERSION}; use the dtlab revision that wrote it"
            )
        # Every row kept: fault plans came with version 2 (two columns), strategies with version 3 and the
        # models axis with 4 (one each, whose defaults read every earlier run as what it was: a ddp run
        # of its profile's model).
        added = {1: _V2_COLUMNS + _V3_COLUMNS + _V4_COLUMNS, 2: _V3_COLUMNS + _V4_COLUMNS,
                 3: _V4_COLUMNS}.get(version, ())
        for column in added:
            conn.execute(f"ALTER TABLE runs ADD COLUMN {column}")
        # Statement by statement: executescript would commit the open transaction first.
        for statement in _DDL:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")

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

    # --- attempts ------------------------------------------------------------

    def _attempt_dir(self, cell_key: str, number: int) -> Path:
        return self.runs_dir / cell_key / f"attempt-{number}"

    def _recorded_attempts(self, cell_key: str) -> set[int]:
        return {
            row["attempt"] for row in self._read("SELECT attempt FROM runs WHERE cell_key=?", (cell_key,))
        }

    def reserve_attempt(self, cell: Cell) -> Attempt:
        """Claim the next attempt number for a cell by creating its folder (mkdir is atomic)."""
        recorded = self._recorded_attempts(cell.key)
        number = max(recorded, default=0) + 1
        for _ in range(_MAX_ATTEMPT_PROBES):
            folder = self._attempt_dir(cell.key, number)
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                folder.mkdir()
            except FileExistsError:
                number += 1
                continue
            (folder / "logs").mkdir()
            return Attempt(cell.key, number, folder)
        raise DtlabError(
            f"results store {self.root}: no free attempt folder for {cell.key} after "
            f"{_MAX_ATTEMPT_PROBES} tries; clean stray folders under {self.runs_dir / cell.key}"
        )

    # --- writing -------------------------------------------------------------

    def record_ok(self, cell: Cell, result: Mapping[str, Any], provenance: Provenance) -> Run:
        """Record a successful attempt; the result is validated against the schema and the cell first."""
        where = f"results: {cell.key} result.json"
        validate_result(result, where=where)
        for name in ("framework", "epochs", "seed"):
            if result[name] != getattr(cell, name):
                raise DtlabError(
                    f"{where}: {name} is {result[name]!r} but the cell has "
                    f"{getattr(cell, name)!r}; record the result under its own cell"
                )
        trained = result_strategy(result)
        if trained != cell.strategy:
            raise DtlabError(
                f"{where}: strategy is {trained!r} but the cell has {cell.strategy!r}; "
                "record the result under its own cell"
            )
        trained_model = (result.get("hyperparameters") or {}).get("model")
        if cell.model and trained_model != cell.model:
            raise DtlabError(
                f"{where}: model is {trained_model!r} but the cell has {cell.model!r}; "
                "record the result under its own cell"
            )
        return self._record(cell, "ok", provenance, result=dict(result),
                            trainer_time_s=float(result["time_total_s"]))

    def record_failure(
        self,
        cell: Cell,
        provenance: Provenance,
        *,
        reason: str,
        node: str | None = None,
        exit_code: int | None = None,
        log_tail: str | Sequence[str] | None = None,
        trainer_time_s: float | None = None,
    ) -> Run:
        """Record a failed attempt: why, on which node, its exit code and last log lines."""
        if not reason:
            raise DtlabError(f"results: {cell.key}: a failure needs a reason; pass reason=...")
        return self._record(cell, "failed", provenance, result=None, trainer_time_s=trainer_time_s,
                            reason=reason, node=node, exit_code=exit_code, log_tail=_tail(log_tail))

    def _record(
        self,
        cell: Cell,
        status: str,
        provenance: Provenance,
        *,
        result: dict[str, Any] | None,
        trainer_time_s: float | None,
        reason: str | None = None,
        node: str | None = None,
        exit_code: int | None = None,
        log_tail: list[str] | None = None,
    ) -> Run:
        config_hash, attempt = provenance.config_hash, provenance.attempt
        fault_record = provenance.fault_record
        if not config_hash:
            raise DtlabError(f"results: {cell.key}: config_hash is empty; pass the cell's config hash")
        if attempt is None:
            folder = self.reserve_attempt(cell).dir
            attempt = int(folder.name.removeprefix("attempt-"))
        else:
            if attempt < 1:
                raise DtlabError(f"results: {cell.key}: attempt must be >= 1, got {attempt}")
            if attempt in self._recorded_attempts(cell.key):
                raise DtlabError(
                    f"results: {cell.key} attempt {attempt} is already recorded; "
                    "use store.reserve_attempt(cell) for a new attempt number"
                )
            folder = self._attempt_dir(cell.key, attempt)
            folder.mkdir(parents=True, exist_ok=True)
        self._collect_logs(provenance.log_dir, folder / "logs")
        recorded_at = _now()
        if result is not None:
            atomic_write_text(folder / "result.json", json.dumps(result, indent=2, sort_keys=True) + "\n")
        if status == "failed":
            failure = {
                "cell": cell.to_dict(),
                "attempt": attempt,
                "reason": reason,
                "node": node,
                "exit_code": exit_code,
                "log_tail": log_tail,
                "recorded_at": recorded_at,
            }
            atomic_write_text(folder / "failure.json", json.dumps(failure, indent=2) + "\n")
        row = {
            "cell_key": cell.key,
            "attempt": attempt,
            "framework": cell.framework,
            "gpus": cell.gpus,
            "epochs": cell.epochs,
            "seed": cell.seed,
            "profile": cell.profile,
            "trainer_config": json.dumps(dict(cell.trainer_config), sort_keys=True),
            "config_hash": config_hash,
            "git_rev": provenance.git_rev,
            "inventory": provenance.inventory,
            "node_versions": json.dumps(dict(provenance.node_versions or {}), sort_keys=True),
            "status": status,
            "reason": reason,
            "failed_node": node,
            "exit_code": exit_code,
            "log_tail": json.dumps(log_tail or []),
            "harness_time_s": provenance.harness_time_s,
            "trainer_time_s": trainer_time_s,
            "result_json": json.dumps(result, sort_keys=True) if result is not None else None,
            "run_dir": str(folder.relative_to(self.root)),
            "recorded_at": recorded_at,
            "fault": cell.fault,
            "fault_record": json.dumps(dict(fault_record), sort_keys=True) if fault_record else None,
            "strategy": cell.strategy,
            "model": cell.model,
        }
        columns = ", ".join(row)
        placeholders = ", ".join(f":{name}" for name in row)
        try:
            with self._connect(write=True) as conn:
                cursor = conn.execute(f"INSERT INTO runs ({columns}) VALUES ({placeholders})", row)
                row_id = cursor.lastrowid
        except sqlite3.IntegrityError as error:
            raise DtlabError(
                f"results: {cell.key} attempt {attempt}: {error}; "
                "reserve a new attempt with store.reserve_attempt(cell)"
            ) from error
        return self._run_from_row({**row, "id": row_id})

    @staticmethod
    def _collect_logs(log_dir: str | os.PathLike[str] | None, target: Path) -> None:
        """Copy an attempt's logs into its folder unless they were streamed there already."""
        target.mkdir(parents=True, exist_ok=True)
        if log_dir is None:
            return
        source = Path(log_dir)
        if not source.is_dir():
            raise DtlabError(f"results: log_dir {source} is not a folder; pass the folder holding <node>.log")
        if source.resolve() == target.resolve():
            return
        for log in sorted(source.iterdir()):
            if log.is_file():
                atomic_copy(log, target / log.name)

    def delete_all(self, *, confirm: bool = False) -> None:
        """Delete every recorded run of this cluster: the database and runs/. Needs confirm=True."""
        if confirm is not True:
            raise DtlabError(
                f"results store {self.root}: delete_all needs confirm=True; "
                "recorded results are otherwise never deleted"
            )
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{self.db_path}{suffix}").unlink()
        shutil.rmtree(self.runs_dir, ignore_errors=True)

    # --- reading -------------------------------------------------------------

    def is_done(self, cell_key: str | Cell, config_hash: str) -> bool:
        """True when the cell has an ok attempt recorded for exactly this config hash."""
        key = cell_key.key if isinstance(cell_key, Cell) else cell_key
        rows = self._read(
            "SELECT 1 FROM runs WHERE cell_key=? AND config_hash=? AND status='ok' LIMIT 1",
            (key, config_hash),
        )
        return bool(rows)

    def runs(self, status: str | None = "ok", *, cell_key: str | None = None) -> list[Run]:
        """Recorded attempts, oldest first; status "ok", "failed" or None for both."""
        if status is not None and status not in STATUSES:
            raise DtlabError(f"results: status must be one of {STATUSES} or None, got {status!r}")
        clauses, params = [], []
        if status is not None:
            clauses.append("status=?")
            params.append(status)
        if cell_key is not None:
            clauses.append("cell_key=?")
            params.append(cell_key)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return [
            self._run_from_row(dict(row))
            for row in self._read(f"SELECT * FROM runs {where} ORDER BY id", params)
        ]

    def latest_ok_runs(self, profile: str | None = None) -> list[Run]:
        """The newest ok attempt of each cell key (of one profile, if given); older ones stay recorded."""
        return newest_per_cell(self.runs("ok"), profile)

    def _run_from_row(self, row: Mapping[str, Any]) -> Run:
        cell = Cell(
            row["framework"],
            row["gpus"],
            row["epochs"],
            row["seed"],
            row["profile"],
            json.loads(row["trainer_config"]),
            _column(row, "fault") or "",
            _column(row, "strategy") or strategies.DEFAULT,  # a store before version 3: ddp
            _column(row, "model") or "",  # before version 4: the profile's model
        )
        return Run(
            id=row["id"],
            cell=cell,
            attempt=row["attempt"],
            status=row["status"],
            config_hash=row["config_hash"],
            git_rev=row["git_rev"],
            inventory=row["inventory"],
            node_versions=json.loads(row["node_versions"]),
            reason=row["reason"],
            failed_node=row["failed_node"],
            exit_code=row["exit_code"],
            log_tail=json.loads(row["log_tail"] or "[]"),
            harness_time_s=row["harness_time_s"],
            trainer_time_s=row["trainer_time_s"],
            result=json.loads(row["result_json"]) if row["result_json"] else None,
            run_dir=self.root / row["run_dir"],
            recorded_at=row["recorded_at"],
            fault_record=json.loads(record) if (record := _column(row, "fault_record")) else None,
        )
