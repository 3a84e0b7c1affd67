"""The "Fault recovery" section: each faulted cell's newest run beside its undisturbed twin.

A faulted cell (Cell.fault, e.g. "kill-after1-node2") is run by the harness with a fault injected
after epoch k; the attempt that ends its run carries the fault record (dtlab.faults: what was done,
when, what noticed it, when training went on). Its undisturbed twin is the same cell without the
fault (Cell.undisturbed, same config hash); the section compares the two. Faulted runs never enter
the study's tables: their times and attempts are the fault's, not the platform's ordinary cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dtlab.cell import config_hash
from dtlab.report.aggregate import WHOLE_RUN_PHASES, whole_run_phases
from dtlab.report.numbers import PLACES, Value, fmt, missing, num, ratio, text
from dtlab.report.study import DISPLAY_NAMES
from dtlab.report.tables import Table
from dtlab.results import Run

END_TO_END = WHOLE_RUN_PHASES[-1][0]  # submitted -> recorded
# The per-epoch metrics that must match the twin's exactly for "identical".
COMPARED_METRICS = ("train_loss", "val_loss", "val_accuracy")
IDENTICAL = "identical"
FAULT_TABLE_NUMBER = "B.5"

COLUMN_NOTE = (
    "Detected: fault → the platform or harness knew (detected by: what noticed it). Training again: "
    "fault → the first training step of the run that finished. Epochs redone: epochs checkpointed when "
    "the fault hit minus the epoch the finishing run resumed from. Total: from the run's first submit to "
    "its result recorded, every attempt included; undisturbed: the same for the newest ok run of the same "
    "cell without the fault (same config hash, any profile). Final metrics: \"identical\" when every "
    "epoch's train loss, validation loss and validation accuracy equal the undisturbed run's exactly, "
    "otherwise the first epoch that differs and the last epoch's absolute differences. A run that did not "
    "recover shows why and no measures. Faulted cells are left out of every other table (B.2 and B.4 "
    "included)."
)


def is_faulted(run: Run) -> bool:
    return bool(run.cell.fault)


@dataclass(frozen=True)
class FaultOutcome:
    """One faulted cell's newest run, reduced to what the table and the timeline figure show.

    Moments are seconds from the run's first submit (run_started_unix); None where not recorded."""

    framework: str
    cell_key: str
    undisturbed_key: str
    kind: str
    node: str | None
    after_epoch: int
    seconds: int | None
    state: str  # "recovered", "not recovered", "not finished" or "no fault record"
    recovered_by: str  # the mechanism, or "not recovered: <reason>" (and "not finished", "not tested")
    attempts: int | None
    fault_at_s: float | None  # None: the fault never fired
    detected_s: float | None  # after the fault
    detected_by: str | None
    training_again_s: float | None  # after the fault
    epochs_redone: int | None
    total_s: float | None  # every attempt, recovered or not
    undisturbed_s: float | None  # None: no twin recorded
    metrics: Value  # "identical", the last epoch's differences, or missing
    elastic: bool = False  # recovery elastic: the survivors went on without the hit node
    final_world_size: int | None = None  # the finishing run's workers
    planned_world_size: int | None = None  # the cell's

    @property
    def recovered(self) -> bool:
        """The run ended ok and its fault record says recovered: one fact, kept in `state`."""
        return self.state == "recovered"

    @property
    def measured(self) -> bool:
        """A recovery to measure: the fault fired and the run recovered (else the table shows "—")."""
        return self.recovered and self.fault_at_s is not None

    @property
    def name(self) -> str:
        return DISPLAY_NAMES.get(self.framework, self.framework)

    @property
    def fault_text(self) -> str:
        lasting = f" for {self.seconds} s" if self.seconds is not None else ""
        where = f" on {self.node}" if self.node else ""
        mode = " (the node lost; elastic)" if self.elastic else ""
        return f"{self.kind}{mode}{lasting}{where} after epoch {self.after_epoch}"


