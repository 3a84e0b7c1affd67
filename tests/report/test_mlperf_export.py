"""Runs in MLPerf's log format (mllog), exported for MLPerf's own tools: mlperf-logging's compliance checker
and its result summarizer's score agree with the report's scored-time table (Table B.7)."""

import json
import os
import subprocess
import sys

import pytest
from mlperf_logging.result_summarizer import result_summarizer
from report_helpers import record
from result_factory import made_up_result

from dtlab import matrix, paths
from dtlab.cell import Cell
from dtlab.errors import DtlabError
from dtlab.report import build_report
from dtlab.report.aggregate import score
from dtlab.report.mlperf_export import export_mlperf
from dtlab.results import Provenance, ResultStore, mlperf_log

DDP = "PyTorch DDP"
TARGET = 0.75
TIMES = [60.0, 61.5, 63.0, 64.5, 70.0]  # one cell's five seeds, distinct so the trim is seen
INVOKE = str(paths.REPO_ROOT / ".venv/bin/invoke")


@pytest.fixture
def profile_with_target(tmp_path, monkeypatch):
    matrix_file = tmp_path / "matrix.yml"
    matrix_file.write_text(
        f"profiles:\n  study:\n    target_accuracy: {TARGET}\n"
        "    runs:\n      - {frameworks: [ddp], gpus: [2], epochs: [20], seeds: [1, 2, 3, 4, 5]}\n"
    )
    monkeypatch.setattr(matrix, "MATRIX_FILE", matrix_file)


def store_with_misses(tmp_path, missed: int) -> ResultStore:
    """Five runs of ddp-g2-e20; the last `missed` of them end under the target."""
    store = ResultStore(tmp_path / "results")
    for seed, span in enumerate(TIMES, start=1):
        accuracy = 0.70 if seed > len(TIMES) - missed else 0.80
        record(store, Cell("ddp", 2, 20, seed, "study"), time_total_s=span, final_accuracy=accuracy)
    return store


def compliance(export, result_file) -> subprocess.CompletedProcess:
    """mlperf-logging's compliance checker, as a submitter runs it, with the export's ruleset."""
    return subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", mlperf_log.USAGE,
         "--ruleset", mlperf_log.RULESET, "--config", str(export.ruleset_file),
         "--log_output", str(export.root / "checker.log"), str(result_file)],
        capture_output=True, text=True, timeout=120, cwd=export.root,
    )


@pytest.mark.parametrize("missed", [0, 1, 2])
def test_mlperfs_checker_and_score_agree_with_table_b7(tmp_path, lookup, profile_with_target, missed):
    store = store_with_misses(tmp_path, missed)
    exported = export_mlperf(store, "ddp-g2-e20", tmp_path / "mlperf")
    assert [path.name for path in exported.results] == [f"result_{n}.txt" for n in range(5)]
    assert exported.missed_target == missed
    # The checker: every run follows MLPerf's training rules; those under the target, and only they, fail.
    verdicts = [compliance(exported, path) for path in exported.results]
    failed = [n for n, answer in enumerate(verdicts) if answer.returncode != 0]
    assert failed == list(range(5 - missed, 5)), [v.stdout + v.stderr for v in verdicts]
    assert all("SUCCESS" in v.stdout + v.stderr for v in verdicts[: 5 - missed])
    # MLPerf's score (olympic average over the compliant runs, in minutes) against Table B.7's.
    mlperf_score, _power, _scaling = result_summarizer._compute_strong_score_standalone(
        mlperf_log.BENCHMARK, exported.system, False, str(exported.benchmark_dir), exported.usage,
        mlperf_log.RULESET)
    b7 = lookup(build_report(store)).cell("B.7", (DDP, "2 GPUs"), "Score (s)")
    ours = score(TIMES, [0.80] * (5 - missed) + [0.70] * missed, TARGET)
    if missed < 2:
        assert not ours.invalid and mlperf_score is not None
        assert mlperf_score * 60 == pytest.approx(ours.value, abs=1e-3)
        assert b7 == f"{mlperf_score * 60:.2f}"
    else:
        assert ours.invalid and mlperf_score is None, "two runs under the target: no score on either side"
        assert b7.startswith("invalid")


def test_the_summarizer_reads_the_export_as_a_submission(tmp_path, profile_with_target):
    exported = export_mlperf(store_with_misses(tmp_path, 0), "ddp-g2-e20", tmp_path / "mlperf")
    description = json.loads(exported.system_file.read_text())
    assert (description["system_name"], description["division"]) == (exported.system, "open")
    assert (description["number_of_nodes"], description["accelerators_per_node"]) == (2, 1)
    strong, *_ = result_summarizer.summarize_results(str(exported.root), mlperf_log.USAGE, mlperf_log.RULESET)
    assert list(strong["system"]) == [exported.system] and list(strong["submitter"]) == ["dtlab"]


