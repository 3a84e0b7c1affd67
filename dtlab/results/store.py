"""The ResultStore: reserving attempts, recording ok and failed ones (files first, then one row),
reading recorded runs back, and deleting everything on request. The API is in dtlab.results' docstring."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dtlab.cell import DEFAULT_DATA_PATH, Cell
from dtlab.errors import DtlabError
from dtlab.files import atomic_copy, atomic_write_text
from dtlab.paths import results_dir_for
from dtlab.results import mlperf_log
from dtlab.results.database import ResultsDatabase
from dtlab.results.records import (
    SERVE_FILE_NAME,
    Attempt,
    Provenance,
    Run,
    newest_per_cell,
    result_strategy,
    validate_result,
    validate_search_result,
    validate_serve_result,
)
from dtlab.results.schema import run_from_row
from trainer.search import SEARCH_FILE_NAME

STATUSES = ("ok", "failed")
_LOG_TAIL_LINES = 50
_MAX_ATTEMPT_PROBES = 1000  # bounds the search for a free attempt directory


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _tail(lines: str | Sequence[str] | None) -> list[str]:
    if lines is None:
        return []
    if isinstance(lines, str):
        lines = lines.splitlines()
    return [str(line) for line in lines][-_LOG_TAIL_LINES:]


class ResultStore(ResultsDatabase):
    """SQLite index plus raw files under one results folder. See dtlab.results' docstring."""

    @classmethod
    def for_cluster(cls, cluster_name: str) -> ResultStore:
        return cls(results_dir_for(cluster_name))

    def __repr__(self) -> str:
        return f"ResultStore({str(self.root)!r})"

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
        """Record a successful attempt; the result is validated against the schema and the cell first (a
        search cell's search.json against its cell)."""
        if cell.search or cell.trained:
            if cell.search:
                validate_search_result(result, cell, f"results: {cell.key} {SEARCH_FILE_NAME}")
            else:
                validate_serve_result(result, cell, f"results: {cell.key} {SERVE_FILE_NAME}")
            return self._record(cell, "ok", provenance, result=dict(result),
                                trainer_time_s=float(result["wall_s"]))
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
        trained_path = (result.get("config") or {}).get("data_path", DEFAULT_DATA_PATH)
        if trained_path != cell.data_path:
            raise DtlabError(
                f"{where}: data_path is {trained_path!r} but the cell has {cell.data_path!r}; "
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
        if result is not None and (cell.search or cell.trained):  # their own files: no MLPerf training runs
            name = SEARCH_FILE_NAME if cell.search else SERVE_FILE_NAME
            atomic_write_text(folder / name, json.dumps(result, indent=2, sort_keys=True) + "\n")
        elif result is not None:
            atomic_write_text(folder / "result.json", json.dumps(result, indent=2, sort_keys=True) + "\n")
            # The same run in MLPerf's log format, beside it (dtlab.results.mlperf_log).
            atomic_write_text(folder / mlperf_log.FILENAME, mlperf_log.log_text(
                result, system=mlperf_log.system_name(provenance.inventory, cell),
                target_accuracy=provenance.target_accuracy))
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
            "data_path": cell.data_path,
            "task": cell.task,
            "task_plan": json.dumps(dict(cell.task_plan), sort_keys=True) if cell.task else None,
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
        return run_from_row({**row, "id": row_id}, self.root)

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
            run_from_row(dict(row), self.root)
            for row in self._read(f"SELECT * FROM runs {where} ORDER BY id", params)
        ]

    def latest_ok_runs(self, profile: str | None = None) -> list[Run]:
        """The newest ok attempt of each cell key (of one profile, if given); older ones stay recorded."""
        return newest_per_cell(self.runs("ok"), profile)
