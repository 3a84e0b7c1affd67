"""The study's Tables 5.1-5.9 (and a few beyond it) as data: this cluster beside the study.

Every numeric pair is three adjacent columns: this cluster, the study as printed, and this/study.
A figure missing on either side is shown as missing (numbers.MISSING), never filled in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dtlab.platforms import BASELINE
from dtlab.report.aggregate import (
    MIN_RUNS_FOR_SPREAD,
    PHASE_COLUMNS,
    TRIM_FROM_RUNS,
    Derived,
    GroupKey,
    GroupStats,
    Reached,
    Score,
    Spread,
    epoch_disagreements,
    ratio_spread,
    score,
    spread,
    time_to_target,
)
from dtlab.report.numbers import Value, fmt, missing, num, ratio, text
from dtlab.report.study import (
    DISPLAY_NAMES,
    FRAMEWORKS,
    STUDY_BASE_GPUS,
    STUDY_GPU,
    STUDY_LONG_EPOCHS,
    STUDY_SCALED_GPUS,
    STUDY_SHORT_EPOCHS,
    TABLE_OF_FRAMEWORK,
    Published,
)
from dtlab.results import Run


@dataclass
class Table:
    number: str  # the study's table number, or "B.n" beyond the study
    slug: str  # file-name stem of its CSV
    title: str
    columns: list[str]
    rows: list[list[Value]]
    notes: list[str] = field(default_factory=list)
    csv_rel: str = ""  # its CSV, relative to the report folder (set when written)


def config_label(gpus: int, device: str) -> str:
    """What a cell's count really was: GPUs, or CPU workers with one thread each."""
    if device == "cpu":
        return f"{gpus} worker{'s' if gpus != 1 else ''} (CPU)"
    return f"{gpus} GPU{'s' if gpus != 1 else ''}"


# How every min-max column reads (aggregate.Spread says why min-max and not a bootstrap).
SPREAD_NOTE = (
    "Min–max: the figure computed with each group's fastest and slowest run (every combination), then "
    '(n=…) the runs each group rests on, in the order the figure names them. "Within noise": the '
    "groups' run times overlap, so the difference (a ratio's interval includes 1.0) is not supported. "
    '"1 run, no spread" and "2 runs": too few runs to tell a difference from noise. Figures so '
    "marked are never ranked."
)
STUDY_SPREAD_NOTE = "Study: n=5 per 20-epoch figure, n=1 per 100-epoch figure; spread not published."


def spread_text(found: Spread, quantity: str, **options) -> str:
    """ "1.30×–1.42× (n=5/5)", "0.80×–1.30×, within noise (n=3/3)", "1 run, no spread (n=1/5)"."""
    runs = f"(n={'/'.join(str(n) for n in found.runs)})"
    if found.fewest <= 1:
        return f"1 run, no spread {runs}"
    interval = f"{fmt(found.low, quantity, **options)}–{fmt(found.high, quantity, **options)}"
    verdict = found.verdict
    return f"{interval}, {verdict} {runs}" if verdict else f"{interval} {runs}"


