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


def _record(store: ResultStore, strategy: str, framework: str, seed: int, run: tuple,
            model: str = "") -> None:
    """One ok run; `model`: a run's models: entry ("" trains the profile's, prajjwal1/bert-tiny)."""
    time_s, step_s, rss_mb, accuracy = run
    options = {"max_length": 64} | ({"model": model} if model else {})
    cell = Cell(framework, 2, 2, seed, "strategies", options, strategy=strategy, model=model)
    result = made_up_result(framework, 2, 2, seed, time_total_s=time_s, final_accuracy=accuracy, device="cpu")
    result["hyperparameters"]["strategy"] = strategy
    if model:
        result["hyperparameters"]["model"] = model
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
    assert [(row[0].text, row[2].text) for row in table.rows] == [
        ("ddp", "PyTorch DDP"), ("ddp", "Ray Train"), ("zero1", "PyTorch DDP"), ("fsdp", "Ray Train")]
    zero1 = dict(zip(table.columns, [v.text for v in table.rows[2]], strict=True))
    assert zero1["Configuration"] == "2 workers (CPU)" and zero1["Runs"] == "3"
    assert zero1["Model"] == "bert-tiny"
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


# --- the models axis: Table B.12 per model, Figure B.4 ------------------------------------------------------

# (strategy) -> per seed at generated:bert-mini, a run's models: entry beside the profile's bert-tiny
MINI_RUNS = {
    "ddp": [(80.0, 0.300, 2000.0, 0.85), (81.0, 0.310, 2010.0, 0.86)],
    "zero1": [(90.0, 0.330, 1500.0, 0.85), (91.0, 0.336, 1510.0, 0.86)],
}


@pytest.fixture(scope="module")
def sized_store(tmp_path_factory):
    store = _store(tmp_path_factory.mktemp("sizes") / "store", {"ddp", "zero1"})
    for strategy, runs in MINI_RUNS.items():
        for seed, run in zip(SEEDS, runs, strict=False):
            _record(store, strategy, "ddp", seed, run, model="generated:bert-mini")
    return store


def test_another_models_runs_stay_out_of_the_study_tables_and_are_their_own_b12_groups(stores, sized_store,
                                                                                     lookup):
    without = _store(Path(str(sized_store.root) + "-tiny-only"), {"ddp", "zero1"})
    sized, tiny_only = (build_report(store, profile="strategies") for store in (sized_store, without))
    assert _texts(sized.tables) == _texts(tiny_only.tables) and sized.groups == tiny_only.groups
    table = lookup(sized).table("B.12")
    rows = [dict(zip(table.columns, [v.text for v in row], strict=True)) for row in table.rows]
    assert [(r["Strategy"], r["Model"], r["Platform"]) for r in rows] == [
        ("ddp", "bert-tiny", "PyTorch DDP"), ("ddp", "bert-tiny", "Ray Train"),
        ("zero1", "bert-tiny", "PyTorch DDP"), ("ddp", "bert-mini", "PyTorch DDP"),
        ("zero1", "bert-mini", "PyTorch DDP")]
    mini_zero1 = rows[-1]
    assert mini_zero1["Runs"] == "2" and mini_zero1["Step time (ms)"] == "333.0"
    assert mini_zero1["Step time ÷ ddp"] == "1.09×"  # 0.333 / 0.305: bert-mini's ddp, not bert-tiny's
    assert mini_zero1["Memory ÷ ddp"] == "0.75×"  # 1505 / 2005
    assert rows[2]["Step time ÷ ddp"] == "1.20×"  # bert-tiny's zero1 against bert-tiny's ddp, as before


def test_figure_b4_draws_each_strategy_over_the_model_sizes_it_was_recorded_at(sized_store, tmp_path):
    report = build_report(sized_store, profile="strategies")
    assert list(report.size_lines) == [("ddp", "ddp", 2, 2), ("zero1", "ddp", 2, 2)]  # ray: one size only
    ddp = report.size_lines[("ddp", "ddp", 2, 2)]
    assert [p.model for p in ddp] == ["bert-tiny", "bert-mini"]
    assert ddp[1].step_ms == pytest.approx((300.0, 310.0)) and ddp[1].memory_mb == (2000.0, 2010.0)
    files = generate_report(sized_store, tmp_path / "report", profile="strategies")
    markdown = Path(files.markdown).read_text()
    assert "Figure B.4: step time and memory per worker as the model grows" in markdown
    png = tmp_path / "report" / "figures" / "figure-b.4-model-sizes.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plain = generate_report(stores_without_sizes := _store(tmp_path / "plain", {"ddp", "zero1"}),
                            tmp_path / "plain-report", profile="strategies")
    assert stores_without_sizes.runs("ok") and "Figure B.4" not in Path(plain.markdown).read_text()
