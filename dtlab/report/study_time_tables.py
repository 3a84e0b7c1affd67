"""The study's Tables 5.7-5.9: whole-run time and overhead vs DDP, speedup and scaling, per-epoch overhead."""

from __future__ import annotations

from dtlab.platforms import BASELINE
from dtlab.report.numbers import Value, fmt, missing, num, text
from dtlab.report.study import STUDY_BASE_GPUS, STUDY_SCALED_GPUS, STUDY_SHORT_EPOCHS
from dtlab.report.table_base import SPREAD_NOTE, STUDY_SPREAD_NOTE, Table, TableContext


class StudyTimeTables(TableContext):
    """Tables 5.7-5.9: time, overhead against DDP and scaling, this cluster beside the study."""

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
