"""`invoke bench.compare A B` (issue #52, item 4): two stores, or two revisions' runs in one, cell by cell; a
regression beyond noise fails the command, and nothing is compared across trainer configs."""

import subprocess
import sys
from pathlib import Path

import pytest
from result_factory import made_up_result

from dtlab.cell import Cell, config_hash
from dtlab.errors import DtlabError
from dtlab.paths import REPO_ROOT
from dtlab.report import build_report
from dtlab.report.compare import compare_runs
from dtlab.results import Provenance, ResultStore

INVOKE = Path(sys.executable).parent / "invoke"
SUBMITTED = 1_000_000.0
TRAINER = {"model": "generated:bert-tiny", "dataset": "generated", "batch_size": 8}
OLD, NEW = "aaaa1111bbbb", "cccc2222dddd"


def record(store: ResultStore, framework: str, seed: int, time_s: float, *, accuracy: float = 0.8,
           startup_s: float = 5.0, rev: str = OLD, trainer: dict | None = None, gpus: int = 2,
           fault: str = "") -> None:
    """One ok 2-epoch CPU run as bench records it: the cell's real config hash, the whole-run clock's marks
    (start-up = submit → first step = startup_s) and a steady step time of 1/100 of the run."""
    cell = Cell(framework, gpus, 2, seed, "p", trainer_config=trainer or TRAINER, fault=fault)
    result = made_up_result(framework, gpus, 2, seed, time_total_s=time_s, final_accuracy=accuracy,
                            device="cpu")
    first_step = SUBMITTED + startup_s
    result["timeline_unix"] = {"process_started": SUBMITTED + 1.0, "training_started": first_step - 0.5,
                               "first_step_done": first_step, "training_ended": first_step + time_s}
    result["harness_timeline_unix"] = {"submitted": SUBMITTED, "recorded": first_step + time_s + 1.0}
    result["steady_step_time_s"] = time_s / 100
    store.record_ok(cell, result, Provenance(config_hash=config_hash(cell), git_rev=rev, inventory="lab"))


def bench_compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(INVOKE), "bench.compare", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)


def marks(compared, group: str) -> dict[str, str]:
    return {change.figure.name: change.mark for change in compared.changes if change.group == group}


@pytest.fixture(scope="module")
def revisions_store(tmp_path_factory) -> ResultStore:
    """One store, two revisions: at NEW, ddp's runs are slower beyond noise and Spark's accuracy lower
    beyond noise; Ray's start-up is faster beyond noise and its time within noise."""
    store = ResultStore(tmp_path_factory.mktemp("compare") / "lab")
    for seed, (old_t, new_t) in enumerate([(10.0, 12.0), (10.5, 12.5), (11.0, 13.0)], start=1):
        record(store, "ddp", seed, old_t, rev=OLD)
        record(store, "ddp", seed, new_t, rev=NEW)
        record(store, "spark", seed, 20.0 + seed, accuracy=0.80 + seed / 100, rev=OLD)
        record(store, "spark", seed, 20.0 + seed, accuracy=0.70 + seed / 100, rev=NEW)
        record(store, "ray", seed, 30.0 + seed, startup_s=20.0 + seed, rev=OLD)
        record(store, "ray", seed, 30.5 + seed, startup_s=10.0 + seed, rev=NEW)
    return store


def test_a_slower_revision_is_a_regression_and_fails_the_command(revisions_store):
    done = bench_compare(str(revisions_store.root), str(revisions_store.root), "--revisions", "aaaa,cccc2222")
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert f"  A: {revisions_store.root}, 9 cells, revision {OLD}" in lines
    assert f"  B: {revisions_store.root}, 9 cells, revision {NEW}" in lines
    # ddp: 10-11 s against 12-13 s, n=3 each: +19.0 % of the means, over the runs +9.1 % to +30.0 %.
    [row] = [line for line in lines if line.strip().startswith("trainer time (s)  10.50")]
    assert row.split()[3:] == ["10.50", "[10.00–11.00]", "n=3", "12.50", "[12.00–13.00]", "n=3", "+19.0", "%",
                               "[+9.1", "%,", "+30.0", "%]", "regression"]
    assert lines[-1].startswith(
        "bench.compare: 9 cell(s) in 3 group(s) compared: 5 regression(s) beyond noise")