@dataclass
class FaultSection:
    table: Table
    outcomes: list[FaultOutcome]
    notes: list[str] = field(default_factory=list)  # missing twins, runs still going
    figure: dict[str, Any] | None = None  # filled by render, like Report.figures' items

    @property
    def figure_title(self) -> str:
        kinds = {o.kind for o in self.outcomes}
        after = {o.after_epoch for o in self.outcomes}
        if kinds == {"kill"} and len(after) == 1:
            return f"Fault recovery: a worker killed after epoch {after.pop()}"
        return "Fault recovery: each run's fault, against its undisturbed run"


def _whole_run_s(run: Run) -> float | None:
    """The whole-run clock's end to end (submit to recorded), else the harness's own wall time."""
    return dict(whole_run_phases(run.result or {})).get(END_TO_END, run.harness_time_s)


def _epochs(result: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    return {m["epoch"]: m for m in (result or {}).get("epoch_metrics", [])}


def _small(value: float, quantity: str) -> str:
    """A difference to the quantity's places; one too small to show there never prints as 0."""
    unit = 10.0 ** -PLACES[quantity]
    return f"< {fmt(unit, quantity)}" if 0 < value < unit / 2 else fmt(value, quantity)


def compare_metrics(faulted: dict[str, Any], undisturbed: dict[str, Any]) -> Value:
    """"identical" when every epoch's COMPARED_METRICS equal the twin's exactly; else the first epoch that
    differs and the last epoch's |Δ val_accuracy| and |Δ val_loss| (raw: the larger of the two)."""
    ours, theirs = _epochs(faulted), _epochs(undisturbed)
    differing = sorted(e for e in ours.keys() | theirs.keys()
                       if e not in ours or e not in theirs
                       or any(ours[e].get(m) != theirs[e].get(m) for m in COMPARED_METRICS))
    if not differing:
        return Value(IDENTICAL, IDENTICAL)
    last = max(ours.keys() & theirs.keys(), default=None)
    if last is None:
        return Value("differs: no epoch in common", None)
    d_accuracy = abs(ours[last]["val_accuracy"] - theirs[last]["val_accuracy"])
    d_loss = abs(ours[last]["val_loss"] - theirs[last]["val_loss"])
    return Value(
        f"differs from epoch {differing[0]}; epoch {last}: "
        f"|Δ val accuracy| {_small(d_accuracy, 'accuracy')}, |Δ val loss| {_small(d_loss, 'loss')}",
        max(d_accuracy, d_loss),
    )


def find_twin(faulted: Run, ok_runs: Iterable[Run]) -> Run | None:
    """The newest ok run of the faulted cell's undisturbed cell with the same config hash, any profile."""
    twin_cell = faulted.cell.undisturbed
    wanted = config_hash(twin_cell)
    twins = [run for run in ok_runs if run.cell_key == twin_cell.key and run.config_hash == wanted]
    return max(twins, key=lambda run: run.id, default=None)


def _since(record: dict[str, Any], key: str, start: float | None) -> float | None:
    value = record.get(key)
    return float(value) - start if value is not None and start is not None else None


def outcome_of(run: Run, twin: Run | None) -> FaultOutcome:
    record = run.fault_record or {}
    plan = run.cell.fault_plan
    assert plan is not None  # only faulted cells come here
    finished = bool(record.get("outcome"))
    recovered = run.status == "ok" and record.get("outcome") == "recovered"
    fault_at_s = _since(record, "injected_unix", record.get("run_started_unix"))
    state = ("no fault record" if run.fault_record is None else "not finished" if not finished
             else "recovered" if recovered else "not recovered")
    if state == "no fault record":
        recovered_by = f"no fault record (attempt {run.attempt}, {run.status})"
    elif state == "not finished":  # the harness is still at it, or was stopped before the run ended
        recovered_by = f"not finished: attempt {run.attempt} {run.status}" + (
            f" ({run.reason})" if run.reason else "")
    elif state == "not recovered":
        recovered_by = f"not recovered: {run.reason or 'no reason recorded'}"
    elif fault_at_s is None:
        recovered_by = "not tested: the fault never fired"
    else:
        recovered_by = record.get("recovered_by") or "not recorded"
    return FaultOutcome(
        framework=run.cell.framework,
        cell_key=run.cell_key,
        undisturbed_key=run.cell.undisturbed.key,
        kind=record.get("kind") or plan.kind,
        node=record.get("node") or plan.node,
        after_epoch=int(record.get("after_epoch", plan.after_epoch)),
        seconds=record.get("seconds", plan.seconds),
        state=state,
        recovered_by=recovered_by,
        attempts=record.get("attempts"),
        fault_at_s=fault_at_s,
        detected_s=record.get("detected_s"),
        detected_by=record.get("detected_by"),
        training_again_s=record.get("training_again_s"),
        epochs_redone=record.get("epochs_redone"),
        total_s=record.get("total_s"),
        undisturbed_s=_whole_run_s(twin) if twin is not None else None,
        metrics=(compare_metrics(run.result or {}, twin.result or {})
                 if recovered and twin is not None else missing()),
        elastic=plan.elastic,
        final_world_size=record.get("final_world_size"),
        planned_world_size=run.cell.gpus,
    )


def fault_table(outcomes: Iterable[FaultOutcome]) -> Table:
    rows = []
    for o in outcomes:
        total = o.total_s if o.recovered else None
        rows.append([
            text(o.name),
            text(o.undisturbed_key),
            text(o.fault_text),
            text(o.recovered_by),
            text("—" if o.attempts is None else str(o.attempts)),
            num(o.detected_s if o.measured else None, "time_s"),
            text(o.detected_by or "—") if o.measured else missing(),
            num(o.training_again_s if o.measured else None, "time_s"),
            Value(str(o.epochs_redone), o.epochs_redone) if o.measured and o.epochs_redone is not None
            else missing(),
            num(total, "time_s"),
            num(o.undisturbed_s, "time_s"),
            ratio(total, o.undisturbed_s),
            Value(f"{o.final_world_size} of {o.planned_world_size}", o.final_world_size)
            if o.measured and o.final_world_size is not None else missing(),
            o.metrics,
        ])
    return Table(
        FAULT_TABLE_NUMBER,
        "table-b.5-fault-recovery",
        "Fault recovery: each faulted run beside its undisturbed run (beyond the study)",
        ["Framework", "Cell", "Fault", "Recovered by", "Attempts", "Detected (s)", "Detected by",
         "Training again (s)", "Epochs redone", "Total (s)", "Undisturbed (s)", "Total/undisturbed",
         "Workers at the end", "Final metrics vs undisturbed"],
        rows,
        [COLUMN_NOTE],
    )


def _rank(order: list[str], framework: str) -> int:
    return order.index(framework) if framework in order else len(order)


def fault_section(all_runs: list[Run]) -> FaultSection | None:
    """The section from every recorded run (any profile), or None when no faulted cell was run."""
    newest: dict[str, Run] = {}
    for run in sorted(all_runs, key=lambda run: run.id):
        if is_faulted(run):
            newest[run.cell_key] = run
    if not newest:
        return None
    ok_runs = [run for run in all_runs if run.status == "ok" and not is_faulted(run)]
    outcomes, notes = [], []
    order = list(DISPLAY_NAMES)
    for key in sorted(newest, key=lambda k: (_rank(order, newest[k].cell.framework), k)):
        run = newest[key]
        twin = find_twin(run, ok_runs)
        if twin is None:
            notes.append(f"{key}: no undisturbed run of {run.cell.undisturbed.key} with the same config "
                         f"hash is recorded; run it (without the fault) for the comparison.")
        outcomes.append(outcome_of(run, twin))
    return FaultSection(fault_table(outcomes), outcomes, notes)


__all__ = ["FaultOutcome", "FaultSection", "compare_metrics", "fault_section", "find_twin", "is_faulted"]
