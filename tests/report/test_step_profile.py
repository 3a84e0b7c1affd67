"""Table B.15: where a profiled run's steady steps go, and profiled runs kept out of every timed table
(profile_steps, issue #55)."""

from report_helpers import record_with_clock

from dtlab.cell import Cell
from dtlab.report import build_report
from dtlab.results import ResultStore


def rank_profile(forward_backward: float, collectives: float, memory: float) -> dict:
    return {"data_ms": 0.5, "forward_backward_ms": forward_backward, "optimizer_ms": 2.0,
            "collectives_ms": collectives, "peak_memory_mb": memory, "operator_time": "CPU time",
            "top_operators": [{"name": "aten::addmm", "ms_per_step": 9.0, "calls_per_step": 10},
                              {"name": "aten::mm", "ms_per_step": 4.0, "calls_per_step": 5},
                              {"name": "aten::mul", "ms_per_step": 1.0, "calls_per_step": 4},
                              {"name": "aten::add_", "ms_per_step": 0.5, "calls_per_step": 4}]}


def test_a_profiled_run_is_set_in_table_b15_alone_and_left_out_of_the_timed_tables(tmp_path):
    store = ResultStore(tmp_path / "results")
    for seed in range(2):  # two timed runs of 100 s
        record_with_clock(store, Cell("ddp", 2, 2, seed, "smoke"), time_s=100.0, startup_s=5.0)
    profile = {"steps": 4, "skipped_first": 3,
               "ranks": [rank_profile(30.0, 12.0, 500.0), rank_profile(34.0, 14.0, 520.0)]}
    record_with_clock(store, Cell("ddp", 2, 2, 9, "smoke"), time_s=900.0, startup_s=5.0,
                      label="ddp (torchrun) + step profile", fields={"step_profile": profile})
    report = build_report(store, profile="smoke")
    [table] = [t for t in report.extra_tables if t.number == "B.15"]
    [row] = table.rows
    assert [cell.text for cell in row[:4]] == ["PyTorch DDP", "2 workers (CPU)", "ddp",
                                               "1 (2 ranks, 4 steps each)"]
    assert [cell.text for cell in row[4:8]] == ["0.5 (0.5–0.5)", "32.0 (30.0–34.0)", "2.0 (2.0–2.0)",
                                                "13.0 (12.0–14.0)"]
    assert row[8].text == "aten::addmm 9.0; aten::mm 4.0; aten::mul 1.0"
    assert row[9].text == "510 (500–520)"
    # The profiled run's 900 s never reach a timed table: every other table sees the two 100 s runs alone.
    rendered = "\n".join(str(cell.text) for t in report.extra_tables if t.number != "B.15"
                         for r in t.rows for cell in r)
    assert "900" not in rendered


def test_no_profiled_run_no_table(tmp_path):
    store = ResultStore(tmp_path / "results")
    record_with_clock(store, Cell("ddp", 2, 2, 0, "smoke"), time_s=100.0, startup_s=5.0)
    assert [t for t in build_report(store, profile="smoke").extra_tables if t.number == "B.15"] == []