def test_each_figure_is_marked_by_the_reports_rule_and_direction(revisions_store):
    compared = compare_runs(str(revisions_store.root), str(revisions_store.root), revisions=f"{OLD},{NEW}")
    assert marks(compared, "ddp-g2-e2") == {
        "trainer time": "regression", "per epoch": "regression", "start-up": "within noise",
        "end to end": "regression", "steady step": "regression", "final accuracy": "within noise"}
    # Lower accuracy is the regression (higher is better), the same time is within noise.
    assert marks(compared, "spark-g2-e2")["final accuracy"] == "regression"
    assert marks(compared, "spark-g2-e2")["trainer time"] == "within noise"
    # Ray: start-up 21-23 s to 11-13 s is an improvement; 31-33 s to 31.5-33.5 s overlaps.
    assert marks(compared, "ray-g2-e2")["start-up"] == "improvement"
    assert marks(compared, "ray-g2-e2")["trainer time"] == "within noise"
    assert [c.group for c in compared.regressions] == ["ddp-g2-e2"] * 4 + ["spark-g2-e2"]
    assert compared.left_out == []


def test_the_figures_are_the_reports_own(revisions_store, tmp_path):
    """The same runs give the same figures as bench.report's groups: A's side against a store of A alone."""
    alone = ResultStore(tmp_path / "old")
    for seed, time_s in enumerate([10.0, 10.5, 11.0], start=1):
        record(alone, "ddp", seed, time_s)
    stats = build_report(alone).groups[("ddp", 2, 2)]
    compared = compare_runs(str(revisions_store.root), str(revisions_store.root), revisions=f"{OLD},{NEW}")
    figures = {c.figure.name: c.a for c in compared.changes if c.group == "ddp-g2-e2"}
    assert figures["trainer time"] == stats.times
    assert figures["end to end"] == stats.end_to_end
    assert figures["final accuracy"] == stats.accuracies
    assert figures["start-up"] == pytest.approx((5.0, 5.0, 5.0))


def test_two_stores_within_noise_and_an_improvement_pass(tmp_path):
    a, b = ResultStore(tmp_path / "a"), ResultStore(tmp_path / "b")
    for seed in (1, 2, 3):
        record(a, "ddp", seed, 10.0 + seed)
        record(b, "ddp", seed, 10.5 + seed)  # 11-13 s against 11.5-13.5 s: overlapping
        record(a, "spark", seed, 20.0 + seed)
        record(b, "spark", seed, 15.0 + seed)  # 21-23 s against 16-18 s: faster beyond noise
    done = bench_compare(str(a.root), str(b.root))
    assert done.returncode == 0, done.stdout + done.stderr
    compared = compare_runs(str(a.root), str(b.root))
    assert set(marks(compared, "ddp-g2-e2").values()) == {"within noise"}
    assert marks(compared, "spark-g2-e2")["trainer time"] == "improvement"
    assert marks(compared, "spark-g2-e2")["final accuracy"] == "within noise"
    assert compared.regressions == []
    assert done.stdout.splitlines()[-1].startswith(
        "bench.compare: 6 cell(s) in 2 group(s) compared: 0 regression(s) beyond noise, 4 improvement(s)")


def test_one_or_two_runs_are_never_a_regression(tmp_path):
    a, b = ResultStore(tmp_path / "a"), ResultStore(tmp_path / "b")
    record(a, "ddp", 1, 10.0)
    record(b, "ddp", 1, 20.0)  # twice as slow, on one run
    for seed in (1, 2):
        record(a, "ray", seed, 10.0 + seed)
        record(b, "ray", seed, 20.0 + seed)
    done = bench_compare(str(a.root), str(b.root))
    assert done.returncode == 0, done.stdout + done.stderr
    [row] = [line for line in done.stdout.splitlines() if line.strip().startswith("trainer time (s)  10.00")]
    assert row.split()[3:] == ["10.00", "n=1", "20.00", "n=1", "+100.0", "%", "1", "run:", "not", "decidable"]
    compared = compare_runs(str(a.root), str(b.root))
    assert set(marks(compared, "ddp-g2-e2").values()) == {"1 run: not decidable"}
    assert set(marks(compared, "ray-g2-e2").values()) == {"2 runs: not decidable"}
    assert "12 not decidable (too few runs)" in done.stdout.splitlines()[-1]


