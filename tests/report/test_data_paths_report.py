"""Table B.13: each platform's own ETL beside its DataLoader runs, with the spread behind each ratio."""

from report_helpers import record_with_clock

from dtlab.cell import Cell
from dtlab.report import build_report
from dtlab.results import ResultStore

ETL_MARKS = {"etl_started": 3.0, "etl_ended": 9.0, "data_started": 11.0, "data_ready": 11.5}
LOADER_MARKS = {"data_started": 3.0, "data_ready": 5.0}


def table(report, number):
    return next((t for t in report.extra_tables if t.number == number), None)


def test_the_etl_rows_stand_beside_their_loader_rows_and_out_of_the_study_tables(tmp_path):
    store = ResultStore(tmp_path / "results")
    for seed, (loader_s, etl_s) in enumerate([(10.0, 16.0), (11.0, 17.0), (12.0, 18.0)]):
        record_with_clock(store, Cell("spark", 2, 2, seed, "pipeline"), time_s=60.0, startup_s=loader_s,
                          marks=LOADER_MARKS)
        record_with_clock(store, Cell("spark", 2, 2, seed, "pipeline", data_path="platform"),
                          time_s=60.0 + seed, startup_s=etl_s, marks=ETL_MARKS,
                          label="spark (cpu) + platform ETL")
    report = build_report(store, profile="pipeline")
    b13 = table(report, "B.13")
    rows = {(row[0].text, row[3].text.split(":")[0]): row for row in b13.rows}
    assert list(rows) == [("Apache Spark", "DataLoader"), ("Apache Spark", "Spark DataFrame")]
    etl = rows[("Apache Spark", "Spark DataFrame")]
    assert [etl[4].text, etl[5].text, etl[6].text] == ["3", "6.00 (6.00–6.00)", "0.50 (0.50–0.50)"]
    assert etl[7].text == "17.00 (16.00–18.00)"
    # 17/11 = 1.55; its spread 16/12 .. 18/10 does not overlap: a difference the runs support.
    assert etl[11].text == "1.55×"
    assert etl[12].text.startswith("1.33×–1.80×") and "n=3/3" in etl[12].text
    assert "within noise" not in etl[12].text
    assert rows[("Apache Spark", "DataLoader")][5].text == "— (in tokens ready)"
    # The study's tables hold the DataLoader runs only: 3 runs, not 6.
    assert {stats.n for stats in report.groups.values()} == {3}
    # Table B.10's data pipelines column leads with the measurement, the study's word after it.
    pipelines = report.comparison.measures["pipelines"]
    measured = "own ETL: first step 1.55× the DataLoader's, 1.33×–1.80× (n=3/3) (B.13)"
    assert pipelines["spark"].shown.startswith(measured)
    assert pipelines["spark"].shown.endswith("study: yes (section 5.6.4; the study's word, not ranked here)")
    not_yet = "own ETL, not measured yet (bench.all --profile pipeline); study: "
    assert pipelines["ray"].shown.startswith(not_yet)
    assert pipelines["ddp"].shown.startswith("no ETL of its own in dtlab; study: no")


def test_one_run_each_says_so_and_no_etl_run_means_no_table(tmp_path):
    store = ResultStore(tmp_path / "results")
    record_with_clock(store, Cell("ray", 2, 2, 0, "pipeline"), time_s=60.0, startup_s=10.0,
                      marks=LOADER_MARKS)
    assert table(build_report(store, profile="pipeline"), "B.13") is None
    record_with_clock(store, Cell("ray", 2, 2, 0, "pipeline", data_path="platform"), time_s=60.0,
                      startup_s=10.5, marks=ETL_MARKS, label="ray (cpu) + platform ETL")
    [_, etl] = table(build_report(store, profile="pipeline"), "B.13").rows
    assert (etl[11].text, etl[12].text) == ("1.05×", "1 run, no spread (n=1/1)")
