"""Figure 5.1 (grouped bars of overhead against DDP, this cluster beside the study), the per-epoch
accuracy curves, the fault timelines and the strategies' lines over model size, with matplotlib/Agg."""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from dtlab import platforms
from dtlab.report.decision_figure import BASELINE_MARK, DID_NOT_RECOVER, EXACT, MEASURED
from dtlab.report.strategies import model_size_rank
from dtlab.report.study import DISPLAY_NAMES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from dtlab.report.decision_figure import CriterionPanel, Mark
    from dtlab.report.faults import FaultOutcome
    from dtlab.report.strategies import SizePoint


@functools.cache
def _matplotlib() -> SimpleNamespace:
    """matplotlib's pieces, imported on the first drawing: they take 0.8 s to import, which every
    `invoke` task that draws nothing (bench.run, cluster.check) would pay at start-up."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    return SimpleNamespace(FigureCanvasAgg=FigureCanvasAgg, Figure=Figure, Line2D=Line2D, Patch=Patch,
                           MaxNLocator=MaxNLocator)


FIGURE_SIZE_IN = (8.0, 4.5)
WIDE_FIGURE_SIZE_IN = (11.0, 4.5)  # Figure 5.1 with this cluster and the study side by side
FIGURE_DPI = 100  # so a figure is 800 x 450 pixels (1100 x 450 wide)
FRAMEWORK_COLOURS = {platform.name: platform.colour for platform in platforms.ALL}
_OTHER_COLOUR = "#7f7f7f"
_MISSING_COLOUR = "#999999"


def _new_figure() -> Figure:
    mpl = _matplotlib()
    figure = mpl.Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    mpl.FigureCanvasAgg(figure)
    return figure


@dataclass(frozen=True)
class Bar:
    """One bar of Figure 5.1: its value, its min-max where known (None: one run, or not published) and
    the text written on it."""

    value: float
    low: float | None
    high: float | None
    label: str


@dataclass(frozen=True)
class BarPanel:
    """One side of Figure 5.1: a bar per (framework, count); a missing one is marked, not dropped."""

    title: str
    bars: Mapping[tuple[str, int], Bar]
    counts: Sequence[int]  # the groups this side should have
    count_label: Callable[[int], str]
    missing_text: str  # what a missing bar says: "no run" here, "not published" for the study
    # A missing bar's own reason where it differs from missing_text (e.g. "no DDP run" at that count).
    missing_reasons: Mapping[tuple[str, int], str] = field(default_factory=dict)


def grouped_bars(
    panels: Sequence[BarPanel], *, frameworks: Sequence[str], title: str, ylabel: str, baseline: float | None
) -> Figure:
    """Figure 5.1: grouped bars per count, one bar per framework, all panels on one y scale.

    Every bar carries its label; its min-max is drawn where a side has one (the study published none);
    a framework missing at a count gets a grey mark saying why, so a gap never reads as zero. A dashed
    line marks the baseline (1.0: as fast as DDP).
    """
    mpl = _matplotlib()
    figure = mpl.Figure(figsize=WIDE_FIGURE_SIZE_IN if len(panels) > 1 else FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    mpl.FigureCanvasAgg(figure)
    axes_row = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    width = 0.8 / max(len(frameworks), 1)
    tallest = max(
        (max(bar.value, bar.high or 0.0) for panel in panels for bar in panel.bars.values()), default=1.0
    )
    for axes, panel in zip(axes_row, panels, strict=True):
        for index, framework in enumerate(frameworks):
            positions, drawn, gaps = [], [], []
            for group_index, count in enumerate(panel.counts):
                position = group_index + (index - (len(frameworks) - 1) / 2) * width
                if (framework, count) in panel.bars:
                    positions.append(position)
                    drawn.append(panel.bars[(framework, count)])
                else:
                    gaps.append((position, panel.missing_reasons.get((framework, count), panel.missing_text)))
            has_spread = any(bar.low is not None for bar in drawn)
            bars = axes.bar(
                positions,
                [bar.value for bar in drawn],
                width * 0.95,
                yerr=[
                    [bar.value - bar.low if bar.low is not None else 0.0 for bar in drawn],
                    [bar.high - bar.value if bar.high is not None else 0.0 for bar in drawn],
                ]
                if has_spread
                else None,
                capsize=4,
                color=FRAMEWORK_COLOURS.get(framework, _OTHER_COLOUR),
                label=DISPLAY_NAMES.get(framework, framework),
                error_kw={"ecolor": "black", "elinewidth": 1},
            )
            axes.bar_label(bars, [bar.label for bar in drawn], rotation=90, padding=3, fontsize=7)
            for position, reason in gaps:
                axes.text(position, tallest * 0.02, reason, rotation=90, ha="center",
                          va="bottom", fontsize=7, color=_MISSING_COLOUR)
        if baseline is not None:
            axes.axhline(baseline, color="black", linestyle="--", linewidth=0.8)
        axes.set_xticks(range(len(panel.counts)), [panel.count_label(c) for c in panel.counts])
        if not panel.counts:
            axes.text(0.5, 0.5, "no successful runs yet", transform=axes.transAxes, ha="center",
                      color=_MISSING_COLOUR)
            axes.set_xticks([])
        axes.set_title(panel.title, fontsize="medium")
        axes.grid(axis="y", alpha=0.3)
    axes_row[0].set_ylim(0, tallest * 1.35)  # room for the rotated value labels
    axes_row[0].set_ylabel(ylabel)
    axes_row[-1].legend(
        handles=[mpl.Patch(color=FRAMEWORK_COLOURS.get(f, _OTHER_COLOUR), label=DISPLAY_NAMES.get(f, f))
                 for f in frameworks],
        loc="upper right",
        fontsize="small",
    )
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def accuracy_curves(
    curves: Mapping[tuple[str, int], tuple[tuple[int, float], ...]],
    *,
    count_label: Callable[[int], str],
    title: str,
) -> Figure:
    """Validation accuracy per epoch (mean over seeds), one line per framework and count."""
    mpl = _matplotlib()
    figure = _new_figure()
    axes = figure.add_subplot()
    styles = ["-", "--", ":", "-."]
    counts = sorted({k[1] for k in curves})
    for (framework, count), curve in curves.items():
        axes.plot(
            [epoch for epoch, _accuracy in curve],
            [accuracy for _epoch, accuracy in curve],
            styles[counts.index(count) % len(styles)],
            marker=".",
            color=FRAMEWORK_COLOURS.get(framework, _OTHER_COLOUR),
            label=f"{DISPLAY_NAMES.get(framework, framework)}, {count_label(count)}",
        )
    axes.set_xlabel("Epoch")
    axes.xaxis.set_major_locator(mpl.MaxNLocator(integer=True))
    axes.set_ylabel("Validation accuracy")
    axes.set_title(title)
    axes.legend(fontsize="small")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def size_lines(
    lines: Mapping[tuple[str, str, int, int], Sequence[SizePoint]],
    *,
    count_label: Callable[[int], str],
    title: str,
) -> Figure:
    """Figure B.4: step time and peak memory per worker as the model grows, one line per (strategy,
    platform, world size, epochs): the mean over runs, with the min-max where a size has 2 or more, and
    the runs behind each point written beside it (a single run has no spread)."""
    mpl = _matplotlib()
    figure = mpl.Figure(figsize=WIDE_FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    mpl.FigureCanvasAgg(figure)
    step_axes, memory_axes = figure.subplots(1, 2)
    models = sorted({point.model for points in lines.values() for point in points}, key=model_size_rank)
    styles = ["-", "--", ":", "-."]
    frameworks = sorted({framework for _s, framework, _g, _e in lines})
    for (strategy, framework, gpus, epochs), points in lines.items():
        label = f"{strategy}, {DISPLAY_NAMES.get(framework, framework)}, {count_label(gpus)}, {epochs} ep."
        for axes, values_of in ((step_axes, lambda p: p.step_ms), (memory_axes, lambda p: p.memory_mb)):
            drawn = [(models.index(p.model), values_of(p)) for p in points if values_of(p)]
            if not drawn:
                continue
            xs = [x for x, _ in drawn]
            means = [sum(v) / len(v) for _, v in drawn]
            axes.errorbar(xs, means, yerr=[[m - min(v) for m, (_, v) in zip(means, drawn, strict=True)],
                                           [max(v) - m for m, (_, v) in zip(means, drawn, strict=True)]],
                          fmt=styles[frameworks.index(framework) % len(styles)], marker="o", capsize=3,
                          label=label)
            for x, mean, (_, values) in zip(xs, means, drawn, strict=True):
                axes.annotate(f"n={len(values)}", (x, mean), textcoords="offset points", xytext=(5, 4),
                              fontsize=7, color=_MISSING_COLOUR)
    for axes, ylabel in ((step_axes, "Steady step time (ms)"), (memory_axes, "Peak memory per worker (MB)")):
        axes.set_xticks(range(len(models)), models)
        axes.set_xlim(-0.4, len(models) - 0.6)  # room for the run counts beside the end points
        axes.set_xlabel("Model (smallest first)")
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
    memory_axes.legend(fontsize="x-small")
    figure.suptitle(title)
    figure.tight_layout()
    return figure


# The fault timeline's moments: (FaultOutcome's seconds, marker, face colour, legend label). Black-edged
# and in colours no framework has, so they show on every framework's bar.
_FAULT_MOMENTS = (
    ("fault", "X", "#ffd700", "fault injected"),
    ("detected", "|", "black", "detected"),
    ("training_again", ">", "white", "training again"),
)


def _moment_style(marker: str, face: str) -> dict:
    return {"marker": marker, "linestyle": "", "markersize": 9, "markerfacecolor": face,
            "markeredgecolor": "black", "markeredgewidth": 2 if marker == "|" else 1}


_LEGEND_ROW_IN = 0.35


def fault_timelines(outcomes: Sequence[FaultOutcome], *, title: str) -> Figure:
    """One row per faulted run: its undisturbed twin's bar (0 -> its total, pale) above the faulted
    run's (0 -> its total over every attempt), with the fault, its detection and training going on
    again marked on the faulted bar. A run that did not recover is hatched; a missing twin says so."""
    mpl = _matplotlib()
    height = 1.3 + 0.75 * len(outcomes)
    figure = mpl.Figure(figsize=(FIGURE_SIZE_IN[0], height), dpi=FIGURE_DPI)
    mpl.FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    longest = max((t for o in outcomes for t in (o.total_s, o.undisturbed_s) if t is not None), default=1.0)
    for row, outcome in enumerate(outcomes):
        colour = FRAMEWORK_COLOURS.get(outcome.framework, _OTHER_COLOUR)
        twin_y, faulted_y = row - 0.18, row + 0.18  # the y axis is inverted below
        if outcome.undisturbed_s is not None:
            axes.barh(twin_y, outcome.undisturbed_s, 0.32, color=colour, alpha=0.35)
        else:
            axes.text(0, twin_y, " no undisturbed run recorded", va="center", fontsize=7,
                      color=_MISSING_COLOUR)
        if outcome.total_s is not None:
            axes.barh(faulted_y, outcome.total_s, 0.32, color=colour,
                      hatch=None if outcome.recovered else "//", edgecolor="white")
        if not outcome.recovered:
            axes.text(outcome.total_s or 0, faulted_y, f" {outcome.state}", va="center", fontsize=7)
        if outcome.fault_at_s is not None:
            moments = {"fault": 0.0, "detected": outcome.detected_s,
                       "training_again": outcome.training_again_s}
            for name, marker, face, _label in _FAULT_MOMENTS:
                if moments[name] is not None:
                    axes.plot(outcome.fault_at_s + moments[name], faulted_y, **_moment_style(marker, face))
    axes.set_yticks(range(len(outcomes)), [f"{o.name}\n{o.undisturbed_key}" for o in outcomes], fontsize=8)
    axes.invert_yaxis()  # the table's order, top to bottom
    axes.set_xlim(0, longest * 1.08)
    axes.set_xlabel("Seconds from the run's first submit")
    axes.grid(axis="x", alpha=0.3)
    figure.legend(
        handles=[
            mpl.Patch(color=_OTHER_COLOUR, alpha=0.35, label="undisturbed run"),
            mpl.Patch(color=_OTHER_COLOUR, label="faulted run, every attempt"),
            *(mpl.Line2D([], [], label=label, **_moment_style(marker, face))
              for _name, marker, face, label in _FAULT_MOMENTS),
        ],
        loc="lower center", ncol=5, fontsize="small", frameon=False,
    )
    axes.set_title(title, fontsize="medium")
    figure.tight_layout(rect=(0, _LEGEND_ROW_IN / height, 1, 1))  # the legend's row below the axes
    return figure


DECISION_WIDTH_IN = 11.6  # 1160 px: the HTML report's column at 1280 px, so it is never scaled down
_ROW_IN = 0.5
_LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.5}  # over a reference line


def _decision_mark(axes, y: float, mark: Mark, colour: str, right: float) -> None:
    """One platform's mark in one column of Figure B.5 (dtlab.report.decision_figure's kinds)."""
    kind = mark.kind
    if kind in (MEASURED, BASELINE_MARK):
        error = ([[mark.value - mark.low], [mark.high - mark.value]] if mark.low is not None else None)
        axes.barh(y, mark.value, 0.55, color=colour, xerr=error, capsize=3,
                  error_kw={"ecolor": "black", "elinewidth": 1})
        end = mark.high if mark.high is not None else mark.value
        axes.annotate(mark.label, (end, y), xytext=(3, 0), textcoords="offset points", va="center",
                      fontsize=8.5, bbox=_LABEL_BOX)
    elif kind == EXACT:  # a count from the repository, e.g. 0 MiB for no daemon: a tick, not a bar
        axes.plot([mark.value], [y], marker="|", markersize=16, markeredgewidth=2.5, color=colour)
        axes.annotate(textwrap.fill(mark.label, 24), (mark.value, y), xytext=(5, 0),
                      textcoords="offset points", va="center", fontsize=8.5)
    elif kind == DID_NOT_RECOVER:
        axes.barh(y, right, 0.55, color="none", hatch="xx", edgecolor=colour)
        axes.text(0.03, y, mark.label, transform=axes.get_yaxis_transform(), va="center", fontsize=8.5,
                  bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    else:  # not measured: an empty, hatched row across the column, never a bar at zero
        axes.axhspan(y - 0.3, y + 0.3, facecolor="none", hatch="///", edgecolor="#d8d8d8", linewidth=0)
        head, _, reason = mark.label.partition(": ")
        shown = head + (f"\n({textwrap.fill(reason, 26)})" if reason else "")
        axes.text(0.04, y, shown, transform=axes.get_yaxis_transform(), va="center", fontsize=8,
                  color="#444444", style="italic",
                  bbox={"facecolor": "white", "edgecolor": _MISSING_COLOUR, "linestyle": "--", "pad": 2})


def criteria_row(panels: Sequence[CriterionPanel], *, platforms: Sequence[str], title: str) -> Figure:
    """Figure B.5: one column per criterion, one row per platform, each mark its mean with its min–max
    (whiskers, where 2 or more runs) and n; a platform with nothing measured on a criterion gets a hatched
    empty row saying "not measured" and why. Each column keeps its own scale, from 0."""
    mpl = _matplotlib()
    height = 1.9 + _ROW_IN * len(platforms)
    figure = mpl.Figure(figsize=(DECISION_WIDTH_IN, height), dpi=FIGURE_DPI)
    mpl.FigureCanvasAgg(figure)
    axes_row = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    rows = range(len(platforms))
    for axes, panel in zip(axes_row, panels, strict=True):
        timed = [m for m in panel.marks.values() if m.kind in (MEASURED, BASELINE_MARK)]
        largest = max((max(m.value, m.high or 0.0) for m in timed), default=0.0)
        right = max(largest, panel.reference or 0.0) * 2.0 if timed else 1.0  # room for the labels
        for y, platform in zip(rows, platforms, strict=True):
            colour = FRAMEWORK_COLOURS.get(platform, _OTHER_COLOUR)
            _decision_mark(axes, y, panel.marks[platform], colour, right)
        if panel.reference is not None and timed:
            axes.axvline(panel.reference, color="black", linestyle="--", linewidth=0.8)
        axes.set_xlim(0, right)
        axes.xaxis.set_major_locator(mpl.MaxNLocator(4))
        axes.tick_params(axis="x", labelsize=8)
        if not timed:  # nothing on a scale: no ticks that would read as one
            axes.set_xticks([])
        axes.set_xlabel(textwrap.fill(panel.axis, 34), fontsize=8)
        axes.set_title(f"{panel.title}\n{panel.n_text}", fontsize=9.5)
        axes.grid(axis="x", alpha=0.3)
    axes_row[0].set_yticks(list(rows), [DISPLAY_NAMES.get(p, p) for p in platforms], fontsize=10)
    axes_row[0].set_ylim(len(platforms) - 0.5, -0.5)  # the first platform on top
    figure.suptitle(title, fontsize=12)
    figure.subplots_adjust(left=0.105, right=0.985, wspace=0.1, top=1 - 1.05 / height, bottom=0.75 / height)
    return figure


def save(figure: Figure, stem: Path) -> list[Path]:
    """Write <stem>.png and <stem>.svg at the figure's own size (never cropped to fit: no bbox tight)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix in (".png", ".svg"):
        path = stem.with_name(stem.name + suffix)  # not with_suffix: stems contain dots (figure-5.1)
        tmp = path.with_name(f".{path.name}.tmp")
        figure.savefig(tmp, format=suffix[1:], dpi=FIGURE_DPI)
        tmp.replace(path)
        paths.append(path)
    return paths