def test_nothing_is_compared_across_config_hashes_and_what_is_left_out_is_named(tmp_path):
    a, b = ResultStore(tmp_path / "a"), ResultStore(tmp_path / "b")
    other = {**TRAINER, "batch_size": 16}
    for seed in (1, 2, 3, 4):
        record(a, "ddp", seed, 10.0)
        # seed 4 ran another trainer config in B, and was 10 times slower: never set against A's
        record(b, "ddp", seed, 100.0 if seed == 4 else 10.0, trainer=other if seed == 4 else None)
    record(a, "ray", 1, 10.0)
    record(b, "spark", 1, 10.0)
    record(a, "ddp", 1, 50.0, fault="kill-after1")
    compared = compare_runs(str(a.root), str(b.root))
    hash_a = config_hash(Cell("ddp", 2, 2, 4, "p", trainer_config=TRAINER))
    hash_b = config_hash(Cell("ddp", 2, 2, 4, "p", trainer_config=other))
    assert hash_a != hash_b
    assert compared.left_out == [
        "ddp-g2-e2-s1-kill-after1 in A: faulted (its time is the fault's; see the report's fault section)",
        f"ddp-g2-e2-s4: config hash differs (A {hash_a}, B {hash_b}): another trainer config, never compared",
        "ray-g2-e2-s1: only in A",
        "spark-g2-e2-s1: only in B",
    ]
    [group] = compared.groups
    assert (group.name, group.seeds) == ("ddp-g2-e2", (1, 2, 3))
    assert compared.regressions == [] and marks(compared, "ddp-g2-e2")["trainer time"] == "within noise"
    lines = compared.lines()
    shown = lines[lines.index("Left out (not compared):") + 2]
    assert shown.startswith("  ddp-g2-e2-s4: config hash differs")


def test_stores_with_no_common_cell_compare_nothing_and_say_so(tmp_path):
    a, b = ResultStore(tmp_path / "a"), ResultStore(tmp_path / "b")
    record(a, "ddp", 1, 10.0)
    record(b, "ddp", 1, 10.0, trainer={**TRAINER, "batch_size": 16})
    compared = compare_runs(str(a.root), str(b.root))
    assert compared.groups == [] and len(compared.left_out) == 1
    assert "Nothing compared: no cell is recorded in both with the same config hash." in compared.lines()


BAD_INPUT = {
    "not a store": (("{plain}", "{root}"), "A '{plain}' is not a results store (no dtlab.sqlite in {plain}); "
                                          "give a results folder such as results/lab, or a cluster's name"),
    "same folder": (("{root}", "{root}"), "A and B are the same results folder ({root}); give two folders, "
                                          "or add --revisions R1,R2 to compare two revisions' runs in it"),
    "unknown revision": (("{root}", "{root}", "--revisions", "aaaa,ffff"),
                         f"revision ffff has no successful run in {{root}}; "
                         f"recorded: {OLD} (9 runs), {NEW} (9 runs)"),
    "one revision": (("{root}", "{root}", "--revisions", "aaaa"),
                     "--revisions 'aaaa': give two revisions separated by a comma, A's then B's, "
                     "e.g. 1a2b3c4d,5e6f7a8b"),
    "same revision": (("{root}", "{root}", "--revisions", f"aaaa,{OLD}"),
                      f"--revisions aaaa,{OLD}: both name revision {OLD} of {{root}}; "
                      "the same runs cannot be compared with themselves"),
    "unknown profile": (("{root}", "{root}", "--revisions", f"{OLD},{NEW}", "--profile", "smoke"),
                        "--profile smoke has no successful run in A ({root} at " + OLD + "); recorded: p"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_one_error_line_and_exit_2(case, tmp_path, revisions_store):
    plain = tmp_path / "plain"
    plain.mkdir()
    args, message = BAD_INPUT[case]
    where = {"plain": plain, "root": revisions_store.root}
    done = bench_compare(*(arg.format(**where) for arg in args))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [f"error: bench.compare: {message.format(**where)}"]


def test_a_missing_profile_is_refused_before_anything_is_printed(revisions_store, tmp_path):
    other = ResultStore(tmp_path / "other")
    record(other, "ddp", 1, 10.0)
    with pytest.raises(DtlabError, match=r"^bench.compare: --profile smoke has no successful run in A "):
        compare_runs(str(revisions_store.root), str(other.root), profile="smoke")
    assert compare_runs(str(revisions_store.root), str(other.root), profile="p").groups
