"""The "Fault recovery" section: faulted runs beside their undisturbed twins, and nowhere else."""

import subprocess
import sys
from pathlib import Path

import pytest
from result_factory import made_up_result

from dtlab.cell import Cell, config_hash
from dtlab.paths import REPO_ROOT
from dtlab.report import build_report, generate_report
from dtlab.report.faults import compare_metrics
from dtlab.report.render import draw_figures
from dtlab.results import Provenance, ResultStore

TRAINER = {"model": "generated-bert-tiny", "dataset": "generated-reviews", "batch_size_per_worker": 8}
KILL = "kill-after1-node2"
RAY_REASON = "ray job failed: worker on node2 died twice (max_failures=1 used up)"
DISK_REASON = "disk full on node3"


def cell(framework: str, *, fault: str = "", profile: str = "faults", seed: int = 7) -> Cell:
    return Cell(framework, 2, 3, seed, profile, TRAINER, fault)


def result_of(c: Cell, *, submitted: float, recorded: float, accuracy_shift: float = 0.0,
              loss_shift: float = 0.0, resumed_from: int | None = None) -> dict:
    result = made_up_result(c.framework, c.gpus, c.epochs, c.seed, time_total_s=recorded - submitted - 5.0,
                            final_accuracy=0.75, device="cpu", framework_label=f"{c.framework} (CPU)")
    for metrics in result["epoch_metrics"]:
        metrics["train_loss"] = 0.7 - 0.1 * metrics["epoch"]
    last = result["epoch_metrics"][-1]
    last["val_accuracy"] += accuracy_shift
    last["val_loss"] += loss_shift
    result["final_accuracy"] = last["val_accuracy"]
    result["resumed_from_epoch"] = resumed_from
    result["harness_timeline_unix"] = {"submitted": submitted, "recorded": recorded}
    return result


def record_ok(store: ResultStore, c: Cell, result: dict, fault_record: dict | None = None):
    return store.record_ok(
        c,
        result,
        Provenance(
            config_hash=config_hash(c),
            git_rev="deadbeef",
            inventory="lab",
            harness_time_s=result["harness_timeline_unix"]["recorded"]
                           - result["harness_timeline_unix"]["submitted"],
            fault_record=fault_record,
        ),
    )


def record_failed(store: ResultStore, c: Cell, reason: str, fault_record: dict | None = None):
    return store.record_failure(
        c,
        Provenance(
            config_hash=config_hash(c),
            git_rev="deadbeef",
            inventory="lab",
            harness_time_s=12.0,
            fault_record=fault_record,
        ),
        reason=reason,
        node="node2",
        exit_code=137,
        log_tail=["Killed"],
    )


def fault_record(c: Cell, *, started: float, total_s: float | None, outcome: str | None, recovered_by: str,
                 detected_by: str = "the unit watch (trainer unit failed)", attempts: int = 2,
                 fired: bool = True) -> dict:
    """What dtlab.faults records; a record without `outcome` is an attempt that did not end the run."""
    record = {"spec": c.fault, "kind": "kill", "node": "node2", "after_epoch": 1, "seconds": None,
              "run_started_unix": started}
    if outcome is None:
        return record
    recovered = outcome == "recovered"
    return record | {
        "injected_unix": started + 12.0 if fired else None, "injected_in_attempt": 1 if fired else None,
        "checkpointed_epoch": 1 if fired else None,
        "injection": "kill -9 of 1 trainer process (PID 1234) on node2", "recovered_by": recovered_by,
        "detected_s": 1.5 if fired else None, "detected_by": detected_by,
        "training_again_s": 6.25 if fired and recovered else None,
        "epochs_redone": 0 if fired and recovered else None,
        "total_s": total_s, "attempts": attempts, "outcome": outcome,
        "final_world_size": c.gpus if fired and recovered else None,
    }


