"""`invoke bench.report` as a user runs it."""

import subprocess
import sys
from pathlib import Path

from report_helpers import record

from dtlab.cell import Cell
from dtlab.paths import REPO_ROOT
from dtlab.results import ResultStore

INVOKE = Path(sys.executable).parent / "invoke"


def bench_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(INVOKE), "bench.report", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def test_bench_report_writes_the_report(tmp_path):
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 1, 20, 1), time_total_s=600.0, final_accuracy=0.8)
    done = bench_report("--results-dir", str(store.root), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert f"report: {tmp_path / 'out' / 'report.md'}" in done.stdout
    assert (tmp_path / "out" / "report.html").is_file()
    assert (tmp_path / "out" / "figures" / "figure-5.1.png").is_file()
    # Everything the report writes is readable alike (report.md and the CSVs were once 0600, figures 0644).
    written = [path for path in (tmp_path / "out").rglob("*") if path.is_file()]
    assert {path.suffix for path in written} >= {".md", ".html", ".csv", ".png"}
    assert {path.name: path.stat().st_mode & 0o777 for path in written} == dict.fromkeys(
        (path.name for path in written), 0o644)


def test_bench_report_on_an_empty_store_says_so_in_one_line_and_fails(tmp_path):
    done = bench_report("--results-dir", str(tmp_path / "none"))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"error: bench.report: no recorded runs in {tmp_path / 'none'}; "
        "run `invoke bench.all` (or bench.run) first, then `invoke bench.report`"
    ]
    assert not (tmp_path / "none").exists(), "nothing is written for an empty store"


def test_bench_report_unknown_profile_is_one_error_line_exit_2(tmp_path):
    store = ResultStore(tmp_path / "results")
    record(store, Cell("ddp", 1, 20, 1), time_total_s=600.0, final_accuracy=0.8)
    done = bench_report("--results-dir", str(store.root), "--profile", "nope")
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "error: bench.report: --profile nope has no recorded runs; recorded profiles: custom"
    )


def test_bench_report_study_renders_the_published_runs(tmp_path):
    done = bench_report("--study", "--out", str(tmp_path / "study"))
    assert done.returncode == 0, done.stderr
    markdown = (tmp_path / "study" / "report.md").read_text()
    assert markdown.startswith("# dtlab report: the study's published runs")
    assert "| PyTorch DDP | 2 GPUs vs 1 | 1.36× | 1.36× | 1.00× | 68% | 68% | 1.00× |" in markdown
    refused = bench_report("--study", "--profile", "smoke")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: bench.report: --study reads only the study's published runs; "
        "leave out --inventory, --results-dir and --profile")
