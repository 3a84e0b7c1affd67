"""Partial, empty and CPU stores; profiles; GPU counts beyond the study's."""

import sqlite3
from pathlib import Path

import pytest
from report_helpers import figure_panels, fill_with_study_runs, record, record_failure
from result_factory import made_up_result

from dtlab.cell import Cell
from dtlab.errors import DtlabError
from dtlab.report import EmptyStoreError, build_report, generate_report
from dtlab.report.render import figure_5_1
from dtlab.results import Provenance, ResultStore

DDP, DET, SPARK = "PyTorch DDP", "Determined AI", "Apache Spark"
OFF_CLUSTER = "determined (Core API, off-cluster)"


def test_partial_store_gives_a_partial_report_with_missing_cells(tmp_path, lookup):
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 1, 20, 1), time_total_s=600.0, final_accuracy=0.80)
    record(store, Cell("ddp", 1, 20, 2), time_total_s=610.0, final_accuracy=0.81)
    record(store, Cell("spark", 2, 20, 1), time_total_s=1400.0, final_accuracy=0.82)

    files = generate_report(store, tmp_path / "report")
    look = lookup(build_report(store))
    assert look.rows("5.1", "1 GPU", "20")[0][:5] == ["1 GPU", "20", "2", "605.00", "7.07"]
    assert look.rows("5.1", "2 GPUs", "20")[0][:7] == ["2 GPUs", "20", "0", "—", "—", "498.99", "—"]
    assert look.cell("5.8", (DDP,), "Speedup") == "—", "no 2-GPU DDP run: no speedup, never a made-up one"
    assert look.cell("5.8", (DDP,), "Study speedup") == "1.36×"
    assert look.cell("5.7", (SPARK,), "Overhead vs DDP, 2 GPUs") == "—"
    assert look.rows("5.2", "1 GPU", "20")[0][3] == "—"
    assert (files.out_dir / "figures" / "figure-5.1.png").is_file()
    this, study = figure_panels(figure_5_1(build_report(store)))
    # Figure 5.1 shows overhead against DDP: Spark's 2-GPU run has no DDP run at 2 GPUs to be set against.
    assert this["bars"] == {(DDP, "1 GPU"): 1.0}
    assert sorted(this["missing"]) == ["no DDP run"] + ["no run"] * 4, "each gap is marked, not dropped"
    assert "1.00×" in this["labels"]
    assert len(study["bars"]) == 6 and this["ylim"] == study["ylim"], "one scale for both sides"
    assert "| 1 GPU | 20 | 2 | 605.00 | 7.07 | 677.10 | 0.89× |" in files.markdown.read_text()


def test_store_with_only_failures_reports_them_and_the_study(tmp_path):
    store = ResultStore(tmp_path / "results")
    record_failure(store, Cell("spark", 2, 1, 1, "smoke"))
    report = build_report(store)
    assert report.notes[0].startswith("No successful runs are recorded yet")
    [failures] = [t for t in report.extra_tables if t.number == "B.2"]
    assert [v.text for v in failures.rows[0]][:6] == [
        "spark-g2-e1-s1",
        "smoke",
        "1",
        "node2",
        "137",
        "executor lost",
    ]
    files = generate_report(store, tmp_path / "report")
    # No decision figure (B.5) either: nothing ran to be measured, so it would be "not measured" throughout.
    assert {p.name for p in files.figures} == {"figure-5.1.png", "figure-5.1.svg"}
    this, study = figure_panels(figure_5_1(report))
    assert this["bars"] == {} and "no successful runs yet" in this["labels"]
    assert len(study["bars"]) == 6


@pytest.mark.parametrize("make_dir", [True, False])
def test_empty_store_gives_one_clear_message(tmp_path, make_dir):
    results = tmp_path / "results"
    if make_dir:
        results.mkdir()
    with pytest.raises(
        EmptyStoreError, match=r"no recorded runs in .*results; run `invoke bench.all`"
    ) as raised:
        generate_report(results)
    assert isinstance(raised.value, DtlabError) and raised.value.exit_code == 1
    assert not (results / "report").exists()
    assert results.exists() == make_dir, "reading an empty store creates nothing"


@pytest.fixture
def cpu_lab_store(tmp_path):
    """The lab's smoke profile: CPU workers, 1- and 2-epoch runs, Determined off-cluster."""
    store = ResultStore(tmp_path / "results")
    labels = {
        "ddp": "ddp (torchrun, gloo, CPU)",
        "spark": "spark (TorchDistributor, CPU)",
        "determined": OFF_CLUSTER,
    }
    for framework, label in labels.items():
        for workers in (1, 2):
            for epochs in (1, 2):
                time_s = {"ddp": 10.0, "determined": 12.0, "spark": 30.0}[framework] * epochs / workers
                record(
                    store,
                    Cell(framework, workers, epochs, 1, "smoke"),
                    time_total_s=time_s,
                    final_accuracy=0.6,
                    device="cpu",
                    framework_label=label,
                    inventory="lab",
                )
    return store