class TableBuilder:
    """Builds every table from this cluster's group statistics and the study's published figures."""

    def __init__(
        self,
        groups: dict[GroupKey, GroupStats],
        published: Published,
        *,
        short: int | None,
        long: int | None,
        incomparable: str | None = None,
    ):
        self.groups = groups
        # Why this cluster's figures cannot be set against the study's (None: they can); then every
        # this/study ratio is "—" and the report says why once.
        self.incomparable = incomparable
        self.pub = published
        self.short, self.long = short, long
        self.this = Derived({key: stats.time_mean for key, stats in groups.items()})
        self.study = Derived({key: time for key, (time, _acc) in published.runs.items()})
        self.study_mismatches = study_self_check(published)

    # --- helpers -------------------------------------------------------------

    def frameworks(self) -> list[str]:
        present = {key[0] for key in self.groups} | {key[0] for key in self.pub.runs}
        return [f for f in FRAMEWORKS if f in present] + sorted(present - set(FRAMEWORKS))

    def gpu_counts(self, framework: str | None = None) -> list[int]:
        ours = {g for (f, g, _e) in self.groups if framework is None or f == framework}
        study = {g for (f, g, _e) in self.pub.runs if framework is None or f == framework}
        return sorted(ours | study)

    def device(self, framework: str | None, gpus: int | None) -> str:
        devices = {
            d
            for (f, g, _e), stats in self.groups.items()
            if (framework is None or f == framework) and (gpus is None or g == gpus)
            for d in stats.devices
        }
        if not devices:
            devices = {d for (_f, _g, _e), stats in self.groups.items() for d in stats.devices}
        if len(devices) == 1:
            return devices.pop()
        return self.pub.device if not devices else "/".join(sorted(devices))

    def label(self, framework: str, gpus: int) -> str:
        return config_label(gpus, self.device(framework, gpus))

    def study_label(self, gpus: int) -> str:
        return config_label(gpus, self.pub.device)

    def name(self, framework: str) -> str:
        labels = sorted({lbl for (f, _g, _e), s in self.groups.items() if f == framework for lbl in s.labels})
        display = DISPLAY_NAMES.get(framework, framework)
        return f"{display} [{'; '.join(labels)}]" if labels else display

    def stats(self, framework: str, gpus: int, epochs: int | None) -> GroupStats | None:
        return self.groups.get((framework, gpus, epochs)) if epochs is not None else None

    def pair(self, this: float | None, study: float | None, quantity: str, **options) -> list[Value]:
        shown = [num(this, quantity, **options), num(study, quantity, **options)]
        return [*shown, self.ratio(this, study, quantity)]

    def ratio(self, this: float | None, study: float | None, quantity: str) -> Value:
        return missing() if self.incomparable else ratio(this, study, quantity)

    def spread_cell(
        self, figure: Callable[[Derived], float | None], keys: list[GroupKey], quantity: str, **options
    ) -> Value:
        """The min-max of a figure over its groups' runs, the n per group and the verdict (SPREAD_NOTE)."""
        if any(key[2] is None or key not in self.groups for key in keys):
            return missing()
        runs = "/".join(str(self.groups[key].n) for key in keys)
        found = spread(self.groups, figure, keys)
        if found is None:  # the study's published means as "this cluster" (bench.report --study)
            return text(f"spread not published (n={runs})")
        return text(spread_text(found, quantity, **options))

    def epochs_heading(self, epochs: int | None, study_epochs: int) -> str:
        return f"{epochs} ep" if epochs is not None else f"(no runs; study {study_epochs} ep)"

    def _mismatch_notes(self, table: str) -> list[str]:
        return [m for t, m in self.study_mismatches if t == table]

    # --- the study's tables --------------------------------------------------

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

    def table_5_7(self) -> Table:
        epochs, gpu_counts = self.short, self.gpu_counts()
        columns = ["Framework"]
        for gpus in gpu_counts:
            columns += [f"{self.label(None, gpus)} (s)", f"Study, {self.study_label(gpus)} (s)", "This/study"]
        for gpus in gpu_counts:
            columns += [
                f"Overhead vs DDP, {self.label(None, gpus)}",
                f"Study, {self.study_label(gpus)}",
                "This/study",
            ]
        columns += [f"Overhead min–max, {self.label(None, gpus)}" for gpus in gpu_counts]
        rows = []
        for framework in self.frameworks():
            row = [text(self.name(framework))]
            for gpus in gpu_counts:
                row += self.pair(
                    self.this.time(framework, gpus, epochs),
                    self.pub.runs.get((framework, gpus, STUDY_SHORT_EPOCHS), (None, None))[0],
                    "time_s",
                )
            for gpus in gpu_counts:
                this = self.this.overhead_x(framework, gpus, epochs)
                study = self.pub.overhead_x.get((framework, gpus))
                row += [
                    self._overhead_text(this, framework),
                    self._study_overhead_text(study, gpus),
                    self.ratio(this, study, "overhead_x"),
                ]
            for gpus in gpu_counts:
                row.append(
                    text("– (baseline)")
                    if framework == BASELINE and self.stats(BASELINE, gpus, epochs)
                    else self.spread_cell(
                        lambda d, f=framework, g=gpus: d.overhead_x(f, g, epochs),
                        [(framework, gpus, epochs), (BASELINE, gpus, epochs)],
                        "overhead_x",
                        suffix="×",
                    )
                )
            rows.append(row)
        return Table(
            "5.7",
            "table-5.7-time",
            f"Training time comparison ({self.epochs_heading(epochs, 20)}; study 20 epochs)",
            columns,
            rows,
            [
                "Overhead vs DDP: whole-run time over DDP's at the same count; in percent it is section "
                "5.3.1's single-GPU overhead (study: 23% and 272%). Whole-run times compare with the "
                "study's only when the epoch counts agree.",
                SPREAD_NOTE,
                STUDY_SPREAD_NOTE,
            ],
        )

    @staticmethod
    def _overhead_text(value: float | None, framework: str) -> Value:
        if value is None:
            return missing()
        if framework == BASELINE:
            return Value(f"{fmt(value, 'overhead_x')}× (baseline)", value)
        return Value(
            f"{fmt(value, 'overhead_x')}× ({fmt((value - 1) * 100, 'overhead_pct', sign=True)}%)", value
        )

    @staticmethod
    def _study_overhead_text(value: float | None, gpus: int) -> Value:
        if value is None:
            return missing()
        if gpus == STUDY_BASE_GPUS:  # printed as a percentage in section 5.3.1
            return Value(f"{fmt((value - 1) * 100, 'overhead_pct', sign=True)}%", value)
        return Value(f"{fmt(value, 'overhead_x')}×", value)

    def table_5_8(self) -> Table:
        epochs, rows = self.short, []
        for framework in self.frameworks():
            own_base = self.this.base_gpus(framework)
            base = own_base if own_base is not None else STUDY_BASE_GPUS  # no runs: the study's rows
            pairs = [(base, g) for g in self.gpu_counts(framework) if g > base]
            study_pair = (STUDY_BASE_GPUS, STUDY_SCALED_GPUS)
            if (framework, STUDY_SCALED_GPUS) in self.pub.speedup and study_pair not in pairs:
                pairs.append(study_pair)  # e.g. only 2-GPU runs here: the study's row stays, ours "—"
            for base, gpus in pairs:
                is_study_pair = (base, gpus) == study_pair
                key = (framework, gpus)

                def study(table: dict, key=key, is_study_pair=is_study_pair):
                    return table.get(key) if is_study_pair else None

                rows.append(
                    [
                        text(self.name(framework)),
                        text(f"{self.label(framework, gpus)} vs {base}"),
                        *self.pair(
                            self.this.speedup(framework, gpus, epochs, base),
                            study(self.pub.speedup),
                            "speedup",
                            suffix="×",
                        ),
                        *self.pair(
                            self.this.efficiency_pct(framework, gpus, epochs, base),
                            study(self.pub.efficiency_pct),
                            "efficiency_pct",
                            suffix="%",
                        ),
                        *self.pair(
                            self.this.reduction_pct(framework, gpus, epochs, base),
                            study(self.pub.reduction_pct),
                            "reduction_pct",
                            suffix="%",
                        ),
                        *(
                            self.spread_cell(
                                lambda d, f=framework, g=gpus, b=base, m=method: getattr(d, m)(
                                    f, g, epochs, b
                                ),
                                [(framework, base, epochs), (framework, gpus, epochs)],
                                quantity,
                                suffix=suffix,
                            )
                            for method, quantity, suffix in (
                                ("speedup", "speedup", "×"),
                                ("efficiency_pct", "efficiency_pct", "%"),
                                ("reduction_pct", "reduction_pct", "%"),
                            )
                        ),
                    ]
                )
        return Table(
            "5.8",
            "table-5.8-scaling",
            f"Speedup and scaling efficiency ({self.epochs_heading(epochs, 20)}"
            "; study 20 epochs, 2 GPUs vs 1)",
            [
                "Framework",
                "Scaling",
                "Speedup",
                "Study speedup",
                "This/study",
                "Efficiency",
                "Study efficiency",
                "This/study",
                "Time reduction",
                "Study time reduction",
                "This/study",
                "Speedup min–max",
                "Efficiency min–max",
                "Time reduction min–max",
            ],
            rows,
            [
                "Speedup = T(smallest count) / T(count); efficiency = speedup / (count / smallest "
                "count); time reduction = 1 − T(count) / T(smallest count) (section 5.3.1).",
                SPREAD_NOTE,
                STUDY_SPREAD_NOTE,
            ],
        )

    def table_5_9(self) -> Table:
        epochs, rows = self.short, []
        for framework in self.frameworks():
            for gpus in self.gpu_counts(framework):
                baseline = framework == BASELINE and self.this.per_epoch(BASELINE, gpus, epochs) is not None
                extra_s = self.this.overhead_per_epoch_s(framework, gpus, epochs)
                extra_pct = self.this.overhead_per_epoch_pct(framework, gpus, epochs)
                study_s = self.pub.overhead_s.get((framework, gpus))
                study_pct = self.pub.overhead_pct.get((framework, gpus))
                rows.append(
                    [
                        text(self.name(framework)),
                        text(self.label(framework, gpus)),
                        *self.pair(
                            self.this.per_epoch(framework, gpus, epochs),
                            self.pub.per_epoch_s.get((framework, gpus, STUDY_SHORT_EPOCHS)),
                            "per_epoch_s",
                        ),
                        text("– (baseline)")
                        if baseline
                        else num(extra_s, "overhead_s", sign=True, suffix=" s"),
                        num(study_s, "overhead_s", sign=True, suffix=" s"),
                        self.ratio(extra_s, study_s, "overhead_s"),
                        text("– (baseline)")
                        if baseline
                        else num(extra_pct, "overhead_pct", sign=True, suffix="%"),
                        num(study_pct, "overhead_pct", sign=True, suffix="%"),
                        self.ratio(extra_pct, study_pct, "overhead_pct"),
                        self.spread_cell(
                            lambda d, f=framework, g=gpus: d.per_epoch(f, g, epochs),
                            [(framework, gpus, epochs)],
                            "per_epoch_s",
                        ),
                        text("– (baseline)")
                        if baseline
                        else self.spread_cell(
                            lambda d, f=framework, g=gpus: d.overhead_per_epoch_pct(f, g, epochs),
                            [(framework, gpus, epochs), (BASELINE, gpus, epochs)],
                            "overhead_pct",
                            sign=True,
                            suffix="%",
                        ),
                    ]
                )
        return Table(
            "5.9",
            "table-5.9-overhead",
            f"Per-epoch training time and overhead vs DDP "
            f"({self.epochs_heading(epochs, 20)}; study 20 epochs, overhead at 2 GPUs)",
            [
                "Framework",
                "Configuration",
                "s/epoch",
                "Study s/epoch",
                "This/study",
                "Overhead (s)",
                "Study overhead (s)",
                "This/study",
                "Overhead (%)",
                "Study overhead (%)",
                "This/study",
                "s/epoch min–max",
                "Overhead (%) min–max",
            ],
            rows,
            [
                "Study s/epoch at 1 GPU is Table 5.4's; the study prints overheads at 2 GPUs only.",
                SPREAD_NOTE,
                STUDY_SPREAD_NOTE,
            ],
        )

    # --- beyond the study ----------------------------------------------------

    def throughput_table(self) -> Table:
        rows = []
        for stats in self.groups.values():
            rows.append(
                [
                    text(self.name(stats.framework)),
                    text(self.label(stats.framework, stats.gpus)),
                    text(str(stats.epochs)),
                    text(str(stats.n)),
                    num(stats.samples_per_s_mean, "samples_per_s"),
                    num(stats.samples_per_s_std, "samples_per_s"),
                    num(stats.gpu_util_mean, "gpu_util_pct", suffix="%")
                    if stats.gpu_util_mean is not None
                    else text("not recorded"),
                    num(stats.peak_rss_mb_mean, "memory_mb"),
                    num(stats.harness_extra_s_mean, "time_s"),
                ]
            )
        return Table(
            "B.1",
            "table-b.1-throughput",
            "Throughput, GPU utilisation and harness time (beyond the study)",
            [
                "Framework",
                "Configuration",
                "Epochs",
                "Runs",
                "Samples/s mean",
                "Samples/s std",
                "GPU utilisation",
                "Peak RSS (MB)",
                "Harness time beyond trainer (s)",
            ],
            rows,
            [
                "Samples/s and GPU utilisation as the trainer measured them; harness time is the "
                "controller's wall time for the cell minus the trainer's whole-run time."
            ],
        )

    def scored_table(self, target_accuracy: float | None) -> Table:
        """Table B.7: each group's MLPerf-style score, the runs it rests on, and a rank at its count that
        only a supported difference earns."""
        scores = {
            key: score(stats.times, stats.accuracies, target_accuracy) for key, stats in self.groups.items()
        }
        rows = []
        for key, stats in self.groups.items():
            framework, gpus, epochs = key
            scored = scores[key]
            low, high = stats.time_range or (None, None)
            rows.append(
                [
                    text(self.name(framework)),
                    text(self.label(framework, gpus)),
                    text(str(epochs)),
                    text(str(scored.runs)),
                    text(str(scored.missed_target) if target_accuracy is not None else "no target"),
                    text(str(scored.used)),
                    text("invalid: 2 or more runs missed the target")
                    if scored.invalid
                    else num(scored.value, "time_s"),
                    text(f"{fmt(low, 'time_s')}–{fmt(high, 'time_s')}")
                    if stats.n >= 2
                    else text("1 run, no spread"),
                    text(self._rank(key, scores)),
                ]
            )
        target = f"{fmt(target_accuracy, 'accuracy')}" if target_accuracy is not None else "none set"
        return Table(
            "B.7",
            "table-b.7-scored",
            f"Scored time per cell, MLPerf-style (target accuracy: {target}; beyond the study)",
            [
                "Framework",
                "Configuration",
                "Epochs",
                "Runs",
                "Missed target",
                "Runs scored",
                "Score (s)",
                "Time min–max (s)",
                "Rank at this count",
            ],
            rows,
            [
                "Score: the mean whole-run time after dropping the fastest and the slowest run when there "
                f"are at least {TRIM_FROM_RUNS}; a run under the profile's target_accuracy counts as the "
                "slowest (dropped), and two such runs make the cell invalid (MLPerf's training rules). "
                "Rank: 1 + the cells at the same count and epochs that are faster beyond the spread (their "
                f"slowest run faster than this one's fastest); a cell with fewer than {MIN_RUNS_FOR_SPREAD} "
                "runs, or invalid, is not ranked, and cells within noise of each other share a rank.",
            ],
        )

    def _rank(self, key: GroupKey, scores: dict[GroupKey, Score]) -> str:
        stats = self.groups[key]
        if scores[key].invalid:
            return "not ranked (invalid)"
        if stats.n < MIN_RUNS_FOR_SPREAD:
            return f"not ranked ({stats.n} run{'s' if stats.n != 1 else ''})"
        _f, gpus, epochs = key
        rivals = [
            other
            for other_key, other in self.groups.items()
            if other_key != key
            and other_key[1:] == (gpus, epochs)
            and other.n >= MIN_RUNS_FOR_SPREAD
            and not scores[other_key].invalid
        ]
        fastest = min(stats.times)
        return str(1 + sum(max(other.times) < fastest for other in rivals))

    @staticmethod
    def _end_to_end_spread(stats: GroupStats, ddp: GroupStats | None) -> Value:
        if ddp is None or not ddp.end_to_end:
            return missing()
        if stats is ddp:
            return text("– (baseline)")
        found = ratio_spread(stats.end_to_end, ddp.end_to_end)
        return text(spread_text(found, "ratio", suffix="×")) if found is not None else missing()

    def whole_run_table(self) -> Table:
        """Where each platform's time goes, from the controller's submit to the recorded result."""
        rows = []
        for (framework, gpus, epochs), stats in self.groups.items():
            if not stats.phase_means:
                continue
            phases = dict(stats.phase_means)
            ddp = self.groups.get((BASELINE, gpus, epochs))
            ddp_total = dict(ddp.phase_means)["end to end"] if ddp is not None and ddp.phase_means else None
            rows.append(
                [
                    text(self.name(framework)),
                    text(self.label(framework, gpus)),
                    text(str(epochs)),
                    *(
                        num(phases[phase], "time_s") if phase in phases else missing()
                        for phase, _, _ in PHASE_COLUMNS
                    ),
                    ratio(phases["end to end"], ddp_total),
                    self._end_to_end_spread(stats, ddp),
                ]
            )
        return Table(
            "B.3",
            "table-b.3-whole-run",
            "The whole run, phase by phase: mean seconds (beyond the study)",
            [
                "Framework",
                "Configuration",
                "Epochs",
                *(phase for phase, _, _ in PHASE_COLUMNS),
                "End to end vs DDP",
                "End to end vs DDP, min–max",
            ],
            rows,
            [
                "Tables 5.1-5.9 use the trainer's span: from the start of training (after imports, data, "
                "model and process group) to the end of the last validation, which ends the third phase "
                "here and begins inside the second. The study's figures are compared with that span: its "
                "training "
                "script timed each run with Python's time module, so its figures leave out the platform's "
                "start-up too. This table adds what each platform costs around that span: from the "
                "controller taking up the cell to the trainer process running (SSH, units, JVMs and "
                "executors, containers), to the first optimizer step (imports, data, model, rendezvous), "
                'and from the end of validation to the result recorded on the controller. "Of which '
                'queued" is the part of the first phase a scheduler held the job in its queue (Slurm: from '
                "sbatch's job id to the job leaving PENDING); platforms without a queue show —. Runs "
                "recorded before dtlab kept this clock are left out of it.",
                SPREAD_NOTE,
            ],
        )

    # --- time to target accuracy (Table B.8) -----------------------------------------------------

    def time_to_target_table(self, target_accuracy: float | None, profile: str | None) -> Table:
        """Table B.8: per group, the runs that reached the target, the epoch they did (the same on every
        platform for the same seed, or not) and the whole-run clock from submit to that epoch's end."""
        title = "Time to target accuracy: from submit to the end of the first epoch at the target"
        if target_accuracy is None:
            where = f"profiles.{profile}" if profile else "the profile"
            return Table(
                "B.8",
                "table-b.8-time-to-target",
                f"{title} (no target set; beyond the study)",
                TIME_TO_TARGET_COLUMNS,
                [],
                [
                    f"No target accuracy: set target_accuracy (e.g. 0.80) under {where} in "
                    "experiments/matrix.yml to get the time to target."
                ],
            )
        found = time_to_target(self.groups, target_accuracy)
        disagreeing = epoch_disagreements(found)
        rows = []
        for key, runs in found.items():
            framework, gpus, epochs = key
            times = [run.seconds for run in runs if run.seconds is not None]
            ddp = [run.seconds for run in found.get((BASELINE, gpus, epochs), ()) if run.seconds is not None]
            rows.append(
                [
                    text(self.name(framework)),
                    text(self.label(framework, gpus)),
                    text(str(epochs)),
                    text(str(len(runs))),
                    text(str(sum(run.epoch is not None for run in runs))),
                    text(_epochs_to_target(runs)),
                    text(_agreement(key, runs, disagreeing, found)),
                    num(sum(times) / len(times) if times else None, "time_s"),
                    text(_own_spread(times)) if times else missing(),
                    self._to_target_vs_ddp(framework, times, ddp),
                ]
            )
        notes = [
            "Time to target: the whole-run clock (Table B.3) from the controller's submit to the end of the "
            "validation of the first epoch whose accuracy reached the target, mean over the runs that "
            "reached it. The trainer records no per-epoch timestamp: an epoch's end is the start of "
            "training plus the train and validation times of the epochs up to it, plus its share of the "
            "time between epochs (checkpoints), so the last epoch ends at the recorded end of training. "
            "Runs recorded before the whole-run clock have an epoch but no time.",
            "Same epoch on every platform: runs with the same seed at the same count and epochs train on the "
            "same numbers, so they reach the target at the same epoch; any other outcome is listed.",
            SPREAD_NOTE,
        ]
        if disagreeing:
            notes.append(
                "Platforms that reached the target at different epochs for the same seed: "
                + "; ".join(self._disagreement_text(k, v) for k, v in disagreeing.items())
                + "."
            )
        return Table(
            "B.8",
            "table-b.8-time-to-target",
            f"{title} (target accuracy: {fmt(target_accuracy, 'accuracy')}; beyond the study)",
            TIME_TO_TARGET_COLUMNS,
            rows,
            notes,
        )

    def _disagreement_text(self, key: tuple[int, int, int], platforms: dict[str, int | None]) -> str:
        gpus, epochs, seed = key
        found = ", ".join(
            f"{DISPLAY_NAMES.get(f, f)} {'never' if e is None else e}" for f, e in platforms.items()
        )
        return f"{self.label(None, gpus)}, {epochs} ep, seed {seed}: {found}"

    @staticmethod
    def _to_target_vs_ddp(framework: str, times: list[float], ddp: list[float]) -> Value:
        if framework == BASELINE:
            return text("– (baseline)") if times else missing()
        found = ratio_spread(times, ddp)
        return text(spread_text(found, "ratio", suffix="×")) if found is not None else missing()

    # --- where this cluster disagrees with the study (item 6) ------------------------------------

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