@pytest.fixture
def fault_store(tmp_path) -> ResultStore:
    """Undisturbed twins (profile "twins") and faulted runs (profile "faults", recorded after them):
    ddp recovers with identical metrics, spark with other ones, ray does not recover, determined recovers
    with no twin of its config hash recorded; one ordinary failure stays in Table B.2."""
    store = ResultStore(tmp_path / "results")
    for framework, (start, end) in {"ddp": (1000.0, 1030.0), "spark": (1100.0, 1160.0),
                                    "ray": (1200.0, 1240.0)}.items():
        twin = cell(framework, profile="twins")
        record_ok(store, twin, result_of(twin, submitted=start, recorded=end))
    record_failed(store, cell("spark", profile="twins", seed=8), DISK_REASON)
    other_options = cell("determined", profile="twins")  # another config hash: not the faulted run's twin
    store.record_ok(
        other_options,
        result_of(other_options, submitted=900.0, recorded=950.0),
        Provenance(config_hash="another-hash", git_rev="deadbeef", inventory="lab"),
    )

    ddp = cell("ddp", fault=KILL)
    record_failed(store, ddp, "exit -9 on node2", fault_record(ddp, started=2000.0, total_s=None,
                                                               outcome=None, recovered_by=""))
    record_ok(store, ddp, result_of(ddp, submitted=2020.0, recorded=2045.0, resumed_from=1),
              fault_record(ddp, started=2000.0, total_s=45.0, outcome="recovered",
                           recovered_by="dtlab retry from the checkpoint"))

    spark = cell("spark", fault=KILL)
    record_ok(store, spark, result_of(spark, submitted=3000.0, recorded=3090.0, accuracy_shift=-0.0125,
                                      loss_shift=0.00002, resumed_from=1),
              fault_record(spark, started=3000.0, total_s=90.0, outcome="recovered", attempts=1,
                           recovered_by="Spark barrier stage retry", detected_by="Spark (task failed)"))

    ray = cell("ray", fault=KILL)
    ray_record = fault_record(ray, started=4000.0, total_s=50.0, outcome="failed",
                              recovered_by="Ray Train FailureConfig(max_failures=1)")
    record_failed(store, ray, RAY_REASON, ray_record)

    determined = cell("determined", fault=KILL)
    record_ok(store, determined, result_of(determined, submitted=5000.0, recorded=5070.0, resumed_from=1),
              fault_record(determined, started=5000.0, total_s=70.0, outcome="recovered",
                           recovered_by="dtlab retry, standing in for the Determined master's trial restart"))
    return store


def rows_by_cell(table) -> dict[str, dict[str, str]]:
    return {row[1].text: dict(zip(table.columns, (v.text for v in row), strict=True)) for row in table.rows}


def test_each_faulted_cell_is_one_row_beside_its_undisturbed_run(fault_store):
    section = build_report(fault_store).faults
    assert section is not None
    table = section.table
    names = [row[0].text for row in table.rows]
    assert names == ["PyTorch DDP", "Determined AI", "Apache Spark", "Ray Train"], "the report's order"
    rows = rows_by_cell(table)
    assert rows["ddp-g2-e3-s7"] == {
        "Framework": "PyTorch DDP", "Cell": "ddp-g2-e3-s7", "Fault": "kill on node2 after epoch 1",
        "Recovered by": "dtlab retry from the checkpoint", "Attempts": "2", "Detected (s)": "1.50",
        "Detected by": "the unit watch (trainer unit failed)", "Training again (s)": "6.25",
        "Epochs redone": "0", "Total (s)": "45.00", "Undisturbed (s)": "30.00", "Total/undisturbed": "1.50×",
        "Workers at the end": "2 of 2", "Final metrics vs undisturbed": "identical",
    }
    spark = rows["spark-g2-e3-s7"]
    assert [spark[c] for c in ("Total (s)", "Undisturbed (s)", "Total/undisturbed")] == [
        "90.00", "60.00", "1.50×"]
    assert spark["Final metrics vs undisturbed"] == (
        "differs from epoch 3; epoch 3: |Δ val accuracy| 0.0125, |Δ val loss| < 0.0001")
    ray = rows["ray-g2-e3-s7"]
    assert ray["Recovered by"] == f"not recovered: {RAY_REASON}"
    measures = ("Detected (s)", "Detected by", "Training again (s)", "Epochs redone", "Total (s)",
                "Total/undisturbed", "Workers at the end", "Final metrics vs undisturbed")
    assert [ray[c] for c in measures] == ["—"] * 8
    assert ray["Undisturbed (s)"] == "40.00", "the twin's time is shown beside a run that did not recover"
    determined = rows["determined-g2-e3-s7"]
    assert determined["Total (s)"] == "70.00" and determined["Undisturbed (s)"] == "—"
    assert determined["Final metrics vs undisturbed"] == "—" and determined["Total/undisturbed"] == "—"
    assert section.notes == [
        "determined-g2-e3-s7-kill-after1-node2: no undisturbed run of determined-g2-e3-s7 with the same "
        "config hash is recorded; run it (without the fault) for the comparison."
    ]
    assert "epochs checkpointed when the fault hit minus the epoch the finishing run resumed from" in (
        table.notes[0])
    assert section.figure_title == "Fault recovery: a worker killed after epoch 1"