def test_cpu_cells_are_labelled_as_cpu_workers_and_by_what_ran(cpu_lab_store, lookup):
    report = build_report(cpu_lab_store)
    look = lookup(report)
    assert look.rows("5.1", "2 workers (CPU)", "1")[0][:4] == ["2 workers (CPU)", "1", "1", "5.00"]
    assert look.rows("5.2", "1 worker (CPU)", "2")[0][:4] == ["1 worker (CPU)", "2", "1", "24.00"]
    assert look.table("5.2").title.startswith(f"Determined AI [{OFF_CLUSTER}]")
    assert (OFF_CLUSTER, "2 workers (CPU)", 2) in report.run_labels
    assert "Study, 2 GPUs" in look.table("5.5").columns and "2 workers (CPU)" in look.table("5.5").columns
    assert "GPUs" not in look.table("5.9").rows[0][1].text
    assert (report.short_epochs, report.long_epochs) == (1, 2)
    assert any("short runs have 1 epochs, the study's 20" in note for note in report.notes)
    assert look.cell("5.4", (DDP, "2 workers (CPU)"), "Ratio long/short") == "1.00"
    assert look.cell("5.8", (SPARK, "2 workers (CPU) vs 1"), "Speedup") == "2.00×"
    assert look.cell("5.9", (DET, "1 worker (CPU)"), "Overhead (%)") == "+20%"
    assert look.cell("B.1", (DDP, "1 worker (CPU)", "1"), "GPU utilisation") == "not recorded"
    environment = dict(report.environment)
    assert "CPU workers per run: 1, 2" in environment["Devices"] and environment["Inventory"] == "lab"


def test_cpu_figure_labels_groups_as_workers(cpu_lab_store, tmp_path):
    files = generate_report(cpu_lab_store, tmp_path / "report")
    svg = (files.out_dir / "figures" / "figure-5.1.svg").read_text()
    assert "workers (CPU)" in svg
    assert "Figure B.1" in files.markdown.read_text()


def test_profiles_never_mix_newest_is_default(cpu_lab_store, tmp_path):
    fill_with_study_runs(cpu_lab_store, profile="study")
    assert build_report(cpu_lab_store).profile == "study"
    smoke = build_report(cpu_lab_store, profile="smoke")
    assert (smoke.profile, smoke.other_profiles, smoke.short_epochs) == ("smoke", ["study"], 1)
    with pytest.raises(
        DtlabError, match="--profile nope has no recorded runs; recorded profiles: smoke, study"
    ):
        build_report(cpu_lab_store, profile="nope")


def test_scaling_generalises_to_any_gpu_counts(tmp_path, lookup):
    store = ResultStore(tmp_path / "results")
    for gpus, time_s in ((1, 800.0), (2, 500.0), (4, 320.0)):
        record(store, Cell("ddp", gpus, 20, 1), time_total_s=time_s, final_accuracy=0.82)
    look = lookup(build_report(store))
    assert look.cell("5.8", (DDP, "2 GPUs vs 1"), "Speedup") == "1.60×"
    assert look.cell("5.8", (DDP, "4 GPUs vs 1"), "Speedup") == "2.50×"
    assert look.cell("5.8", (DDP, "4 GPUs vs 1"), "Efficiency") == "63%"  # 2.5 / 4, half-up
    assert look.cell("5.8", (DDP, "4 GPUs vs 1"), "Study speedup") == "—"
    assert look.cell("5.8", (DDP, "2 GPUs vs 1"), "This/study") == "1.18×"  # 1.60 / 1.36


def test_force_rerun_newest_attempt_is_reported(tmp_path, lookup):
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 1, 20, 1), time_total_s=700.0, final_accuracy=0.8)
    record(store, Cell("ddp", 1, 20, 1), time_total_s=650.0, final_accuracy=0.8)
    assert lookup(build_report(store)).rows("5.1", "1 GPU", "20")[0][2:4] == ["1", "650.00"]


def test_a_newer_run_of_another_profile_does_not_hide_this_profiles_run(tmp_path, lookup):
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 1, 20, 1, "study"), time_total_s=700.0, final_accuracy=0.8)
    record(store, Cell("ddp", 1, 20, 1, "smoke"), time_total_s=5.0, final_accuracy=0.5)
    look = lookup(build_report(store, profile="study"))
    assert look.rows("5.1", "1 GPU", "20")[0][2:4] == ["1", "700.00"]


