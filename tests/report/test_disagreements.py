"""Table B.9: where this cluster's min-max over runs leaves out the study's value, with the set-up
differences the recorded runs show (issue #28, item 6)."""

from report_helpers import record

from dtlab.cell import Cell
from dtlab.report import build_report, write_report
from dtlab.results import ResultStore

SPARK = "Apache Spark"


def cpu_store(tmp_path, runs: dict[tuple[str, int], list[float]]) -> ResultStore:
    store = ResultStore(tmp_path / "results")
    for (framework, gpus), spans in runs.items():
        for seed, span in enumerate(spans, start=1):
            record(
                store,
                Cell(framework, gpus, 20, seed, "study"),
                time_total_s=span,
                final_accuracy=0.8,
                device="cpu",
            )
    return store


def test_spark_at_parity_with_ddp_disagrees_with_the_studys_overhead(tmp_path, lookup):
    # Spark as fast as DDP at both counts; both scale 1.32x-1.38x from 1 to 2 workers.
    runs = {
        (f, g): spans
        for f in ("ddp", "spark")
        for g, spans in ((1, [100.0, 101.0, 102.0]), (2, [74.0, 75.0, 76.0]))
    }
    report = build_report(cpu_store(tmp_path, runs))
    table = report.disagreements
    found = {(row[0].text, row[1].text.split(" [")[0], row[2].text): row for row in table.rows}
    assert set(found) == {
        ("Table 5.7 overhead vs DDP", SPARK, "1 worker (CPU)"),
        ("Table 5.7 overhead vs DDP", SPARK, "2 workers (CPU)"),
        ("Table 5.9 per-epoch overhead", SPARK, "2 workers (CPU)"),
        ("Table 5.8 speedup", SPARK, "2 workers (CPU)"),
        ("Table 5.8 efficiency", SPARK, "2 workers (CPU)"),
        ("Table 5.8 time reduction", SPARK, "2 workers (CPU)"),
    }, "DDP's speedup (study 1.36x), efficiency and reduction lie inside this cluster's range"
    spark_1 = [v.text for v in found[("Table 5.7 overhead vs DDP", SPARK, "1 worker (CPU)")]][3:]
    assert spark_1 == ["0.98×–1.02×, within noise (n=3/3)", "3.72×", "study above this cluster's range"]
    [setup] = [note for note in table.notes if note.startswith("Set-up differences")]
    assert "device cpu here, cuda (" in setup and "world size 1, 2 CPU worker(s)" in setup
    assert "node versions recorded here: nvidia_driver 535.247.01, torch 2.13.0" in setup
    assert "20-epoch" not in setup, "the same epochs as the study: not a difference"
    assert any(note.startswith("Seconds (s/epoch") for note in table.notes), "CPU seconds are not compared"
    markdown = write_report(report, tmp_path / "report").markdown.read_text()
    assert "## Where this cluster disagrees with the study" in markdown


def test_with_fewer_than_three_runs_no_disagreement_is_claimed(tmp_path):
    runs = {("ddp", 1): [100.0, 101.0], ("spark", 1): [300.0], ("ddp", 2): [75.0, 76.0]}
    table = build_report(cpu_store(tmp_path, runs)).disagreements
    assert table.rows == []
    assert table.notes[0] == (
        "No disagreement can be claimed: every figure rests on a group with fewer than 3 runs."
    )