def test_faulted_runs_stay_out_of_the_study_tables_b2_and_b4(fault_store, lookup):
    report = build_report(fault_store)
    assert report.profile == "twins", "the newest undisturbed run's profile, not the faulted runs'"
    look = lookup(report)
    # Only the twins: one run each, their own times; the faulted (resumed) runs would add a second.
    assert look.rows("5.1", "2 workers (CPU)", "3")[0][2:4] == ["1", "25.00"]
    assert look.rows("5.3", "2 workers (CPU)", "3")[0][2:4] == ["1", "55.00"]
    failures = look.table("B.2")
    assert [row[0].text for row in failures.rows] == ["spark-g2-e3-s8"], "the injected failures are not B.2's"
    assert "B.4" not in {t.number for t in report.extra_tables}, "a faulted resumed run is not B.4's"
    assert not [n for n in report.notes if "kill-after" in n]
    workers = "2 workers (CPU)"
    assert report.run_labels == [(f"{f} (CPU)", workers, 1) for f in ("ddp", "determined", "ray", "spark")]
    every_study_cell = {row[0].text for t in report.tables + report.extra_tables for row in t.rows}
    assert not {text for text in every_study_cell if "kill-after" in text}


def test_an_undisturbed_resumed_run_still_goes_to_b4_beside_faulted_ones(fault_store, lookup):
    plain = cell("ddp", profile="twins", seed=9)
    record_failed(fault_store, plain, "exit 1 on node2")
    record_ok(fault_store, plain, result_of(plain, submitted=6000.0, recorded=6040.0, resumed_from=1))
    [row] = lookup(build_report(fault_store)).table("B.4").rows
    assert row[0].text == "ddp-g2-e3-s9"


def test_metrics_compare_every_epoch_exactly():
    twin = cell("ddp", profile="twins")
    same = result_of(twin, submitted=0.0, recorded=30.0)
    assert compare_metrics(same, result_of(twin, submitted=0.0, recorded=40.0)).text == "identical"
    earlier = result_of(twin, submitted=0.0, recorded=30.0)
    earlier["epoch_metrics"][0]["train_loss"] += 1e-9
    assert compare_metrics(earlier, same).text == (
        "differs from epoch 1; epoch 3: |Δ val accuracy| 0.0000, |Δ val loss| 0.0000"), "every epoch counts"
    shifted = result_of(twin, submitted=0.0, recorded=30.0, accuracy_shift=0.25, loss_shift=-0.5)
    value = compare_metrics(shifted, same)
    assert value.text == "differs from epoch 3; epoch 3: |Δ val accuracy| 0.2500, |Δ val loss| 0.5000"
    assert value.raw == 0.5


