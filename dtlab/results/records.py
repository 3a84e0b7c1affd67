"""Run records: a reserved attempt, a recorded run as read back, the provenance every attempt carries,
and checking a trainer result (its schema, its strategy) before it is recorded or reported."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from dtlab.cell import Cell
from dtlab.errors import DtlabError
from trainer import result as trainer_result
from trainer import strategies


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


# search.json's keys the store and the report read (trainer.search.search_result writes them).
SEARCH_RESULT_KEYS = {"way": str, "label": str, "early_stopping": str, "budget_epochs": int, "trials": list,
                      "counts": dict, "wall_s": float, "busy_fraction": float}


def validate_search_result(result: Mapping[str, Any], cell: Cell, where: str) -> None:
    """Raise DtlabError naming the first key of a search cell's search.json that is missing, of another type,
    or unlike the cell (its early stopping, budget and trial count)."""
    for key, kind in SEARCH_RESULT_KEYS.items():
        value = result.get(key)
        if not isinstance(value, kind) and not (kind is float and isinstance(value, int)):
            raise DtlabError(f"{where}: {key}: expected {kind.__name__}, got {value!r}; the launcher must "
                             "write trainer.search.search_result's JSON")
    best = result.get("best")
    if best is not None and not isinstance(best, Mapping):
        raise DtlabError(f"{where}: best: expected an object or null, got {best!r}")
    expected = {"early_stopping": cell.search, "budget_epochs": cell.epochs,
                "trials": len(cell.task_plan.get("trials", ()))}
    found = {"early_stopping": result["early_stopping"], "budget_epochs": result["budget_epochs"],
             "trials": len(result["trials"])}
    for key, value in expected.items():
        if found[key] != value:
            raise DtlabError(f"{where}: {key} is {found[key]!r} but the cell has {value!r}; record the "
                             "search under its own cell")


# serve.json's keys (dtlab/bench/serve.py writes them), and each load level's (dtlab.loadtest.LevelResult).
SERVE_FILE_NAME = "serve.json"
SERVE_RESULT_KEYS = {"way": str, "label": str, "serves": str, "checkpoint": str, "epoch": int,
                     "accuracy": float, "replicas": int, "urls": list, "levels": list, "ready_s": float,
                     "wall_s": float}
LEVEL_KEYS = {"concurrency": int, "requests": int, "errors": int, "mismatches": int, "p50_ms": float,
              "p99_ms": float, "throughput_rps": float, "wall_s": float}


def validate_serve_result(result: Mapping[str, Any], cell: Cell, where: str) -> None:
    """Raise DtlabError naming the first key of a serve cell's serve.json that is missing, of another type,
    or unlike the cell (the trained cell it serves, its load levels)."""
    def check(data: Mapping[str, Any], keys: Mapping[str, type], at: str) -> None:
        for key, kind in keys.items():
            value = data.get(key) if isinstance(data, Mapping) else None
            number = kind is float and isinstance(value, int)
            if isinstance(value, bool) or not (isinstance(value, kind) or number):
                raise DtlabError(f"{where}: {at}{key}: expected {kind.__name__}, got {value!r}")

    check(result, SERVE_RESULT_KEYS, "")
    for index, level in enumerate(result["levels"]):
        check(level, LEVEL_KEYS, f"levels[{index}].")
    planned = list(cell.task_plan["load"]["concurrency"])
    found = [level["concurrency"] for level in result["levels"]]
    if result["serves"] != cell.trained.key or found != planned:
        raise DtlabError(f"{where}: it serves {result['serves']} at concurrency {found}, but the cell serves "
                         f"{cell.trained.key} at {planned}; record it under its own cell")


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


@dataclass(frozen=True)
class Provenance:
    """What every recorded attempt carries, ok or failed: the config it ran (its hash), the code (git
    revision), the cluster (inventory name, each node's environment), its logs, how long the harness
    took, which attempt it was (None: the next free one), its fault record (faulted cells) and the profile's
    quality target (for the run's MLPerf log)."""

    config_hash: str
    git_rev: str | None
    inventory: str | None
    node_versions: Mapping[str, Any] | None = None
    log_dir: str | os.PathLike[str] | None = None
    harness_time_s: float | None = None
    attempt: int | None = None
    fault_record: Mapping[str, Any] | None = None
    # The profile's target_accuracy when recorded (dtlab.matrix): the run's MLPerf log's target and status.
    target_accuracy: float | None = None
