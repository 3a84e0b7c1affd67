"""The strategies axis in the report: the study's tables keep strategy ddp's runs alone, exactly as before;
Table B.12 sets every strategy beside ddp on the same platform and world size, and appears only when a
strategy other than ddp is recorded. Real stores, real files."""

from pathlib import Path

import pytest
from result_factory import made_up_result

from dtlab.cell import Cell
from dtlab.report import generate_report
from dtlab.report.aggregate import Sample, group
from dtlab.report.build import build_report
from dtlab.results import Provenance, ResultStore

SEEDS = (1, 2, 3)
# (strategy, framework) -> per seed: (whole-run time s, steady step time s, peak RSS MB, final accuracy)
RUNS = {
    ("ddp", "ddp"): [(40.0, 0.100, 1000.0, 0.80), (41.0, 0.102, 1010.0, 0.81), (42.0, 0.104, 1020.0, 0.82)],
    ("ddp", "ray"): [(50.0, 0.110, 1100.0, 0.80), (51.0, 0.112, 1110.0, 0.81), (52.0, 0.114, 1120.0, 0.82)],
    ("zero1", "ddp"): [(45.0, 0.120, 800.0, 0.80), (46.0, 0.122, 810.0, 0.81), (47.0, 0.124, 820.0, 0.82)],
    ("fsdp", "ray"): [(60.0, 0.150, 600.0, 0.79)],
}


def _record(store: ResultStore, strategy: str, framework: str, seed: int, run: tuple) -> None:
    time_s, step_s, rss_mb, accuracy = run
    cell = Cell(framework, 2, 2, seed, "strategies", {"max_length": 64}, strategy=strategy)
    result = made_up_result(framework, 2, 2, seed, time_total_s=time_s, final_accuracy=accuracy, device="cpu")
    result["hyperparameters"]["strategy"] = strategy
    result["steady_step_time_s"] = step_s
    result["peak_memory_mb"] = {"rss": rss_mb, "rss_per_rank": [rss_mb, rss_mb - 5], "cuda": None}
    store.record_ok(cell, result, Provenance(config_hash=f"{seed:016d}", git_rev=None, inventory="lab",
                                             harness_time_s=time_s + 3))


def _store(path: Path, strategies: set[str]) -> ResultStore:
    store = ResultStore(path)
    for (strategy, framework), runs in RUNS.items():
        if strategy in strategies:
            for seed, run in zip(SEEDS, runs, strict=False):
                _record(store, strategy, framework, seed, run)
    return store


def _texts(tables) -> list[tuple[str, list[str], list[list[str]]]]:
    return [(t.number, t.columns, [[v.text for v in row] for row in t.rows]) for t in tables]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("strategies")
    return _store(root / "ddp-only", {"ddp"}), _store(root / "all", {"ddp", "zero1", "fsdp"})


def test_the_study_tables_show_the_ddp_runs_exactly_as_without_the_other_strategies(stores):
    ddp_only, every = (build_report(store, profile="strategies") for store in stores)
    assert _texts(every.tables) == _texts(ddp_only.tables)
    assert every.groups == ddp_only.groups and {g.strategy for g in every.groups.values()} == {"ddp"}
    beyond = [t.number for t in every.extra_tables if t.number != "B.12"]
    assert beyond == [t.number for t in ddp_only.extra_tables]
    assert "B.12" not in {t.number for t in ddp_only.extra_tables}  # only ddp recorded: no section


def test_no_group_mixes_strategies(stores):
    _, every = stores
    samples = [Sample.from_run(run) for run in every.runs("ok")]
    assert {s.strategy for s in samples} == {"ddp", "zero1", "fsdp"}
    ddp = group(samples)
    assert ddp[("ddp", 2, 2)].n == 3 and ddp[("ddp", 2, 2)].time_mean == pytest.approx(41.0)
    zero1 = group(samples, "zero1")
    assert list(zero1) == [("ddp", 2, 2)] and zero1[("ddp", 2, 2)].time_mean == pytest.approx(46.0)
    assert zero1[("ddp", 2, 2)].strategy == "zero1"


def test_table_b12_sets_each_strategy_beside_ddp_on_the_same_platform(stores, lookup):
    report = build_report(stores[1], profile="strategies")
    find = lookup(report)
    table = find.table("B.12")
    assert [(row[0].text, row[1].text) for row in table.rows] == [
        ("ddp", "PyTorch DDP"), ("ddp", "Ray Train"), ("zero1", "PyTorch DDP"), ("fsdp", "Ray Train")]
    zero1 = dict(zip(table.columns, [v.text for v in table.rows[2]], strict=True))
    assert zero1["Configuration"] == "2 workers (CPU)" and zero1["Runs"] == "3"
    assert zero1["Step time (ms)"] == "122.0" and zero1["Peak memory per worker (MB)"] == "810"
    assert zero1["Final accuracy"] == "0.8100"
    assert zero1["Step time ÷ ddp"] == "1.20×"  # 0.122 / 0.102
    assert zero1["Step time ÷ ddp: min–max (n)"] == "1.15×–1.24× (n=3/3)"  # 0.120/0.104, 0.124/0.100
    assert zero1["Memory ÷ ddp"] == "0.80×"  # 810 / 1010
    fsdp = dict(zip(table.columns, [v.text for v in table.rows[3]], strict=True))
    assert fsdp["Step time ÷ ddp"] == "1.34×"  # 0.150 / 0.112
    assert fsdp["Step time ÷ ddp: min–max (n)"] == "1 run, no spread (n=1/3)"
    ddp_row = dict(zip(table.columns, [v.text for v in table.rows[0]], strict=True))
    assert ddp_row["Step time ÷ ddp"] == "1.00×"


def test_the_strategies_section_renders_in_the_written_report(stores, tmp_path):
    files = generate_report(stores[1], tmp_path / "report", profile="strategies")
    markdown = Path(files.markdown).read_text()
    assert "Parallelism strategies against ddp" in markdown and "fsdp" in markdown
    assert list((tmp_path / "report").rglob("table-b.12-strategies.csv"))
    quiet = generate_report(stores[0], tmp_path / "ddp-report", profile="strategies")
    assert "Parallelism strategies against ddp" not in Path(quiet.markdown).read_text()
