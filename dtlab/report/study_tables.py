"""The study's Tables 5.1-5.6 (runs, linearity, accuracy) and the check of its own derived figures."""

from __future__ import annotations

from collections.abc import Callable

from dtlab.report.aggregate import Derived, GroupKey, GroupStats
from dtlab.report.numbers import fmt, missing, num, text
from dtlab.report.study import (
    DISPLAY_NAMES,
    STUDY_BASE_GPUS,
    STUDY_LONG_EPOCHS,
    STUDY_SHORT_EPOCHS,
    TABLE_OF_FRAMEWORK,
    Published,
)
from dtlab.report.table_base import SPREAD_NOTE, STUDY_SPREAD_NOTE, Table, TableContext, config_label


class StudyTables(TableContext):
    """Tables 5.1-5.6: this cluster's runs, per-epoch linearity and accuracy beside the study's."""

    def __init__(
        self,
        groups: dict[GroupKey, GroupStats],
        published: Published,
        *,
        short: int | None,
        long: int | None,
        incomparable: str | None = None,
    ):
        super().__init__(groups, published, short=short, long=long, incomparable=incomparable)
        self.study_mismatches = study_self_check(published)

    def _mismatch_notes(self, table: str) -> list[str]:
        return [m for t, m in self.study_mismatches if t == table]

    def run_table(self, framework: str) -> Table:
        """Tables 5.1-5.3: mean and std over seeds of whole-run time and accuracy, with run counts."""
        keys = {(g, e) for (f, g, e) in self.groups if f == framework}
        keys |= {(g, e) for (f, g, e) in self.pub.runs if f == framework}
        rows = []
        for gpus, epochs in sorted(keys, key=lambda k: (k[1], k[0])):
            stats = self.groups.get((framework, gpus, epochs))
            study_time, study_acc = self.pub.runs.get((framework, gpus, epochs), (None, None))
            rows.append(
                [
                    text(self.label(framework, gpus) if stats else self.study_label(gpus)),
                    text(str(epochs)),
                    text(str(stats.n)) if stats else text("0"),
                    *self.pair(stats.time_mean if stats else None, study_time, "time_s")[:1],
                    num(stats.time_std if stats else None, "time_s"),
                    *self.pair(stats.time_mean if stats else None, study_time, "time_s")[1:],
                    num(stats.accuracy_mean if stats else None, "accuracy"),
                    num(stats.accuracy_std if stats else None, "accuracy"),
                    *self.pair(stats.accuracy_mean if stats else None, study_acc, "accuracy")[1:],
                    self.spread_cell(
                        lambda d, k=(framework, gpus, epochs): d.times[k],
                        [(framework, gpus, epochs)],
                        "time_s",
                    ),
                ]
            )
        number = TABLE_OF_FRAMEWORK.get(framework, "5.x")
        return Table(
            number,
            f"table-{number}-{framework}",
            f"{self.name(framework)} training results",
            [
                "Configuration",
                "Epochs",
                "Runs",
                "Time mean (s)",
                "Time std (s)",
                "Study time (s)",
                "This/study",
                "Accuracy mean",
                "Accuracy std",
                "Study accuracy",
                "This/study",
                "Time min–max (s)",
            ],
            rows,
            [
                "Mean and sample standard deviation over seeds (std needs at least 2 runs). "
                "The study's 20-epoch figures are means of 5 seeds, its 100-epoch figures one run; "
                "it prints no standard deviations.",
                SPREAD_NOTE,
                STUDY_SPREAD_NOTE,
            ],
        )

    def table_5_4(self) -> Table:
        short, long = self.short, self.long
        rows = []
        for framework in self.frameworks():
            for gpus in self.gpu_counts(framework):
                if not (
                    self.stats(framework, gpus, short)
                    or self.stats(framework, gpus, long)
                    or (framework, gpus, STUDY_SHORT_EPOCHS) in self.pub.runs
                ):
                    continue
                rows.append(
                    [
                        text(DISPLAY_NAMES.get(framework, framework)),
                        text(self.label(framework, gpus)),
                        *self.pair(
                            self.this.per_epoch(framework, gpus, short),
                            self.pub.per_epoch_s.get((framework, gpus, STUDY_SHORT_EPOCHS)),
                            "per_epoch_s",
                        ),
                        *self.pair(
                            self.this.per_epoch(framework, gpus, long),
                            self.pub.per_epoch_s.get((framework, gpus, STUDY_LONG_EPOCHS)),
                            "per_epoch_s",
                        ),
                        *self.pair(
                            self.this.linearity(framework, gpus, short, long),
                            self.pub.linearity.get((framework, gpus)),
                            "linearity",
                        ),
                        self.spread_cell(
                            lambda d, f=framework, g=gpus: d.per_epoch(f, g, short),
                            [(framework, gpus, short)],
                            "per_epoch_s",
                        ),
                        self.spread_cell(
                            lambda d, f=framework, g=gpus: d.linearity(f, g, short, long),
                            [(framework, gpus, long), (framework, gpus, short)],
                            "linearity",
                        ),
                    ]
                )
        s, lg = self.epochs_heading(short, 20), self.epochs_heading(long, 100)
        return Table(
            "5.4",
            "table-5.4-linearity",
            "Training time linearity: per-epoch comparison",
            [
                "Framework",
                "Configuration",
                f"s/epoch, {s}",
                "Study s/epoch, 20 ep",
                "This/study",
                f"s/epoch, {lg}",
                "Study s/epoch, 100 ep",
                "This/study",
                "Ratio long/short",
                "Study ratio 100/20",
                "This/study",
                f"s/epoch min–max, {s}",
                "Ratio min–max",
            ],
            rows,
            [
                "Per-epoch time is the mean whole-run time over the epochs; the ratio is the long "
                "runs' per-epoch time over the short runs'.",
                SPREAD_NOTE,
                STUDY_SPREAD_NOTE,
                *self._mismatch_notes("5.4"),
            ],
        )

    def accuracy_table(self, number: str, epochs: int | None, study_epochs: int) -> Table:
        """Tables 5.5 (short runs) and 5.6 (long runs): validation accuracy per framework and count."""
        gpu_counts = self.gpu_counts()
        columns = ["Framework"]
        for gpus in gpu_counts:
            columns += [self.label(None, gpus), f"Study, {self.study_label(gpus)}", "This/study"]
        if number == "5.6":
            columns += [f"Δ vs {self.short} ep, {self.label(None, g)} (pp)" for g in gpu_counts]
        rows = []
        for framework in self.frameworks():
            row = [text(self.name(framework))]
            for gpus in gpu_counts:
                stats = self.stats(framework, gpus, epochs)
                study = self.pub.runs.get((framework, gpus, study_epochs), (None, None))[1]
                ours = stats.accuracy_mean if stats else None
                row += self.pair(ours, study, "accuracy")
                if epochs != study_epochs:  # accuracy after other epoch counts: no ratio
                    row[-1] = missing()
            if number == "5.6":
                for gpus in gpu_counts:
                    long_stats, short_stats = (
                        self.stats(framework, gpus, epochs),
                        self.stats(framework, gpus, self.short),
                    )
                    delta = (
                        (long_stats.accuracy_mean - short_stats.accuracy_mean) * 100
                        if long_stats and short_stats
                        else None
                    )
                    row.append(num(delta, "accuracy_delta_pp", sign=True))
            rows.append(row)
        heading = self.epochs_heading(epochs, study_epochs)
        slug = "table-5.5-accuracy-short" if number == "5.5" else "table-5.6-accuracy-long"
        return Table(
            number,
            slug,
            f"Validation accuracy ({heading}; study {study_epochs} epochs)",
            columns,
            rows,
            ["Final validation accuracy, mean over seeds."],
        )


