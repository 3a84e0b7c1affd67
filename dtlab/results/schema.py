"""The runs table: its schema version, DDL and append-only triggers, the upgrade of older stores on the
first write, and a row read back as a Run."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dtlab.cell import DEFAULT_DATA_PATH, Cell
from dtlab.errors import DtlabError
from dtlab.results.records import Run
from trainer import strategies

_SCHEMA_VERSION = 6
# 0: a new file; 1 to 5: read as they are and upgraded by the first write.
_READABLE_VERSIONS = (0, 1, 2, 3, 4, 5, _SCHEMA_VERSION)

# Columns each version added, by the version that added them: an upgrade adds the ones after its own.
_V2_COLUMNS = ("fault TEXT NOT NULL DEFAULT ''", "fault_record TEXT")
_V3_COLUMNS = (f"strategy TEXT NOT NULL DEFAULT '{strategies.DEFAULT}'",)
_V4_COLUMNS = ("model TEXT NOT NULL DEFAULT ''",)
_V5_COLUMNS = (f"data_path TEXT NOT NULL DEFAULT '{DEFAULT_DATA_PATH}'",)
_V6_COLUMNS = ("task TEXT NOT NULL DEFAULT ''", "task_plan TEXT")
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
    data_path       TEXT    NOT NULL DEFAULT 'loader',  -- the cell's data path (version 5)
    task            TEXT    NOT NULL DEFAULT '',  -- what the cell ran (cell.TASKS); '' trained (version 6)
    task_plan       TEXT,                      -- JSON: a search cell's plan (version 6)
    UNIQUE (cell_key, attempt)
)""",
    "CREATE INDEX IF NOT EXISTS runs_by_cell ON runs (cell_key, config_hash, status)",
    """CREATE TRIGGER IF NOT EXISTS runs_are_append_only_update BEFORE UPDATE ON runs
BEGIN SELECT RAISE(ABORT, 'dtlab results are append-only: recorded runs are never updated'); END""",
    """CREATE TRIGGER IF NOT EXISTS runs_are_append_only_delete BEFORE DELETE ON runs
BEGIN SELECT RAISE(ABORT, 'dtlab results are append-only: use ResultStore.delete_all(confirm=True)'); END""",
)


def _column(row: Mapping[str, Any], name: str) -> Any:
    """A column that an older store (read before its first write upgrades it) does not have."""
    return row[name] if name in row.keys() else None  # noqa: SIM118 (sqlite3.Row: `in` looks at values)


def ensure_schema(conn: sqlite3.Connection) -> None:
    """Bring the runs table to this version (inside the caller's write transaction)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == _SCHEMA_VERSION:
        return
    if version not in _READABLE_VERSIONS:
        raise DtlabError(
            f"results store: schema version {version}, this dtlab reads versions 1 to "
            f"{_SCHEMA_VERSION}; use the dtlab revision that wrote it"
        )
    # Every row kept: fault plans came with version 2 (two columns), strategies with version 3 and the
    # models axis with 4, data paths with 5 (one each, whose defaults read every earlier run as what it
    # was: a ddp run of its profile's model through the DataLoader), tasks with 6 (a training run).
    later = (_V2_COLUMNS, _V3_COLUMNS, _V4_COLUMNS, _V5_COLUMNS, _V6_COLUMNS)  # versions 2 to 6's
    added = sum(later[version - 1:], ()) if version >= 1 else ()
    for column in added:
        conn.execute(f"ALTER TABLE runs ADD COLUMN {column}")
    # Statement by statement: executescript would commit the open transaction first.
    for statement in _DDL:
        conn.execute(statement)
    conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")


def run_from_row(row: Mapping[str, Any], root: Path) -> Run:
    """A runs row as a Run; run_dir is relative to the store's root."""
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
        _column(row, "data_path") or DEFAULT_DATA_PATH,  # before version 5: the DataLoader's
        _column(row, "task") or "",  # before version 6: a training run
        json.loads(plan) if (plan := _column(row, "task_plan")) else {},
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
        run_dir=root / row["run_dir"],
        recorded_at=row["recorded_at"],
        fault_record=json.loads(record) if (record := _column(row, "fault_record")) else None,
    )