def test_resumed_runs_are_left_out_of_the_tables_and_named(tmp_path):
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 1, 3, 1), time_total_s=30.0, final_accuracy=0.9)
    resumed = made_up_result("ddp", 1, 3, 2, time_total_s=20.0, final_accuracy=0.7)
    resumed["epoch_metrics"] = resumed["epoch_metrics"][1:]  # resumed after epoch 1's checkpoint
    resumed["resumed_from_epoch"] = 1
    store.record_ok(
        Cell("ddp", 1, 3, 2),
        resumed,
        Provenance(config_hash="0123456789abcdef", git_rev=None, inventory="lab"),
    )
    report = build_report(store)
    [stats] = report.groups.values()
    assert stats.n == 1 and stats.time_mean == 30.0  # the undisturbed seed alone
    assert [epoch for epoch, _ in stats.accuracy_curve] == [1, 2, 3]
    left_out = [note for note in report.notes if note.startswith("Left out of the tables and the figure")]
    assert len(left_out) == 1 and "ddp-g1-e3-s2" in left_out[0]


def test_a_resumed_run_shows_its_whole_cost(tmp_path, lookup):
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 1, 3, 1), time_total_s=30.0, final_accuracy=0.9)  # controller: 34 s
    cell = Cell("ddp", 1, 3, 2)
    logs = tmp_path / "attempt-logs"
    logs.mkdir()
    (logs / "node1.log").write_text(
        "[trainer] ddp (torchrun): world size 1 on cpu, 1024 train / 128 test reviews, 64 steps/epoch, "
        "epochs 1..3\n"
        "[trainer] epoch 1/3: train 9.00s loss 0.6 | val 1.00s loss 0.5 accuracy 0.7000\n"
        "Killed\n")
    record_failure(store, cell, "node1 lost", inventory="lab", log_dir=logs, harness_time_s=15.0)
    record_failure(store, cell, "preflight: node1 down", inventory="lab", harness_time_s=1.0)  # no logs
    resumed = made_up_result("ddp", 1, 3, 2, time_total_s=31.0, final_accuracy=0.7)
    resumed["epoch_metrics"] = resumed["epoch_metrics"][1:]
    resumed["resumed_from_epoch"] = 1
    store.record_ok(
        cell,
        resumed,
        Provenance(config_hash="0123456789abcdef", git_rev=None, inventory="lab", harness_time_s=25.0),
    )
    look = lookup(build_report(store))
    assert look.rows("B.4", "ddp-g1-e3-s2") == [
        ["ddp-g1-e3-s2", "3", "1", "not logged", "31.00", "41.00", "34.00", "+7.00"]]
    # With the log-less attempt's logs found (it never started the trainer), epoch 2 was begun twice.
    (store.root / "runs" / "ddp-g1-e3-s2" / "attempt-2" / "logs" / "node1.log").write_text("ssh: refused\n")
    assert lookup(build_report(store)).cell("B.4", ("ddp-g1-e3-s2",), "Epochs redone") == "1"


def test_failures_say_later_ok_only_for_a_success_after_them(tmp_path):
    store = ResultStore(tmp_path / "results")
    cell = Cell("ddp", 1, 20, 1)

    def fail(reason):
        record_failure(store, cell, reason, inventory="study")

    fail("before the success")  # attempt 1
    record(store, cell, time_total_s=600.0, final_accuracy=0.8)  # attempt 2, ok
    fail("after the success")  # attempt 3
    [failures] = [t for t in build_report(store).extra_tables if t.number == "B.2"]
    later_ok = {row[5].text: row[6].text for row in failures.rows}
    assert later_ok == {"before the success": "yes", "after the success": "no"}


def test_table_5_8_keeps_a_framework_whose_smallest_gpu_count_is_missing(tmp_path, lookup):
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 2, 20, 1), time_total_s=500.0, final_accuracy=0.8)  # no 1-GPU ddp run
    look = lookup(build_report(store))
    assert look.cell("5.8", (DDP,), "Speedup") == "—"
    assert look.cell("5.8", (DDP,), "Study speedup") == "1.36×"


