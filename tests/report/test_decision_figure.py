"""Figure B.5, the decision figure right after the verdict (issue #52, item 2): per platform, start-up,
steady overhead, recovery, 2-worker scaling and idle memory side by side, each with its min–max and n; a
criterion with no runs behind it is a "not measured" mark, never a zero."""

from matplotlib.container import BarContainer
from report_helpers import record_with_clock

from dtlab import idle
from dtlab.cell import Cell
from dtlab.paths import IDLE_DIRNAME
from dtlab.report import build_report, build_study_report, generate_report, write_report
from dtlab.report.comparison_measures import comparison_count
from dtlab.report.decision_figure import TITLE, decision_panels
from dtlab.report.render import figure_decision
from dtlab.report.study import DISPLAY_NAMES
from dtlab.results import ResultStore

DDP_1, DDP_2, SPARK_2 = (200.0, 202.0, 198.0), (100.0, 102.0, 98.0), (151.0, 152.0, 153.0)


def idle_probe(second: int, spark_mib: float) -> idle.IdleMeasure:
    """One cluster.idle probe in which Spark's master runs, using `spark_mib`; Ray is not installed."""
    return idle.IdleMeasure("lab", f"2026-11-25T10:00:0{second}+00:00", 10.0, [
        idle.UnitIdle("node0", "dtlab-spark-master.service", "spark_master_service", "spark", "active",
                      int(spark_mib * 2**20), 1.0, running=("dtlab-spark-master.service",)),
    ])


def decision_store(tmp_path) -> ResultStore:
    """DDP 3 runs at 1 and at 2 workers; Spark 3 at 2 workers only; Ray one at 2 workers; Determined, Slurm
    and Horovod none; no fault run; two idle probes with Spark's master running."""
    store = ResultStore(tmp_path / "results")
    for seed, (one, two, spark) in enumerate(zip(DDP_1, DDP_2, SPARK_2, strict=True), start=1):
        record_with_clock(store, Cell("ddp", 1, 2, seed, "spread"), time_s=one, startup_s=9.0 + seed)
        record_with_clock(store, Cell("ddp", 2, 2, seed, "spread"), time_s=two, startup_s=9.0 + seed)
        record_with_clock(store, Cell("spark", 2, 2, seed, "spread"), time_s=spark, startup_s=40.0 + seed)
    record_with_clock(store, Cell("ray", 2, 2, 1, "spread"), time_s=120.0, startup_s=28.0)
    for second, mib in enumerate((300.0, 320.0)):
        idle.record_idle(idle_probe(second, mib), store.root / IDLE_DIRNAME)
    return store


def panels_of(report) -> dict[str, object]:
    count = comparison_count(report.groups, report.short_epochs)
    found = decision_panels(report.comparison, report.groups, report.short_epochs, count)
    return {panel.title.split("\n")[0]: panel for panel in found}


def test_each_criterion_has_its_mean_min_max_and_n(tmp_path):
    panels = panels_of(build_report(decision_store(tmp_path)))
    assert list(panels) == ["Start-up", "Steady overhead", "Recovery from a fault", "2-worker scaling",
                            "Idle footprint"]
    # Start-up: Table B.10's measure (submit -> first step), mean and min–max over DDP's 3 runs at 2 workers.
    startup = panels["Start-up"].marks
    assert (startup["ddp"].value, startup["ddp"].low, startup["ddp"].high) == (11.0, 10.0, 12.0)
    assert startup["ddp"].label == "11.00 s (n=3)\n10.00–12.00 s"
    assert startup["ray"].label == "28.00 s (n=1)" and startup["ray"].low is None  # one run: no spread
    assert panels["Start-up"].n_text == "n = 1 to 3 runs"
    # Steady overhead: per-epoch time over DDP's; its interval over the runs (Spark's slowest over DDP's
    # fastest, ...), each side's n.
    overhead = panels["Steady overhead"].marks
    assert overhead["spark"].value == 152.0 / 100.0 and overhead["spark"].n == "3/3"
    assert (overhead["spark"].low, overhead["spark"].high) == (151.0 / 102.0, 153.0 / 98.0)
    assert overhead["ray"].n == "1/3" and overhead["ray"].low is None
    assert overhead["ddp"].kind == "baseline" and overhead["ddp"].value == 1.0
    # Scaling: Table 5.8's speedup T(1)/T(2), with its min-max over both counts' runs.
    scaling = panels["2-worker scaling"].marks
    assert scaling["ddp"].value == 2.0 and scaling["ddp"].n == "3/3"
    assert (scaling["ddp"].low, scaling["ddp"].high) == (198.0 / 102.0, 202.0 / 98.0)
    assert panels["2-worker scaling"].n_text == "n = 3/3 runs each (1/2 workers)"
    # Idle: the two probes of Spark's services.
    spark_idle = panels["Idle footprint"].marks["spark"]
    assert (spark_idle.value, spark_idle.low, spark_idle.high, spark_idle.n) == (310.0, 300.0, 320.0, "2")
    assert panels["Idle footprint"].n_text == "n = 2 probes each"


