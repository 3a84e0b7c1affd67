"""What every report table shares: the Table record, configuration labels, the min-max notes and
TableContext, the aggregated groups and the study's figures with the helpers that turn them into cells.

Every numeric pair is three adjacent columns: this cluster, the study as printed, and this/study.
A figure missing on either side is shown as missing (numbers.MISSING), never filled in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dtlab.report.aggregate import Derived, GroupKey, GroupStats, Spread, spread
from dtlab.report.numbers import Value, fmt, missing, num, ratio, text
from dtlab.report.study import DISPLAY_NAMES, FRAMEWORKS, Published


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


class TableContext:
    """What every table reads: this cluster's group statistics and the study's published figures, with
    the helpers that name rows and fill cells (the tables themselves: study_tables, study_time_tables,
    own_tables, target_table, disagreements; composed as tables.TableBuilder)."""

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