def test_header_lists_cells_whose_last_attempt_failed_and_cells_with_no_run(tmp_path):
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 1, 2, 0, "smoke"), time_total_s=30.0, final_accuracy=0.9, device="cpu")
    spark = Cell("spark", 2, 2, 0, "smoke")
    record(store, spark, time_total_s=90.0, final_accuracy=0.9, device="cpu")
    record_failure(store, spark)
    notes = build_report(store).notes
    assert "Cells whose last attempt failed (Table B.2 says why): spark-g2-e2-s0." in notes
    missing = [note for note in notes if note.startswith("Cells of profile smoke with no successful run yet")]
    assert missing == [
        "Cells of profile smoke with no successful run yet: ddp-g2-e2-s0, "
        "determined-g1-e2-s0, determined-g2-e2-s0, horovod-g1-e2-s0, horovod-g2-e2-s0, ray-g1-e2-s0, "
        "ray-g2-e2-s0, slurm-g1-e2-s0, slurm-g2-e2-s0, spark-g1-e2-s0."
    ]


def test_this_over_study_ratios_compare_the_figures_as_printed():
    from dtlab.report.numbers import ratio

    # +21.4 % prints as +21 %, the study printed +21 %: the same figure, so 1.00×, not 1.02×.
    assert ratio(21.4, 21.0, "overhead_pct").text == "1.00×"
    assert ratio(21.4, 21.0).text == "1.02×"  # without a quantity the raw figures are divided
    assert ratio(None, 21.0, "overhead_pct").missing


def test_whole_run_table_splits_each_platforms_time_and_compares_with_ddp(tmp_path, lookup):
    store = ResultStore(tmp_path / "results")
    runs = (("ddp", 5.0, 40.0), ("spark", 85.0, 120.0), ("ray", 15.0, 60.0), ("slurm", 8.0, 44.0))
    for framework, launch, total in runs:
        result = made_up_result(
            framework, 1, 2, 0, time_total_s=30.0, final_accuracy=0.9, device="cpu"
        )
        t0 = 1_000_000.0
        result["timeline_unix"] = {
            "process_started": t0 + launch,
            "training_started": t0 + launch + 3,
            "first_step_done": t0 + launch + 4,
            "training_ended": t0 + launch + 33,
        }
        result["harness_timeline_unix"] = {
            "submitted": t0,
            "units_started": t0 + 1,
            "units_ended": t0 + total - 1,
            "recorded": t0 + total,
        }
        if framework == "slurm":  # the driver's marks: the job entered Slurm's queue, then left it
            result["harness_timeline_unix"].update(queue_entered=t0 + 1.5, queue_left=t0 + 2.25)
        store.record_ok(
            Cell(framework, 1, 2, 0, "smoke"),
            result,
            Provenance(config_hash="0123456789abcdef", git_rev=None, inventory="lab"),
        )
    record(store, Cell("determined", 1, 2, 0, "smoke"), time_total_s=30.0, final_accuracy=0.9, device="cpu")
    look = lookup(build_report(store))
    table = look.table("B.3")
    # Determined's run has no clock recorded: left out, not made up.
    # Ray and Slurm, beyond the study, follow the study's frameworks under their names, on the same clock;
    # only Slurm's run went through a queue, its own column ("—" for the others).
    assert [row[0].text.split(" [")[0] for row in table.rows] == [DDP, SPARK, "Ray Train", "Slurm"]
    assert table.columns[3:5] == ["submit → trainer process", "of which queued"]
    spark = [value.text for value in table.rows[1]]
    assert spark[3:-1] == ["85.00", "—", "4.00", "29.00", "2.00", "120.00", "3.00×"]
    ray = [value.text for value in table.rows[2]]
    assert ray[3:-1] == ["15.00", "—", "4.00", "29.00", "12.00", "60.00", "1.50×"]
    slurm = [value.text for value in table.rows[3]]
    assert slurm[3:-1] == ["8.00", "0.75", "4.00", "29.00", "3.00", "44.00", "1.10×"]
    # One run each: the end-to-end ratio is shown, but marked, never a finding.
    assert spark[-1] == slurm[-1] == "1 run, no spread (n=1/1)"
    assert table.rows[0][-1].text == "– (baseline)" and table.columns[-1] == "End to end vs DDP, min–max"
    assert [value.text for value in table.rows[0]][-2] == "1.00×"


def test_this_study_ratios_are_left_out_where_the_runs_do_not_compare(tmp_path, lookup):
    store = ResultStore(tmp_path / "results")
    result = made_up_result("ddp", 1, 20, 1, time_total_s=300.0, final_accuracy=0.95, device="cpu")
    result["hyperparameters"].update(dataset="generated", model="generated:bert-tiny")
    store.record_ok(
        Cell("ddp", 1, 20, 1, "smoke"),
        result,
        Provenance(config_hash="0123456789abcdef", git_rev=None, inventory="lab"),
    )
    report = build_report(store)
    look = lookup(report)
    row = look.rows("5.1", "1 worker (CPU)", "20")[0]
    assert row[3] == "300.00" and row[5] == "677.10" and row[6] == "—"  # both figures shown, no ratio
    assert look.cell("5.5", (DDP,), "This/study") == "—"
    [why] = [note for note in report.notes if note.startswith("This/study ratios are left out")]
    assert "on CPU" in why and "generated reviews" in why and "randomly initialised" in why


