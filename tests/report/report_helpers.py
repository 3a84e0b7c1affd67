"""Report test helpers: stores filled with known runs, lookups into built tables and figures."""

from matplotlib.container import BarContainer
from result_factory import made_up_result

from dtlab.cell import Cell
from dtlab.report.study import published
from dtlab.results import Provenance, ResultStore

STUDY_SEEDS = (1, 2, 3, 4, 5)
# The study's 20-epoch figures are means of 5 seeds: spread the seeds symmetrically around the
# published mean so the mean is exact and the std is known; 100-epoch figures are single runs.
TIME_SPREAD_S = (-2.0, -1.0, 0.0, 1.0, 2.0)  # sample std 1.58 s
ACCURACY_SPREAD = (-0.002, -0.001, 0.0, 0.001, 0.002)  # sample std 0.0016


def record(
    store: ResultStore,
    cell: Cell,
    *,
    time_total_s: float,
    final_accuracy: float,
    device: str = "cuda",
    framework_label: str | None = None,
    config_hash: str = "0123456789abcdef",
    inventory: str = "study",
):
    result = made_up_result(
        cell.framework,
        cell.gpus,
        cell.epochs,
        cell.seed,
        time_total_s=time_total_s,
        final_accuracy=final_accuracy,
        device=device,
        framework_label=framework_label,
    )
    return store.record_ok(
        cell,
        result,
        Provenance(
            config_hash=config_hash,
            git_rev="deadbeef",
            inventory=inventory,
            node_versions={"node1": {"nvidia_driver": "535.247.01", "torch": "2.13.0"}},
            harness_time_s=time_total_s + 4.0,
        ),
    )


def record_with_clock(store: ResultStore, cell: Cell, *, time_s: float, startup_s: float,
                      device: str = "cpu", accuracy: float = 0.8, label: str | None = None,
                      harness_time_s: float | None = None, marks: dict | None = None,
                      fields: dict | None = None):
    """One ok run with the whole-run clock: its first step `startup_s` after submit, then `time_s` of
    training (Table B.3's phases, the start-up of Table B.10); `marks`: more of the trainer's marks, as
    seconds after submit (data_started, etl_started, ...); `fields`: more of result.json's."""
    result = made_up_result(cell.framework, cell.gpus, cell.epochs, cell.seed, time_total_s=time_s,
                            final_accuracy=accuracy, device=device,
                            framework_label=label or f"{cell.framework} ({device})")
    submitted = 1000.0
    result["harness_timeline_unix"] = {"submitted": submitted, "recorded": submitted + startup_s + time_s + 2}
    result["timeline_unix"] = {
        "process_started": submitted + 2.0,
        "first_step_done": submitted + startup_s,
        "training_started": submitted + startup_s,
        "training_ended": submitted + startup_s + time_s,
        **{name: submitted + seconds for name, seconds in (marks or {}).items()},
    }
    result["config"] = {**result.get("config", {}), "data_path": cell.data_path}
    result.update(fields or {})
    return store.record_ok(cell, result, Provenance(config_hash="0123456789abcdef", git_rev="deadbeef",
                                                    inventory="lab", node_versions={},
                                                    harness_time_s=harness_time_s or time_s + startup_s + 2))


def record_failure(store: ResultStore, cell: Cell, reason: str = "executor lost", **provenance):
    """One failed attempt of `cell`, as bench records it when a node dies; `provenance` overrides
    Provenance's fields (inventory, log_dir, harness_time_s, ...)."""
    recorded = Provenance(**{"config_hash": "0123456789abcdef", "git_rev": None, "inventory": "lab",
                             **provenance})
    return store.record_failure(cell, recorded, reason=reason, node="node2", exit_code=137,
                                log_tail=["Killed"])


def fill_with_study_runs(store: ResultStore, profile: str = "study") -> None:
    for (framework, gpus, epochs), (time_s, accuracy) in published().runs.items():
        if epochs == 20:
            for seed, dt, da in zip(STUDY_SEEDS, TIME_SPREAD_S, ACCURACY_SPREAD, strict=True):
                record(
                    store,
                    Cell(framework, gpus, epochs, seed, profile),
                    time_total_s=time_s + dt,
                    final_accuracy=accuracy + da,
                )
        else:
            record(
                store, Cell(framework, gpus, epochs, 1, profile), time_total_s=time_s, final_accuracy=accuracy
            )


class Lookup:
    """Find a table by number and read a cell by row prefix and column name (n-th occurrence)."""

    def __init__(self, report):
        self.report = report

    def table(self, number: str):
        [table] = [t for t in self.report.tables + self.report.extra_tables if t.number == number]
        return table

    def rows(self, number: str, *prefixes: str) -> list[list[str]]:
        table = self.table(number)
        return [
            [v.text for v in row]
            for row in table.rows
            if all(row[i].text.startswith(p) for i, p in enumerate(prefixes))
        ]

    def cell(self, number: str, prefixes: tuple[str, ...], column: str, occurrence: int = 1) -> str:
        table = self.table(number)
        [row] = self.rows(number, *prefixes)
        positions = [i for i, name in enumerate(table.columns) if name == column]
        return row[positions[occurrence - 1]]


def figure_panels(figure) -> list[dict]:
    """What each panel of a drawn Figure 5.1 shows: its bars as {(framework, tick): height}, whether
    any bar has error bars, its bars' value labels and its "missing" marks."""
    panels = []
    for axes in figure.axes:
        ticks = [t.get_text() for t in axes.get_xticklabels()]
        bars, spread = {}, False
        for container in axes.containers:
            if not isinstance(container, BarContainer):
                continue
            spread |= container.errorbar is not None
            for patch, height in zip(container.patches, container.datavalues, strict=True):
                tick = ticks[round(patch.get_x() + patch.get_width() / 2)]
                bars[(container.get_label(), tick)] = float(height)
        texts = [t.get_text() for t in axes.texts]
        panels.append({"title": axes.get_title(), "bars": bars, "spread": spread, "ylim": axes.get_ylim(),
                       "labels": texts, "missing": [t for t in texts if not t[:1].isdigit()]})
    return panels
