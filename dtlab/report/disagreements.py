"""Table B.9: where this cluster disagrees with the study beyond its min-max over runs, and the set-up
differences the recorded runs show."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dtlab.platforms import BASELINE
from dtlab.report.aggregate import MIN_RUNS_FOR_SPREAD, GroupKey, spread
from dtlab.report.numbers import fmt, num, text
from dtlab.report.study import (
    DISPLAY_NAMES,
    STUDY_BASE_GPUS,
    STUDY_GPU,
    STUDY_SCALED_GPUS,
    STUDY_SHORT_EPOCHS,
)
from dtlab.report.table_base import Table, TableContext, spread_text
from dtlab.results import Run


class Disagreements(TableContext):
    """Where this cluster disagrees with the study (item 6): the study's derived figures set against
    this cluster's min-max over runs (Table B.9)."""

    def study_figures(self) -> list[tuple[str, str, int, str, str, float, Callable, list[GroupKey]]]:
        """Every derived figure with a study value and this cluster's groups behind it: (what, framework,
        gpus, quantity, suffix, study value, figure, keys). Seconds are compared only when the runs are
        comparable with the study's (the same device kind and task)."""
        short, long, base = self.short, self.long, STUDY_BASE_GPUS
        found = []
        for framework in self.frameworks():
            for gpus in self.gpu_counts(framework):
                f, g = framework, gpus
                candidates = [
                    (
                        "Table 5.4 ratio long/short",
                        "linearity",
                        "",
                        self.pub.linearity,
                        lambda d, f=f, g=g: d.linearity(f, g, short, long),
                        [(f, g, long), (f, g, short)],
                    ),
                    (
                        "Table 5.7 overhead vs DDP",
                        "overhead_x",
                        "×",
                        self.pub.overhead_x,
                        lambda d, f=f, g=g: d.overhead_x(f, g, short),
                        [(f, g, short), (BASELINE, g, short)],
                    ),
                    (
                        "Table 5.9 per-epoch overhead",
                        "overhead_pct",
                        "%",
                        self.pub.overhead_pct,
                        lambda d, f=f, g=g: d.overhead_per_epoch_pct(f, g, short),
                        [(f, g, short), (BASELINE, g, short)],
                    ),
                ]
                if g == STUDY_SCALED_GPUS:
                    candidates += [
                        (
                            f"Table 5.8 {name}",
                            quantity,
                            suffix,
                            table,
                            lambda d, f=f, g=g, m=method: getattr(d, m)(f, g, short, base),
                            [(f, base, short), (f, g, short)],
                        )
                        for name, method, quantity, suffix, table in (
                            ("speedup", "speedup", "speedup", "×", self.pub.speedup),
                            ("efficiency", "efficiency_pct", "efficiency_pct", "%", self.pub.efficiency_pct),
                            ("time reduction", "reduction_pct", "reduction_pct", "%", self.pub.reduction_pct),
                        )
                    ]
                if self.incomparable is None:
                    candidates += [
                        (
                            "Table 5.4 s/epoch",
                            "per_epoch_s",
                            "",
                            {(f, g): self.pub.per_epoch_s.get((f, g, STUDY_SHORT_EPOCHS))},
                            lambda d, f=f, g=g: d.per_epoch(f, g, short),
                            [(f, g, short)],
                        ),
                        (
                            "Table 5.9 per-epoch overhead (s)",
                            "overhead_s",
                            "",
                            self.pub.overhead_s,
                            lambda d, f=f, g=g: d.overhead_per_epoch_s(f, g, short),
                            [(f, g, short), (BASELINE, g, short)],
                        ),
                    ]
                for what, quantity, suffix, table, figure, keys in candidates:
                    study = table.get((f, g))
                    if framework == BASELINE and keys[-1][0] == BASELINE:
                        continue  # DDP against itself
                    if study is not None and all(k[2] is not None and k in self.groups for k in keys):
                        found.append((what, f, g, quantity, suffix, study, figure, keys))
        return found

    def disagreement_table(self, setup_differences: list[str]) -> Table:
        """Where the study's value lies outside this cluster's min-max over runs (>= MIN_RUNS_FOR_SPREAD
        runs per group): a disagreement beyond noise. The set-up differences are the recorded ones."""
        rows, too_few, checked = [], [], 0
        for what, framework, gpus, quantity, suffix, study, figure, keys in self.study_figures():
            found = spread(self.groups, figure, keys)
            if found is None or found.low is None:
                continue
            where = f"{what}, {DISPLAY_NAMES.get(framework, framework)} {self.label(framework, gpus)}"
            if found.fewest < MIN_RUNS_FOR_SPREAD:
                too_few.append(where)
                continue
            checked += 1
            shown = float(fmt(study, quantity))
            if found.low <= shown <= found.high:
                continue
            side = "above" if shown > found.high else "below"
            rows.append(
                [
                    text(what),
                    text(self.name(framework)),
                    text(self.label(framework, gpus)),
                    text(spread_text(found, quantity, suffix=suffix)),
                    num(study, quantity, suffix=suffix),
                    text(f"study {side} this cluster's range"),
                ]
            )
        notes = []
        if too_few and not checked:
            notes.append(
                f"No disagreement can be claimed: every figure rests on a group with fewer than "
                f"{MIN_RUNS_FOR_SPREAD} runs."
            )
        elif too_few:
            notes.append(
                f"Not judged (a group with fewer than {MIN_RUNS_FOR_SPREAD} runs): "
                + "; ".join(too_few)
                + "."
            )
        if checked and not rows:
            notes.append("Every study value checked lies within this cluster's min-max over runs.")
        if rows or checked:
            notes.append(
                "Set-up differences known from the recorded runs: " + "; ".join(setup_differences) + "."
                if setup_differences
                else "No set-up difference is recorded."
            )
        if self.incomparable is not None:
            notes.append(
                "Seconds (s/epoch, per-epoch overhead in s) are not compared: "
                f"{self.incomparable}; ratios and percentages are."
            )
        notes.append(
            f"A disagreement: the study's value (as printed) outside this cluster's min-max over "
            f"runs, with at least {MIN_RUNS_FOR_SPREAD} runs in every group behind the figure."
        )
        return Table(
            "B.9",
            "table-b.9-disagreements",
            "Where this cluster disagrees with the study",
            ["Figure", "Framework", "Configuration", "This cluster, min–max", "Study", "Where"],
            rows,
            notes,
        )