def study_self_check(pub: Published) -> list[tuple[str, str]]:
    """Recompute the study's derived figures from its own Tables 5.1-5.3 with this report's rounding.

    Returns (table number, note) for each printed figure the rule does not reproduce.
    """
    derived = Derived({key: time for key, (time, _acc) in pub.runs.items()})
    checks: list[tuple[str, str, float | None, float, str]] = []  # table, what, computed, printed, quantity
    for (fw, gpus, epochs), printed in pub.per_epoch_s.items():
        checks.append(
            (
                "5.4",
                f"{DISPLAY_NAMES[fw]} {config_label(gpus, pub.device)} {epochs} ep s/epoch",
                derived.per_epoch(fw, gpus, epochs),
                printed,
                "per_epoch_s",
            )
        )
    for (fw, gpus), printed in pub.linearity.items():
        checks.append(
            (
                "5.4",
                f"{DISPLAY_NAMES[fw]} {config_label(gpus, pub.device)} ratio",
                derived.linearity(fw, gpus, STUDY_SHORT_EPOCHS, STUDY_LONG_EPOCHS),
                printed,
                "linearity",
            )
        )
    for (fw, gpus), printed in pub.overhead_x.items():
        # Section 5.3.1 prints the single-GPU overhead in percent, Table 5.7 the 2-GPU one as a factor.
        computed = derived.overhead_x(fw, gpus, STUDY_SHORT_EPOCHS)
        if gpus == STUDY_BASE_GPUS:
            checks.append(
                (
                    "5.7",
                    f"{DISPLAY_NAMES[fw]} {config_label(gpus, pub.device)} overhead (%)",
                    (computed - 1) * 100 if computed else None,
                    (printed - 1) * 100,
                    "overhead_pct",
                )
            )
        else:
            checks.append(
                (
                    "5.7",
                    f"{DISPLAY_NAMES[fw]} {config_label(gpus, pub.device)} overhead_x",
                    computed,
                    printed,
                    "overhead_x",
                )
            )
    per_table: list[tuple[str, dict, Callable[[str, int], float | None], str]] = [
        ("5.8", pub.speedup, lambda f, g: derived.speedup(f, g, STUDY_SHORT_EPOCHS), "speedup"),
        (
            "5.8",
            pub.efficiency_pct,
            lambda f, g: derived.efficiency_pct(f, g, STUDY_SHORT_EPOCHS),
            "efficiency_pct",
        ),
        (
            "5.8",
            pub.reduction_pct,
            lambda f, g: derived.reduction_pct(f, g, STUDY_SHORT_EPOCHS),
            "reduction_pct",
        ),
        (
            "5.9",
            pub.overhead_s,
            lambda f, g: derived.overhead_per_epoch_s(f, g, STUDY_SHORT_EPOCHS),
            "overhead_s",
        ),
        (
            "5.9",
            pub.overhead_pct,
            lambda f, g: derived.overhead_per_epoch_pct(f, g, STUDY_SHORT_EPOCHS),
            "overhead_pct",
        ),
    ]
    for table, printed_values, compute, quantity in per_table:
        for (fw, gpus), printed in printed_values.items():
            checks.append(
                (
                    table,
                    f"{DISPLAY_NAMES[fw]} {config_label(gpus, pub.device)} {quantity}",
                    compute(fw, gpus),
                    printed,
                    quantity,
                )
            )
    notes = []
    for table, what, computed, printed, quantity in checks:
        if fmt(computed, quantity) != fmt(printed, quantity):
            notes.append(
                (
                    table,
                    f"Study check: {what} is printed {fmt(printed, quantity)} but the study's "
                    f"own run table gives {fmt(computed, quantity)} (see Rounding).",
                )
            )
    return notes
