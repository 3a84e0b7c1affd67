"""Write a built Report: Markdown, HTML (figure embedded), one CSV per table, PNG and SVG figures."""

from __future__ import annotations

import base64
import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from dtlab.files import atomic_write_text
from dtlab.paths import TEMPLATES_DIR
from dtlab.report import figures
from dtlab.report.build import Report
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


def _markdown_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


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
    """This cluster's short runs beside the study's 20-epoch runs, on one scale (the study alone in a
    --study report, whose runs are the study's own)."""
    pub = published()
    study_runs = {(f, g): (t, None) for (f, g, e), (t, _a) in pub.runs.items() if e == STUDY_SHORT_EPOCHS}
    study = figures.TimePanel(
        title=f"Study: {STUDY_SHORT_EPOCHS} epochs, mean of {STUDY_RUNS_PER_FIGURE[STUDY_SHORT_EPOCHS]} "
              f"seeds\n({STUDY_GPU}; std not published)",
        times=study_runs,
        counts=sorted({g for _f, g in study_runs}),
        count_label=lambda g: config_label(g, pub.device),
        missing_text="not published",
    )
    short = report.short_epochs
    this_runs = {(f, g): (s.time_mean, s.time_std) for (f, g, e), s in report.groups.items() if e == short}
    present = {f for f, _g in this_runs} | {f for f, _g in study_runs}
    frameworks = [f for f in FRAMEWORKS if f in present] + sorted(present - set(FRAMEWORKS))
    if report.from_study:
        return figures.time_bars([study], frameworks=frameworks,
                                 title="Figure 5.1: training time per framework (the study, as published)")
    this = figures.TimePanel(
        title=f"This cluster: {short} epochs\n(mean ± std over seeds)" if short else "This cluster",
        times=this_runs,
        counts=sorted({g for _f, g in this_runs}),
        count_label=report.count_label,
        missing_text="no run",
    )
    return figures.time_bars([this, study], frameworks=frameworks,
                             title="Figure 5.1: training time per framework (one scale)")


def _fault_figures(report: Report) -> list[dict]:
    return [report.faults.figure] if report.faults is not None and report.faults.figure else []


def draw_figures(report: Report, figure_dir: Path) -> list[dict]:
    title = ("Figure 5.1: training time per framework (the study, as published)" if report.from_study
             else "Figure 5.1: training time per framework, this cluster beside the study")
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
    if report.faults is not None:  # shown in its own section, saved with the others
        report.faults.figure = {
            "title": f"Figure B.2: {report.faults.figure_title} (beyond the study)",
            "figure": figures.fault_timelines(report.faults.outcomes, title=report.faults.figure_title),
            "stem": "figure-b.2-fault-recovery",
        }
    for item in [*drawn, *_fault_figures(report)]:
        png, svg = figures.save(item.pop("figure"), figure_dir / item["stem"])
        item["png"], item["svg"] = png, svg
        item["png_base64"] = base64.b64encode(png.read_bytes()).decode("ascii")
    return drawn


def write_report(report: Report, out_dir: Path) -> ReportFiles:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out_dir, out_dir / "report.md", out_dir / "report.html")
    report.figures = draw_figures(report, out_dir / "figures")
    for item in [*report.figures, *_fault_figures(report)]:
        files.figures += [item["png"], item["svg"]]
        item["png_rel"] = item["png"].relative_to(out_dir).as_posix()
        item["svg_rel"] = item["svg"].relative_to(out_dir).as_posix()
    tables_dir = out_dir / "tables"
    all_tables = [*report.tables, *report.extra_tables] + ([report.node_table] if report.node_table else [])
    if report.faults is not None:
        all_tables.append(report.faults.table)
    if report.gate is not None and report.gate.table is not None:
        all_tables.append(report.gate.table)
    for table in all_tables:
        path = tables_dir / f"{table.slug}.csv"
        atomic_write_text(path, table_csv(table))
        files.csv.append(path)
        table.csv_rel = path.relative_to(out_dir).as_posix()
    env = _environment()
    context = {"report": report, "csv_files": [p.relative_to(out_dir).as_posix() for p in files.csv]}
    atomic_write_text(files.markdown, env.get_template(MARKDOWN_TEMPLATE).render(**context))
    atomic_write_text(files.html, env.get_template(HTML_TEMPLATE).render(**context))
    return files