def test_a_run_still_going_and_a_fault_that_never_fired_say_so(tmp_path):
    store = ResultStore(tmp_path / "results")
    going = cell("ddp", fault=KILL)
    unfinished = fault_record(going, started=1.0, total_s=None, outcome=None, recovered_by="")
    record_failed(store, going, "exit -9 on node2", unfinished)
    quiet = cell("spark", fault="kill-after2")
    record_ok(store, quiet, result_of(quiet, submitted=1.0, recorded=31.0),
              fault_record(quiet, started=1.0, total_s=30.0, outcome="recovered", attempts=1, fired=False,
                           recovered_by="Spark barrier stage retry"))
    rows = rows_by_cell(build_report(store).faults.table)
    assert rows["ddp-g2-e3-s7"]["Recovered by"] == "not finished: attempt 1 failed (exit -9 on node2)"
    assert [o.state for o in build_report(store).faults.outcomes] == ["not finished", "recovered"]
    assert rows["spark-g2-e3-s7"]["Recovered by"] == "not tested: the fault never fired"
    assert rows["spark-g2-e3-s7"]["Detected (s)"] == "—" and rows["spark-g2-e3-s7"]["Total (s)"] == "30.00"


def test_the_section_renders_in_markdown_and_html_with_its_figure(fault_store, tmp_path):
    report = build_report(fault_store)
    figures = draw_figures(report, tmp_path / "drawn")
    assert all(f["stem"] != "figure-b.2-fault-recovery" for f in figures), "drawn in its own section"
    files = generate_report(fault_store, tmp_path / "report")
    assert {p.name for p in files.figures} >= {f"figure-b.2-fault-recovery.{s}" for s in ("png", "svg")}
    assert (tmp_path / "report" / "tables" / "table-b.5-fault-recovery.csv").is_file()
    markdown = files.markdown.read_text()
    section = markdown[markdown.index("## Fault recovery"):markdown.index("## Rounding")]
    assert ("| PyTorch DDP | ddp-g2-e3-s7 | kill on node2 after epoch 1 | dtlab retry from the checkpoint | "
            "2 | 1.50 | the unit watch (trainer unit failed) | 6.25 | 0 | 45.00 | 30.00 | 1.50× | 2 of 2 | "
            "identical |"
            ) in section
    assert f"not recovered: {RAY_REASON}" in section
    assert "![Figure B.2: Fault recovery: a worker killed after epoch 1" in section
    html = files.html.read_text()
    assert '<h2 id="fault-recovery">Fault recovery</h2>' in html
    fault_html = html[html.index('id="fault-recovery"'):html.index("<h2>Rounding</h2>")]
    assert "<td>identical</td>" in fault_html and "data:image/png;base64," in fault_html
    assert "no undisturbed run of determined-g2-e3-s7" in fault_html


def test_the_timeline_has_a_row_per_faulted_run_and_its_moments(fault_store):
    from dtlab.report.figures import fault_timelines

    section = build_report(fault_store).faults
    figure = fault_timelines(section.outcomes, title=section.figure_title)
    [axes] = figure.axes
    assert axes.get_title() == "Fault recovery: a worker killed after epoch 1"
    assert [t.get_text() for t in axes.get_yticklabels()] == [
        "PyTorch DDP\nddp-g2-e3-s7", "Determined AI\ndetermined-g2-e3-s7", "Apache Spark\nspark-g2-e3-s7",
        "Ray Train\nray-g2-e3-s7"]
    widths = sorted(round(p.get_width(), 2) for p in axes.patches)
    assert widths == [30.0, 40.0, 45.0, 50.0, 60.0, 70.0, 90.0], "3 twins and 4 faulted runs, 0 -> total"
    # Fault, detection and training again on each recovered run; no training again on the one that failed.
    ddp_moments = sorted(line.get_xdata()[0] for line in axes.lines if line.get_ydata()[0] == 0.18)
    assert ddp_moments == [12.0, 13.5, 18.25]
    assert len(axes.lines) == 3 * 3 + 2
    assert [t.get_text() for t in figure.legends[0].get_texts()] == [
        "undisturbed run", "faulted run, every attempt", "fault injected", "detected", "training again"]
    assert any(t.get_text() == " not recovered" for t in axes.texts)
    assert any(t.get_text() == " no undisturbed run recorded" for t in axes.texts)