def known_setup_differences(runs: Iterable[Run], short: int | None, pub_device: str) -> list[str]:
    """What differs from the study's set-up, read from the recorded runs only (never assumed)."""
    results = [run.result for run in runs if run.result]
    if not results:
        return []
    differences = []
    devices = sorted({r["device"] for r in results})
    if devices != [pub_device]:
        differences.append(f"device {'/'.join(devices)} here, {pub_device} ({STUDY_GPU}) in the study")
    if short is not None and short != STUDY_SHORT_EPOCHS:
        differences.append(f"{short}-epoch runs here, {STUDY_SHORT_EPOCHS} in the study")
    datasets = sorted({r["hyperparameters"]["dataset"] for r in results})
    models = sorted({r["hyperparameters"]["model"] for r in results})
    if datasets != ["imdb"]:
        differences.append(f"dataset {', '.join(datasets)} here, IMDB in the study")
    if models != ["prajjwal1/bert-tiny"]:
        differences.append(f"model {', '.join(models)} here, pretrained prajjwal1/bert-tiny in the study")
    sizes = sorted({r["world_size"] for r in results})
    threads = sorted(
        {
            r["hyperparameters"].get("threads_per_worker")
            for r in results
            if r["device"] == "cpu" and r["hyperparameters"].get("threads_per_worker")
        }
    )
    if "cpu" in devices:
        per_worker = f", {'/'.join(map(str, threads))} thread(s) each" if threads else ""
        differences.append(
            f"world size {', '.join(map(str, sizes))} CPU worker(s){per_worker} here, 1-2 GPUs in the study"
        )
    versions = sorted(
        {
            f"{k} {v}"
            for run in runs
            for node in run.node_versions.values()
            if isinstance(node, dict)
            for k, v in node.items()
            if not isinstance(v, dict)
        }
    )
    if versions:
        differences.append(
            f"node versions recorded here: {', '.join(versions)} (the study: driver 535.247.01, CUDA 12.2)"
        )
    return differences
