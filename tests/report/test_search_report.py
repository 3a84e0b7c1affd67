"""Table B.16: scenario C's search, each way beside the plain sweep over the same seeds (#54)."""

from report_helpers import record_with_clock
from result_factory import made_up_search

from dtlab.cell import Cell, config_hash
from dtlab.report import build_report, generate_report
from dtlab.results import Provenance, ResultStore

PLAN = {"trials": [{"learning_rate": 0.001}, {"learning_rate": 0.0001}], "budget_epochs": 2,
        "grace_epochs": 1, "reduction_factor": 2, "early_stopping": "asha"}
TUNE = "ray-tune (Ray Tune, ASHAScheduler)"
STAND_IN = "determined searcher stand-in: dtlab's ASHA sweep under torchrun (no master)"


def record_search(store, framework, stopping, seed, wall_s, best=1, label=None):
    cell = Cell(framework, 2, 2, seed, "tune", {"max_length": 64}, task=f"search-{stopping}",
                task_plan={**PLAN, "early_stopping": stopping})
    result = made_up_search(cell, wall_s, best, **({"label": label} if label else {}))
    store.record_ok(cell, result, Provenance(config_hash=config_hash(cell), git_rev=None, inventory="lab"))


def test_each_way_stands_beside_the_plain_sweep_with_its_spread_and_the_best_trial_per_seed(tmp_path):
    store = ResultStore(tmp_path / "results")
    record_with_clock(store, Cell("ddp", 2, 2, 0, "smoke"), time_s=60.0, startup_s=5.0)  # training: not B.16
    for seed in (1, 2, 3):
        record_search(store, "ddp", "none", seed, 100.0 + seed)
        record_search(store, "ddp", "asha", seed, 70.0 + seed)
        record_search(store, "ray", "asha", seed, 99.0 + 3 * seed, best=0 if seed == 3 else 1, label=TUNE)
        record_search(store, "determined", "asha", seed, 71.0 + seed, label=STAND_IN)
    report = build_report(store, profile="smoke")
    [b16] = [table for table in report.extra_tables if table.number == "B.16"]
    rows = {(row[0].text, row[2].text): row for row in b16.rows}
    plain, asha = rows[("sweep (torchrun, one trial at a time)", "none")], rows[
        ("sweep (torchrun, one trial at a time)", "asha")]
    assert list(rows)[0] == ("sweep (torchrun, one trial at a time)", "none")  # the baseline first
    assert plain[3].text == "3" and plain[5].text == "1 (baseline)"
    # 72/102 = 0.71; 71/103 .. 73/101 does not reach 1: a difference the runs support.
    assert asha[5].text == "0.71×" and "within noise" not in asha[6].text and "n=3/3" in asha[6].text
    ray_row = rows[(TUNE, "asha")]
    # 105/102: Ray's runs (102..108) overlap the sweep's (101..103): not a difference the runs support.
    assert "within noise" in ray_row[6].text
    assert ray_row[9].text == "s1: 2 =, s2: 2 =, s3: 1 ≠ 2"
    assert plain[9].text == "s1: 2, s2: 2, s3: 2" and plain[10].text == "6 / 6 / 0"
    assert plain[8].text == "0.9000 (0.9000–0.9000)" and plain[11].text == "0.75"
    assert any("Stand-in, not the platform itself: Determined AI" in note for note in b16.notes)
    # Search runs are no training runs: the study's groups hold the one smoke run alone.
    assert {stats.n for stats in report.groups.values()} == {1}
    files = generate_report(store, tmp_path / "report", profile="smoke")
    assert "Scenario C: one hyperparameter search" in files.markdown.read_text()


def test_scenario_cs_verdict_reads_the_search_first(tmp_path):
    """The verdict's scenario C line (experiments/scenarios.yml) judges first on Table B.16's search: each
    searching platform's plan with ASHA, start to end, over its seeds."""
    store = ResultStore(tmp_path / "results")
    for seed in (1, 2, 3):
        record_search(store, "ddp", "asha", seed, 70.0 + seed)
        record_search(store, "ray", "asha", seed, 99.0 + 3 * seed, label=TUNE)
    report = build_report(store)
    search = report.comparison.measures["search"]
    assert search["ray"].values == (102.0, 105.0, 108.0) and "n=3" in search["ray"].shown
    assert not search["spark"].measured and search["spark"].shown == "no search run"
    [answer] = [answer for who, answer in report.verdict.lines if who.startswith("Scenario C")]
    assert answer.startswith("favours PyTorch DDP: a search with ASHA: 72.0 s a search (n=3) against Ray "
                             "Train's 105.0 s a search (n=3)"), answer


def test_a_verdict_resting_on_determineds_search_stand_in_says_so(tmp_path):
    store = ResultStore(tmp_path / "results")
    for seed in (1, 2, 3):
        record_search(store, "determined", "asha", seed, 60.0 + seed, label=STAND_IN)
        record_search(store, "ray", "asha", seed, 99.0 + 3 * seed, label=TUNE)
    [answer] = [answer for who, answer in build_report(store).verdict.lines if who.startswith("Scenario C")]
    assert answer.startswith("favours Determined AI") and f'"{STAND_IN}", not the platform itself' in answer