def test_accuracy_after_other_epoch_counts_gets_no_ratio(tmp_path, lookup):
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 1, 5, 1), time_total_s=170.0, final_accuracy=0.8)  # GPU, IMDB, bert-tiny
    look = lookup(build_report(store))
    assert look.cell("5.5", (DDP,), "This/study") == "—"  # 5 epochs here against the study's 20
    assert look.cell("5.4", (DDP, "1 GPU"), "This/study") == "1.00×"  # per-epoch times still compare


def test_a_stored_run_that_lacks_a_field_is_named_and_left_out_not_a_crash(tmp_path, lookup):
    """An older or damaged row (its result without epoch_metrics) must not stop bench.report."""
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 1, 20, 1), time_total_s=700.0, final_accuracy=0.8)
    record(store, Cell("ddp", 1, 20, 2), time_total_s=720.0, final_accuracy=0.8)
    # The store takes only valid results and is append-only: a damaged row can only come from outside.
    with sqlite3.connect(store.db_path) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(runs)") if row[1] != "id"]
        copied = ", ".join("attempt + 1" if c == "attempt" else
                           "json_remove(result_json, '$.epoch_metrics')" if c == "result_json" else c
                           for c in columns)
        conn.execute(f"INSERT INTO runs ({', '.join(columns)}) SELECT {copied} FROM runs WHERE seed = 2")
    report = build_report(store)
    [note] = [note for note in report.notes if note.startswith("Unreadable recorded run(s)")]
    assert "ddp-g1-e20-s2 attempt 2" in note and "epoch_metrics" in note, note
    # Seed 2's newest readable attempt stands in the tables, beside seed 1.
    assert lookup(report).rows("5.1", "1 GPU", "20")[0][2:4] == ["2", "710.00"]
    # The console names it too, one line, and bench.report does not exit 0 as if nothing were missing.
    import subprocess
    import sys

    from dtlab.paths import REPO_ROOT

    answer = subprocess.run([str(Path(sys.executable).parent / "invoke"), "bench.report", "--results-dir",
                             str(store.root), "--out", str(tmp_path / "report")], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert answer.returncode == 2, answer.stdout + answer.stderr
    left_out = [line for line in answer.stderr.splitlines() if line.startswith("bench.report: left out")]
    assert len(left_out) == 1 and "ddp-g1-e20-s2 attempt 2" in left_out[0] and "epoch_metrics" in left_out[0]
    assert "report: " in answer.stdout and (tmp_path / "report" / "report.md").is_file()


def test_runs_of_another_setup_never_share_a_mean_with_their_groups_newest(tmp_path, lookup):
    # A profile whose trainer options changed mid-matrix: seeds 1 and 2 were rerun with DDP's static graph,
    # seed 3 was not. The group's mean is the newest setup's alone, and the note names the run left out.
    store = ResultStore(tmp_path / "results")
    for seed in (1, 2, 3):
        record(store, Cell("ddp", 2, 20, seed), time_total_s=500.0, final_accuracy=0.80,
               framework_label="ddp (torchrun)")
    for seed in (1, 2):
        record(store, Cell("ddp", 2, 20, seed), time_total_s=400.0, final_accuracy=0.81,
               framework_label="ddp (torchrun) + DDP static graph")
    report = build_report(store)
    look = lookup(report)
    assert look.rows("5.1", "2 GPUs", "20")[0][2:5] == ["2", "400.00", "0.00"]
    [note] = [n for n in report.notes if n.startswith("Left out of every table: runs recorded with another")]
    assert note.endswith(": ddp-g2-e20-s3 (ddp (torchrun)).")
    assert [label for label, _, _ in report.run_labels] == ["ddp (torchrun) + DDP static graph"]
    # Without the rerun, the three runs of one setup make the mean, and nothing is left out.
    again = ResultStore(tmp_path / "again")
    for seed in (1, 2, 3):
        record(again, Cell("ddp", 2, 20, seed), time_total_s=500.0, final_accuracy=0.80,
               framework_label="ddp (torchrun)")
    assert lookup(build_report(again)).rows("5.1", "2 GPUs", "20")[0][2:4] == ["3", "500.00"]
    assert not [n for n in build_report(again).notes if "another setup" in n]