def test_what_was_not_measured_is_marked_never_zero(tmp_path):
    panels = panels_of(build_report(decision_store(tmp_path)))
    recovery = panels["Recovery from a fault"]
    assert {p: m.label for p, m in recovery.marks.items()} == dict.fromkeys(DISPLAY_NAMES,
                                                                            "not measured: no fault run")
    assert all(m.value is None for m in recovery.marks.values())
    assert recovery.n_text == "n = 0 fault runs"
    scaling = panels["2-worker scaling"].marks
    assert scaling["spark"].label == "not measured: no 1-worker run" and scaling["spark"].value is None
    assert scaling["slurm"].label == "not measured: no 1-worker or 2-worker run"
    assert panels["Start-up"].marks["determined"].label == "not measured: no run"
    assert panels["Steady overhead"].marks["horovod"].label == "not measured: no run"
    idle_marks = panels["Idle footprint"].marks
    assert idle_marks["ray"].label == "not measured: none running"  # probed, nothing of Ray's runs
    # DDP has no daemon of its own: an exact 0 from the repository, drawn as a tick, not a measured bar.
    assert idle_marks["ddp"].kind == "exact" and idle_marks["ddp"].label == "0 MiB: no daemon of its own"


def test_the_drawn_figure_marks_every_gap_and_says_n(tmp_path):
    report = build_report(decision_store(tmp_path))
    figure = figure_decision(report)
    assert figure.get_suptitle() == TITLE
    titles = [axes.get_title() for axes in figure.axes]
    assert titles[0].endswith("n = 1 to 3 runs") and titles[2].endswith("n = 0 fault runs")
    texts = {axes.get_title().split("\n")[0]: [t.get_text() for t in axes.texts] for axes in figure.axes}
    # Recovery: six "not measured" marks and no bar at all (a gap never reads as zero).
    recovery = figure.axes[2]
    assert texts["Recovery from a fault"] == ["not measured\n(no fault run)"] * len(DISPLAY_NAMES)
    assert not [c for c in recovery.containers if isinstance(c, BarContainer)]
    # Scaling: DDP's bar alone, with whiskers; the rest say why they have none.
    scaling = figure.axes[3]
    [bars] = [c for c in scaling.containers if isinstance(c, BarContainer)]
    assert [patch.get_width() for patch in bars.patches] == [2.0] and bars.errorbar is not None
    assert texts["2-worker scaling"].count("not measured\n(no 1-worker run)") == 2  # Spark and Ray
    assert "2.00× (n=3/3)\n1.94–2.06×" in texts["2-worker scaling"]
    # Platform names down the side, in the report's order; readable at 1280 px: drawn no wider.
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == list(DISPLAY_NAMES.values())
    assert figure.get_size_inches()[0] * figure.dpi <= 1200


def test_the_figure_follows_the_verdict_in_markdown_and_html(tmp_path):
    files = generate_report(decision_store(tmp_path), tmp_path / "report")
    markdown = files.markdown.read_text()
    figure = markdown.index(f"**{TITLE}** ([SVG](figures/figure-b.5-decision.svg))")
    assert markdown.index("## Verdict") < figure < markdown.index("## About this report")
    assert f"![{TITLE}](figures/figure-b.5-decision.png)" in markdown
    html = files.html.read_text()
    assert html.index('<section id="verdict">') < html.index('<figure id="decision-figure"') \
        < html.index("</section>") < html.index("<table")
    assert (tmp_path / "report" / "figures" / "figure-b.5-decision.png") in files.figures


def test_the_study_report_has_no_decision_figure(tmp_path):
    files = write_report(build_study_report(), tmp_path / "report")
    assert "figure-b.5" not in files.markdown.read_text()
    assert not (tmp_path / "report" / "figures" / "figure-b.5-decision.png").exists()
