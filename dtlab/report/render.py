"""Write a built Report: Markdown, HTML (figure embedded), one CSV per table, PNG and SVG figures."""

from __future__ import annotations

import base64
import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import markupsafe

from dtlab.files import atomic_write_text
from dtlab.paths import TEMPLATES_DIR
from dtlab.platforms import BASELINE
from dtlab.report import figures
from dtlab.report.aggregate import Derived, Spread, spread, time_to_target
from dtlab.report.build import Report
from dtlab.report.comparison_measures import comparison_count
from dtlab.report.decision_figure import STEM as DECISION_STEM
from dtlab.report.decision_figure import TITLE as DECISION_TITLE
from dtlab.report.decision_figure import decision_panels
from dtlab.report.numbers import fmt
from dtlab.report.study import (
    FRAMEWORKS,
    STUDY_GPU,
    STUDY_RUNS_PER_FIGURE,
    STUDY_SHORT_EPOCHS,
    published,
)
from dtlab.report.tables import Table, config_label

MARKDOWN_TEMPLATE = "report.md.j2"
HTML_TEMPLATE = "report.html.j2"


@dataclass
class ReportFiles:
    out_dir: Path
    markdown: Path
    html: Path
    csv: list[Path] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # the stored runs the report could not read


def _markdown_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _code_html(value: object) -> markupsafe.Markup:
    """Escaped text with each `command` in <code>."""
    parts = str(markupsafe.escape(value)).split("`")
    return markupsafe.Markup("".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts)))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        autoescape=jinja2.select_autoescape(["html.j2"]),
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["md"] = _markdown_cell
    env.filters["code"] = _code_html
    return env