def test_the_decision_figure_draws_recovery_from_the_fault_runs(fault_store):
    from dtlab.report.decision_figure import DID_NOT_RECOVER, MEASURED, MISSING, decision_panels
    from dtlab.report.render import figure_decision

    report = build_report(fault_store)
    figure = figure_decision(report)
    recovery = figure.axes[2]
    assert recovery.get_title() == "Recovery from a fault\ntotal / undisturbed time\nn = 1 fault run each"
    texts = [t.get_text() for t in recovery.texts]
    # DDP 45 s against its 30 s twin, Spark 90 s against 60 s: Table B.5's 1.50x, one fault run each.
    assert texts.count("1.50× (n=1)") == 2
    assert "did not recover (n=1)" in texts  # Ray
    assert "not measured\n(no measured recovery (no\nundisturbed twin, or the\nfault never fired))" in texts
    assert texts.count("not measured\n(no fault run)") == 2  # Slurm and Horovod
    [_, _, panel, _, _] = decision_panels(report.comparison, report.groups, report.short_epochs, 2)
    assert {p: m.kind for p, m in panel.marks.items()} == {
        "ddp": MEASURED, "determined": MISSING, "spark": MEASURED, "ray": DID_NOT_RECOVER,
        "slurm": MISSING, "horovod": MISSING}


def test_a_store_without_faulted_runs_has_no_section(tmp_path):
    store = ResultStore(tmp_path / "results")
    twin = cell("ddp", profile="twins")
    record_ok(store, twin, result_of(twin, submitted=0.0, recorded=30.0))
    assert build_report(store).faults is None
    files = generate_report(store, tmp_path / "report")
    assert "Fault recovery" not in files.markdown.read_text() + files.html.read_text()
    assert not any("fault" in p.name for p in files.figures)


def test_bench_report_writes_the_section(fault_store, tmp_path):
    invoke = Path(sys.executable).parent / "invoke"
    out = tmp_path / "out"
    command = [str(invoke), "bench.report", "--results-dir", str(fault_store.root), "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "## Fault recovery" in (out / "report.md").read_text()
    assert 'id="fault-recovery"' in (out / "report.html").read_text()
    assert (out / "figures" / "figure-b.2-fault-recovery.png").is_file()


def test_an_elastic_recovery_says_the_node_was_lost_and_how_many_workers_finished(tmp_path):
    """recovery: elastic (torchrun's survivors going on): the fault's text and the final world size."""
    store = ResultStore(tmp_path / "results")
    twin = cell("ddp", profile="twins")
    record_ok(store, twin, result_of(twin, submitted=1000.0, recorded=1030.0))
    elastic = cell("ddp", fault="elastic-kill-after1-node2")
    record = fault_record(elastic, started=2000.0, total_s=50.0, outcome="recovered", attempts=1,
                          recovered_by="torchrun's elastic rendezvous",
                          detected_by="the platform (restarted it)")
    result = result_of(elastic, submitted=2000.0, recorded=2050.0, accuracy_shift=-0.01, resumed_from=1)
    result["world_size"] = 1
    record_ok(store, elastic, result, record | {"final_world_size": 1})
    report = build_report(store)
    row = rows_by_cell(report.faults.table)["ddp-g2-e3-s7"]
    assert row["Fault"] == "kill (the node lost; elastic) on node2 after epoch 1"
    assert row["Workers at the end"] == "1 of 2" and row["Recovered by"] == "torchrun's elastic rendezvous"
    # Another setup than the platform's default recovery: the verdict's criteria leave it out.
    measures = report.comparison.measures
    assert measures["unattended"]["ddp"].value is None and measures["recovery"]["ddp"].value is None