def test_the_store_writes_each_ok_runs_mlperf_log_beside_its_result(tmp_path):
    store = ResultStore(tmp_path / "results")
    cell = Cell("ddp", 2, 3, 4, "study")
    result = made_up_result("ddp", 2, 3, 4, time_total_s=90.0, final_accuracy=0.7)
    result["timeline_unix"] = {"process_started": 1_000.0, "core_entered": 1_002.0,
                               "training_started": 1_010.0, "first_step_done": 1_011.0,
                               "training_ended": 1_100.0}
    run = store.record_ok(cell, result, Provenance("0123456789abcdef", None, "lab", target_accuracy=0.75))
    lines = [json.loads(line.removeprefix(":::MLLOG "))
             for line in (run.run_dir / mlperf_log.FILENAME).read_text().splitlines()]
    events = {line["key"]: line for line in lines}
    assert (run.run_dir / "result.json").is_file()
    assert events["init_start"]["time_ms"] == 1_000_000 and events["run_start"]["time_ms"] == 1_010_000
    assert events["run_stop"]["time_ms"] == 1_100_000, "run_start + time_total_s"
    assert events["run_stop"]["metadata"]["status"] == "aborted", "0.7 is under the target 0.75"
    assert events["target_accuracy"]["value"] == 0.75 and events["seed"]["value"] == 4
    assert events["global_batch_size"]["value"] == 64, "32 per worker x 2"
    assert events["submission_platform"]["value"] == "lab-ddp-g2-e3"
    accuracies = [(line["metadata"]["epoch_num"], line["value"])
                  for line in lines if line["key"] == "eval_accuracy"]
    assert [epoch for epoch, _ in accuracies] == [1, 2, 3] and accuracies[-1][1] == pytest.approx(0.7)
    # MLPerf's own rules (no target of dtlab's) accept the stored log as it is.
    checked = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage",
                              "training", "--ruleset", mlperf_log.RULESET,
                              str(run.run_dir / mlperf_log.FILENAME)],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_bad_input_is_one_line_before_anything_is_written(tmp_path, profile_with_target):
    store = store_with_misses(tmp_path, 0)
    out = tmp_path / "mlperf"
    with pytest.raises(DtlabError, match=r"no results store at .*nowhere"):
        export_mlperf(ResultStore(tmp_path / "nowhere"), "ddp-g2-e20", out)
    with pytest.raises(DtlabError, match=r"no undisturbed ok run of cell ddp-g4-e20 .* cells: ddp-g2-e20 "):
        export_mlperf(store, "ddp-g4-e20", out)
    with pytest.raises(DtlabError, match=r"--profile spread has no recorded runs"):
        export_mlperf(store, "ddp-g2-e20", out, profile="spread")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(DtlabError, match=r"cannot be written .*a-file is not a folder"):
        export_mlperf(store, "ddp-g2-e20", blocker / "mlperf")
    assert not out.exists(), "nothing written"
    export_mlperf(store, "ddp-g2-e20", out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(DtlabError, match=r"already holds an export \(results, systems, compliance\)"):
        export_mlperf(store, "ddp-g2-e20", out)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_the_command_says_one_line_for_a_folder_it_cannot_write(tmp_path):
    """invoke bench.export into a read-only mount (root ignores file modes): one line, exit 2, nothing
    written; and into a writable folder, the export."""
    store = store_with_misses(tmp_path, 0)
    read_only = tmp_path / "ro"
    read_only.mkdir()
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"', str(read_only),
               INVOKE, "bench.export", "ddp-g2-e20", "--mlperf", str(read_only / "out"),
               "--results-dir", str(store.root)]
    answer = subprocess.run(command, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "DTLAB_RESULTS_DIR": str(tmp_path / "r")})
    assert answer.returncode == 2, answer.stdout + answer.stderr
    assert answer.stderr.strip().splitlines() == [
        f"error: bench.export: --mlperf {read_only / 'out'} cannot be written ({read_only} is not a folder "
        "this user can write); give a folder you can write"]
    assert list(read_only.iterdir()) == []
    done = subprocess.run([INVOKE, "bench.export", "ddp-g2-e20", "--mlperf", str(tmp_path / "out"),
                           "--results-dir", str(store.root)], cwd=paths.REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "5 run(s) of ddp-g2-e20" in done.stdout, done.stdout + done.stderr