def table_csv(table: Table) -> str:
    """Unrounded numbers (text where a cell is text, empty where missing), for further analysis."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.columns)
    for row in table.rows:
        writer.writerow(["" if value.raw is None else value.raw for value in row])
    return buffer.getvalue()


def figure_5_1(report: Report) -> figures.Figure:
    """Overhead against DDP (whole-run time over DDP's at the same count) per framework: this cluster's
    short runs, with their min-max over runs, beside the study's 20-epoch figures. A ratio compares
    across clusters where seconds do not (other GPUs, CPU workers, other epochs); the seconds stay in
    the tables. The study alone in a --study report, whose runs are the study's own."""
    pub = published()
    study_counts = sorted({g for (_f, g, e) in pub.runs if e == STUDY_SHORT_EPOCHS})
    study_bars = {
        (f, g): figures.Bar(value, None, None, f"{fmt(value, 'overhead_x')}×")
        for (f, g), value in {**{(BASELINE, g): 1.0 for g in study_counts}, **pub.overhead_x}.items()
    }
    study = figures.BarPanel(
        title=f"Study: {STUDY_SHORT_EPOCHS} epochs, mean of {STUDY_RUNS_PER_FIGURE[STUDY_SHORT_EPOCHS]} "
              f"seeds\n({STUDY_GPU}; spread not published)",
        bars=study_bars,
        counts=study_counts,
        count_label=lambda g: config_label(g, pub.device),
        missing_text="not published",
    )
    short = report.short_epochs
    present = {f for f, _g, e in report.groups if e == short} | {f for f, _g in study_bars}
    frameworks = [f for f in FRAMEWORKS if f in present] + sorted(present - set(FRAMEWORKS))
    title = "Figure 5.1: overhead against DDP per framework (whole-run time / DDP's at the same count)"
    if report.from_study:
        return figures.grouped_bars([study], frameworks=frameworks, title=title, ylabel="× DDP's time",
                                    baseline=1.0)
    derived = Derived({key: stats.time_mean for key, stats in report.groups.items()})
    this_counts = sorted({g for _f, g, e in report.groups if e == short})
    bars, reasons = {}, {}
    for framework, gpus, epochs in report.groups:
        if epochs != short:
            continue
        value = derived.overhead_x(framework, gpus, short)
        if value is None:
            reasons[(framework, gpus)] = "no DDP run"
            continue
        found = spread(report.groups, lambda d, f=framework, g=gpus: d.overhead_x(f, g, short),
                       [(framework, gpus, short), (BASELINE, gpus, short)])
        verdict = found.verdict if found is not None and framework != BASELINE else ""
        label = f"{fmt(value, 'overhead_x')}×" + (f" ({verdict})" if verdict else "")
        shown = found is not None and framework != BASELINE and found.fewest > 1  # 1 run: no bar to draw
        low, high = (found.low, found.high) if shown else (None, None)
        bars[(framework, gpus)] = figures.Bar(value, low, high, label)
    this = figures.BarPanel(
        title=f"This cluster: {short} epochs\n(mean, min–max over runs)" if short else "This cluster",
        bars=bars,
        counts=this_counts,
        count_label=report.count_label,
        missing_text="no run",
        missing_reasons=reasons,
    )
    return figures.grouped_bars([this, study], frameworks=frameworks, title=title, ylabel="× DDP's time",
                                baseline=1.0)


def figure_time_to_target(report: Report) -> figures.Figure | None:
    """Seconds from submit to the end of the first epoch at the profile's target, per framework and count
    (the short runs), mean with min-max over the runs that reached it; None without a target."""
    short = report.short_epochs
    if report.target_accuracy is None or report.from_study or short is None:
        return None
    found = time_to_target({k: s for k, s in report.groups.items() if k[2] == short}, report.target_accuracy)
    bars, reasons = {}, {}
    for (framework, gpus, _epochs), runs in found.items():
        times = [run.seconds for run in runs if run.seconds is not None]
        if not times:
            reached = any(run.epoch is not None for run in runs)
            reasons[(framework, gpus)] = "clock not recorded" if reached else "target not reached"
            continue
        verdict = Spread(min(times), max(times), (len(times),), overlap=False).verdict
        mean = sum(times) / len(times)
        label = f"{fmt(mean, 'time_s')} s" + (f" ({verdict})" if verdict else "")
        low, high = (min(times), max(times)) if len(times) > 1 else (None, None)
        bars[(framework, gpus)] = figures.Bar(mean, low, high, label)
    present = {f for f, _g, _e in found}
    panel = figures.BarPanel(
        title=f"This cluster: {short} epochs, target accuracy {fmt(report.target_accuracy, 'accuracy')}\n"
              "(mean, min–max over the runs that reached it)",
        bars=bars,
        counts=sorted({g for _f, g, _e in found}),
        count_label=report.count_label,
        missing_text="no run",
        missing_reasons=reasons,
    )
    return figures.grouped_bars(
        [panel], frameworks=[f for f in FRAMEWORKS if f in present] + sorted(present - set(FRAMEWORKS)),
        title="Figure B.3: time to target accuracy (submit to the end of the first epoch at the target)",
        ylabel="seconds from submit", baseline=None,
    )


def _fault_figures(report: Report) -> list[dict]:
    return [report.faults.figure] if report.faults is not None and report.faults.figure else []


def draw_figures(report: Report, figure_dir: Path) -> list[dict]:
    title = ("Figure 5.1: overhead against DDP per framework (the study, as published)" if report.from_study
             else "Figure 5.1: overhead against DDP per framework, this cluster beside the study")
    drawn = [{"title": title, "figure": figure_5_1(report), "stem": "figure-5.1"}]
    short = report.short_epochs
    curves = {
        (f, g): s.accuracy_curve
        for (f, g, e), s in report.groups.items()
        if e == short and s.accuracy_curve
    }
    if curves:
        figure = figures.accuracy_curves(
            curves,
            count_label=report.count_label,
            title=f"Validation accuracy per epoch ({short}-epoch runs, mean over seeds)",
        )
        drawn.append(
            {
                "title": "Figure B.1: validation accuracy per epoch (beyond the study)",
                "figure": figure,
                "stem": "figure-b.1-accuracy",
            }
        )
    to_target = figure_time_to_target(report)
    if to_target is not None:
        drawn.append({"title": "Figure B.3: time to target accuracy per framework (beyond the study)",
                      "figure": to_target, "stem": "figure-b.3-time-to-target"})
    if report.size_lines:
        drawn.append({
            "title": "Figure B.4: step time and memory per worker as the model grows, per strategy "
                     "(beyond the study)",
            "figure": figures.size_lines(report.size_lines, count_label=report.count_label,
                                         title="Step time and peak memory per worker by model size "
                                               "(mean, min–max over runs)"),
            "stem": "figure-b.4-model-sizes",
        })
    if report.faults is not None:  # shown in its own section, saved with the others
        report.faults.figure = {
            "title": f"Figure B.2: {report.faults.figure_title} (beyond the study)",
            "figure": figures.fault_timelines(report.faults.outcomes, title=report.faults.figure_title),
            "stem": "figure-b.2-fault-recovery",
        }
    for item in [*drawn, *_fault_figures(report)]:
        _saved(item, figure_dir)
    return drawn


def figure_decision(report: Report) -> figures.Figure | None:
    """Figure B.5, right after the verdict: per platform, the measured criteria side by side; None where
    there is no verdict (the study's own report) or no run measured anything (only failures recorded)."""
    if report.verdict is None or report.comparison is None:
        return None
    if not report.comparison.ran and report.faults is None:
        return None
    count = comparison_count(report.groups, report.short_epochs)
    panels = decision_panels(report.comparison, report.groups, report.short_epochs, count)
    return figures.criteria_row(panels, platforms=report.comparison.platforms, title=DECISION_TITLE)


def _saved(item: dict, figure_dir: Path) -> dict:
    png, svg = figures.save(item.pop("figure"), figure_dir / item["stem"])
    item["png"], item["svg"] = png, svg
    item["png_base64"] = base64.b64encode(png.read_bytes()).decode("ascii")
    return item


def write_report(report: Report, out_dir: Path) -> ReportFiles:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out_dir, out_dir / "report.md", out_dir / "report.html",
                        left_out=list(report.left_out))
    report.figures = draw_figures(report, out_dir / "figures")
    decision_figure = figure_decision(report)
    decision = (_saved({"title": DECISION_TITLE, "figure": decision_figure, "stem": DECISION_STEM},
                       out_dir / "figures") if decision_figure is not None else None)
    for item in [*([decision] if decision else []), *report.figures, *_fault_figures(report)]:
        files.figures += [item["png"], item["svg"]]
        item["png_rel"] = item["png"].relative_to(out_dir).as_posix()
        item["svg_rel"] = item["svg"].relative_to(out_dir).as_posix()
    tables_dir = out_dir / "tables"
    all_tables = [*report.tables, *report.extra_tables] + ([report.node_table] if report.node_table else [])
    if report.faults is not None:
        all_tables.append(report.faults.table)
    if report.gate is not None and report.gate.table is not None:
        all_tables.append(report.gate.table)
    if report.disagreements is not None:
        all_tables.append(report.disagreements)
    if report.comparison is not None:
        all_tables += [*report.comparison.study_tables, report.comparison.table]
        if report.comparison.recommendation is not None:
            all_tables.append(report.comparison.recommendation)
    for table in all_tables:
        path = tables_dir / f"{table.slug}.csv"
        atomic_write_text(path, table_csv(table))
        files.csv.append(path)
        table.csv_rel = path.relative_to(out_dir).as_posix()
    env = _environment()
    context = {"report": report, "decision": decision,
               "csv_files": [p.relative_to(out_dir).as_posix() for p in files.csv]}
    atomic_write_text(files.markdown, env.get_template(MARKDOWN_TEMPLATE).render(**context))
    atomic_write_text(files.html, env.get_template(HTML_TEMPLATE).render(**context))
    return files
