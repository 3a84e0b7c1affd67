"""Figure 5.1 (grouped bars of whole-run time) and the per-epoch accuracy curves, with matplotlib/Agg."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dtlab.report.study import DISPLAY_NAMES, FRAMEWORKS  # noqa: E402

FIGURE_SIZE_IN = (8.0, 4.5)
FIGURE_DPI = 100  # so a figure is 800 x 450 pixels
FRAMEWORK_COLOURS = {"ddp": "#1f77b4", "determined": "#2ca02c", "spark": "#d62728"}
_OTHER_COLOUR = "#7f7f7f"


def _new_figure() -> Figure:
    figure = Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    FigureCanvasAgg(figure)
    return figure


def time_bars(
    times: Mapping[tuple[str, int], tuple[float, float | None]],
    *,
    count_label: Callable[[int], str],
    title: str,
) -> Figure:
    """Grouped bars: a group per GPU (or worker) count, a bar per framework, std over seeds as error bars."""
    figure = _new_figure()
    axes = figure.add_subplot()
    frameworks = [f for f in FRAMEWORKS if any(k[0] == f for k in times)]
    frameworks += sorted({k[0] for k in times} - set(frameworks))
    counts = sorted({k[1] for k in times})
    width = 0.8 / max(len(frameworks), 1)
    for index, framework in enumerate(frameworks):
        positions, heights, errors = [], [], []
        for group_index, count in enumerate(counts):
            if (framework, count) in times:
                mean, std = times[(framework, count)]
                positions.append(group_index + (index - (len(frameworks) - 1) / 2) * width)
                heights.append(mean)
                errors.append(std or 0.0)
        axes.bar(
            positions,
            heights,
            width * 0.95,
            yerr=errors,
            capsize=4,
            color=FRAMEWORK_COLOURS.get(framework, _OTHER_COLOUR),
            label=DISPLAY_NAMES.get(framework, framework),
            error_kw={"ecolor": "black", "elinewidth": 1},
        )
    axes.set_xticks(range(len(counts)), [count_label(c) for c in counts])
    axes.set_ylabel("Training time (s)")
    axes.set_title(title)
    axes.legend()
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    return figure


def accuracy_curves(
    curves: Mapping[tuple[str, int], tuple[tuple[int, float], ...]],
    *,
    count_label: Callable[[int], str],
    title: str,
) -> Figure:
    """Validation accuracy per epoch (mean over seeds), one line per framework and count."""
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
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("Validation accuracy")
    axes.set_title(title)
    axes.legend(fontsize="small")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def save(figure: Figure, stem: Path) -> list[Path]:
    """Write <stem>.png and <stem>.svg; the size stays exactly FIGURE_SIZE_IN x FIGURE_DPI."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix in (".png", ".svg"):
        path = stem.with_name(stem.name + suffix)  # not with_suffix: stems contain dots (figure-5.1)
        tmp = path.with_name(f".{path.name}.tmp")
        figure.savefig(tmp, format=suffix[1:], dpi=FIGURE_DPI)
        tmp.replace(path)
        paths.append(path)
    return paths
