"""Table B.17: scenario C's serving, each way beside the plain server over the same checkpoints (#54)."""

from result_factory import made_up_search, made_up_serve

from dtlab.cell import SERVE_TASK, Cell, config_hash
from dtlab.errors import DtlabError
from dtlab.report import build_report, generate_report
from dtlab.results import Provenance, ResultStore

PLAIN = "plain (FastAPI + uvicorn, one process a worker)"
RAY_SERVE = "ray-serve (Ray Serve, a replica a worker)"


def serve_cell(framework: str, seed: int) -> Cell:
    plan = {"serves_framework": "ddp", "port": 8100,
            "load": {"concurrency": [1, 8], "requests": 64, "timeout_s": 30.0}}
    return Cell(framework, 2, 2, seed, "serve", {"max_length": 64}, task=SERVE_TASK, task_plan=plan)


def record_serve(store, framework, seed, **figures):
    cell = serve_cell(framework, seed)
    result = made_up_serve(cell, label=PLAIN if framework == "ddp" else RAY_SERVE, **figures)
    store.record_ok(cell, result, Provenance(config_hash=config_hash(cell), git_rev=None, inventory="lab",
                                             harness_time_s=20.0))


def record_search(store, framework, seed, wall_s):
    plan = {"trials": [{"learning_rate": 0.001}], "budget_epochs": 2, "early_stopping": "asha"}
    cell = Cell(framework, 2, 2, seed, "tune", {"max_length": 64}, task="search-asha", task_plan=plan)
    store.record_ok(cell, made_up_search(cell, wall_s, best=0),
                    Provenance(config_hash=config_hash(cell), git_rev=None, inventory="lab"))


def test_each_way_stands_beside_the_plain_server_level_by_level_with_its_spread(tmp_path):
    store = ResultStore(tmp_path / "results")
    for seed in (1, 2, 3):
        record_search(store, "ddp", seed, 70.0 + seed)  # scenario C's first criterion: within noise
        record_search(store, "ray", seed, 70.5 + seed)
        record_serve(store, "ddp", seed, p99_ms=10.0 + seed, throughput_rps=200.0 + seed)
        record_serve(store, "ray", seed, p99_ms=30.0 + seed, throughput_rps=100.0 + seed)
    report = build_report(store)
    [b17] = [table for table in report.extra_tables if table.number == "B.17"]
    rows = {(row[0].text, row[2].text): row for row in b17.rows}
    assert list(rows) == [(PLAIN, "1"), (PLAIN, "8"), (RAY_SERVE, "1"), (RAY_SERVE, "8")]  # baseline first
    plain, ray = rows[(PLAIN, "8")], rows[(RAY_SERVE, "8")]
    assert plain[3].text == "3" and plain[7].text == "1 (baseline)"
    assert plain[5].text == "12.00 (11.00–13.00)" and plain[6].text == "202.0 (201.0–203.0)"
    # 102/202: Ray Serve's slowest run against the plain server's fastest still does not reach it.
    assert ray[7].text == "0.50×" and "within noise" not in ray[8].text and "n=3/3" in ray[8].text
    assert ray[9].text == "0 / 0 of 192"
    serving = report.comparison.measures["serving"]
    assert serving["ddp"].values == (11.0, 12.0, 13.0) and serving["ray"].value == 32.0
    # Spark serves no checkpoint of its own: deployed with the plain server, it has that one's figure.
    assert serving["spark"].values == serving["ddp"].values
    assert serving["spark"].shown.endswith("by the plain server: Apache Spark has no server of its own")
    [answer] = [answer for who, answer in report.verdict.lines if who.startswith("Scenario C")]
    assert answer.startswith("favours PyTorch DDP") and "p99 12.0 ms (n=3)" in answer, answer
    assert "Scenario C: one trained checkpoint served" in generate_report(
        store, tmp_path / "report").markdown.read_text()


def test_a_platform_with_no_server_is_judged_by_the_plain_servers_figure_and_one_with_a_server_by_its_own(
        tmp_path):
    store = ResultStore(tmp_path / "results")
    for seed in (1, 2, 3):  # scenario C's three candidates searched, within noise of each other
        for framework, wall_s in (("ddp", 70.0), ("determined", 70.5), ("ray", 70.2)):
            record_search(store, framework, seed, wall_s + seed)
        record_serve(store, "ddp", seed, p99_ms=10.0 + seed)
    report = build_report(store)
    serving = report.comparison.measures["serving"]
    assert serving["determined"].values == serving["ddp"].values == (11.0, 12.0, 13.0)
    assert "Determined AI has no server of its own" in serving["determined"].shown
    assert not serving["ray"].measured  # Ray's own way, Ray Serve, did not run: the plain figure is not Ray's
    [answer] = [answer for who, answer in report.verdict.lines if who.startswith("Scenario C")]
    assert answer.startswith("not decidable yet: serving latency (p99) is not measured for Ray Train"), answer
    assert "Determined" not in answer.split(". Decide")[0], answer
    assert "`invoke bench.all --profile serve` (its 3 cells took 1.0 min of cell time here" in answer, answer


def test_a_way_that_gave_a_wrong_answer_has_no_serving_figure(tmp_path):
    store = ResultStore(tmp_path / "results")
    record_serve(store, "ddp", 1)
    record_serve(store, "ray", 1, mismatches=1)
    serving = build_report(store).comparison.measures["serving"]
    assert serving["ddp"].measured and not serving["ray"].measured
    assert "wrong answers" in serving["ray"].shown


def test_a_serve_json_unlike_its_cell_is_refused_in_one_line(tmp_path):
    store, cell = ResultStore(tmp_path / "results"), serve_cell("ray", 1)
    result = made_up_serve(cell, serves="ddp-g2-e2-s9")
    try:
        store.record_ok(cell, result, Provenance(config_hash=config_hash(cell), git_rev=None,
                                                 inventory="lab"))
    except DtlabError as error:
        assert "serves ddp-g2-e2-s9 at concurrency [1, 8], but the cell serves ddp-g2-e2-s1" in str(error)
        assert "\n" not in str(error)
    else:
        raise AssertionError("a serve.json of another cell was recorded")
    assert store.runs(status=None) == []