TIME_TO_TARGET_COLUMNS = [
    "Framework",
    "Configuration",
    "Epochs",
    "Runs",
    "Reached target",
    "Epochs to target",
    "Same epoch on every platform",
    "Time to target mean (s)",
    "Time to target min–max (s)",
    "Time to target vs DDP, min–max",
]


def _epochs_to_target(runs: Iterable[Reached]) -> str:
    """ "3", or per seed when they differ: "3 (seeds 1, 2), never (seed 3)"."""
    by_epoch: dict[int | None, list[int]] = {}
    for run in runs:
        by_epoch.setdefault(run.epoch, []).append(run.seed)
    if len(by_epoch) == 1:
        [epoch] = by_epoch
        return "never" if epoch is None else str(epoch)
    return ", ".join(
        f"{'never' if epoch is None else epoch} ({_seeds(seeds)})"
        for epoch, seeds in sorted(by_epoch.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    )


def _agreement(key: GroupKey, runs: Iterable[Reached], disagreeing: dict, found: dict) -> str:
    framework, gpus, epochs = key
    seeds = [run.seed for run in runs if (gpus, epochs, run.seed) in disagreeing]
    if seeds:
        return f"no: {_seeds(seeds)} (see the note)"
    others = {
        run.seed
        for (f, g, e), other in found.items()
        if (g, e) == (gpus, epochs) and f != framework
        for run in other
    }
    if not others & {run.seed for run in runs}:
        return "no other platform ran these seeds"
    return "yes"


def _seeds(seeds: list[int]) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def _own_spread(times: list[float]) -> str:
    """A group's own min-max, with the marks the other tables use."""
    found = Spread(min(times), max(times), (len(times),), overlap=False)
    return spread_text(found, "time_s")


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


@dataclass(frozen=True)
class ResumedCost:
    """One run resumed from a checkpoint, with every attempt it took (dtlab.report.build)."""

    cell_key: str
    attempts: int
    resumed_from: int
    epochs_redone: int | None  # None: an attempt's logs are missing or lack the trainer's lines
    trainer_time_s: float
    whole_harness_s: float | None
    undisturbed_harness_s: float | None  # mean over the undisturbed runs of the same group


def resumed_table(costs: Iterable[ResumedCost]) -> Table:
    """Table B.4: the whole cost of each run resumed from a checkpoint."""
    rows = []
    for cost in costs:
        extra = (
            cost.whole_harness_s - cost.undisturbed_harness_s
            if cost.whole_harness_s is not None and cost.undisturbed_harness_s is not None
            else None
        )
        rows.append(
            [
                text(cost.cell_key),
                text(str(cost.attempts)),
                text(str(cost.resumed_from)),
                text("not logged") if cost.epochs_redone is None else text(str(cost.epochs_redone)),
                num(cost.trainer_time_s, "time_s"),
                num(cost.whole_harness_s, "time_s"),
                num(cost.undisturbed_harness_s, "time_s"),
                num(extra, "time_s", sign=True),
            ]
        )
    return Table(
        "B.4",
        "table-b.4-resumed",
        "Runs resumed from a checkpoint: their whole cost (left out of Tables 5.1-5.9)",
        [
            "Cell",
            "Attempts",
            "Resumed after epoch",
            "Epochs redone",
            "Trainer span (s)",
            "All attempts, controller (s)",
            "Undisturbed runs, controller (s)",
            "Cost of the interruption (s)",
        ],
        rows,
        [
            "Attempts: the cell's attempts since its previous success, the failed ones and the resumed one. "
            "Epochs redone: epochs a failed attempt began past the checkpoint it left, which the resumed "
            "attempt trained again (the one it was in counts whole), read from the attempts' logs. The "
            "trainer span carries the checkpointed epochs' time over from the earlier attempt and misses "
            "the lost work; the controller's times (the whole cell, every attempt, and the mean of the "
            "same group's undisturbed runs) include it.",
        ],
    )


def failures_table(failed: Iterable[Run], ok_runs: Iterable[Run]) -> Table:
    """Table B.2. "Cell later ok": an ok attempt of the same cell came after this failure (a failure
    recorded after a success says no: the cell's latest state is that failure)."""
    ok_attempts: dict[str, list[int]] = {}
    for ok in ok_runs:
        ok_attempts.setdefault(ok.cell_key, []).append(ok.attempt)
    rows = [
        [
            text(run.cell_key),
            text(run.cell.profile),
            text(str(run.attempt)),
            text(run.failed_node or "—"),
            text("—" if run.exit_code is None else str(run.exit_code)),
            text(run.reason or "—"),
            text("yes" if any(later > run.attempt for later in ok_attempts.get(run.cell_key, ())) else "no"),
            text(run.recorded_at),
        ]
        for run in failed
    ]
    return Table(
        "B.2",
        "table-b.2-failures",
        "Failed attempts (kept; a later attempt may have succeeded)",
        ["Cell", "Profile", "Attempt", "Node", "Exit code", "Reason", "Cell later ok", "Recorded"],
        rows,
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
