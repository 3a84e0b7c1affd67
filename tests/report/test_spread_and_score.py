"""Every comparison carries its spread and the runs it rests on; the MLPerf-style score (Table B.7)."""

import pytest
from report_helpers import figure_panels, record

from dtlab import matrix
from dtlab.cell import Cell
from dtlab.errors import DtlabError
from dtlab.report import build_report, build_study_report
from dtlab.report.aggregate import ratio_spread, score
from dtlab.report.render import figure_5_1
from dtlab.report.tables import STUDY_SPREAD_NOTE
from dtlab.results import ResultStore

DDP, SPARK, RAY = "PyTorch DDP", "Apache Spark", "Ray Train"


def store_with(tmp_path, times: dict[tuple[str, int], list[float]], accuracy: float = 0.80, epochs: int = 20):
    store = ResultStore(tmp_path / "results")
    for (framework, gpus), spans in times.items():
        for seed, span in enumerate(spans, start=1):
            record(
                store,
                Cell(framework, gpus, epochs, seed, "study"),
                time_total_s=span,
                final_accuracy=accuracy,
            )
    return store


def test_one_run_is_marked_and_never_ranked(tmp_path, lookup):
    look = lookup(
        build_report(store_with(tmp_path, {("ddp", 1): [14.0], ("ddp", 2): [20.0], ("spark", 2): [10.0]}))
    )
    assert look.cell("5.8", (DDP, "2 GPUs vs 1"), "Speedup") == "0.70×", "the figure itself is still shown"
    assert look.cell("5.8", (DDP, "2 GPUs vs 1"), "Speedup min–max") == "1 run, no spread (n=1/1)"
    assert look.cell("5.7", (SPARK,), "Overhead min–max, 2 GPUs") == "1 run, no spread (n=1/1)"
    assert look.cell("5.1", ("1 GPU", "20"), "Time min–max (s)") == "1 run, no spread (n=1)"
    assert look.cell("B.7", (SPARK, "2 GPUs"), "Rank at this count") == "not ranked (1 run)"
    assert look.cell("B.7", (DDP, "2 GPUs"), "Rank at this count") == "not ranked (1 run)"


def test_the_issues_three_runs_each_are_within_noise(tmp_path, lookup):
    """Issue #28's reruns on an idle lab: DDP at 1 and 2 workers, Spark and Ray at 2, equal within noise."""
    runs = {
        ("ddp", 1): [13.2, 18.8, 14.0],
        ("ddp", 2): [14.6, 18.0, 12.9],
        ("spark", 2): [14.0, 15.5, 15.4],
        ("ray", 2): [16.7, 14.6, 13.5],
    }
    look = lookup(build_report(store_with(tmp_path, runs)))
    speedup = look.cell("5.8", (DDP, "2 GPUs vs 1"), "Speedup min–max")
    # 13.2 / 18.0 .. 18.8 / 12.9: the interval holds 1.0, so no speedup (or slowdown) is shown as found.
    assert speedup == "0.73×–1.46×, within noise (n=3/3)"
    assert look.cell("5.8", (DDP, "2 GPUs vs 1"), "Efficiency min–max") == "37%–73%, within noise (n=3/3)"
    assert look.cell("5.7", (SPARK,), "Overhead min–max, 2 GPUs").endswith("within noise (n=3/3)")
    assert look.cell("5.9", (RAY, "2 GPUs"), "Overhead (%) min–max").endswith("within noise (n=3/3)")
    assert look.cell("5.1", ("2 GPUs", "20"), "Time min–max (s)") == "12.90–18.00 (n=3)"
    ranks = {row[0].split(" [")[0]: row[-1] for row in look.rows("B.7") if row[1] == "2 GPUs"}
    assert ranks == {DDP: "1", SPARK: "1", RAY: "1"}, "overlapping runs share a rank"
    assert any("n=5 per 20-epoch figure" in note for note in look.table("5.8").notes)


def test_five_runs_with_a_clear_difference_show_the_interval_and_no_mark(tmp_path, lookup):
    spread = [-2.0, -1.0, 0.0, 1.0, 2.0]
    runs = {
        ("ddp", 1): [100 + d for d in spread],
        ("ddp", 2): [60 + d for d in spread],
        ("spark", 2): [200 + d for d in spread],
    }
    look = lookup(build_report(store_with(tmp_path, runs)))
    assert look.cell("5.8", (DDP, "2 GPUs vs 1"), "Speedup") == "1.67×"
    assert look.cell("5.8", (DDP, "2 GPUs vs 1"), "Speedup min–max") == "1.58×–1.76× (n=5/5)"  # 98/62, 102/58
    assert look.cell("5.7", (SPARK,), "Overhead min–max, 2 GPUs") == "3.19×–3.48× (n=5/5)"  # 198/62, 202/58
    assert look.cell("5.7", (DDP,), "Overhead min–max, 2 GPUs") == "– (baseline)"
    assert look.cell("B.7", (DDP, "2 GPUs"), "Rank at this count") == "1"
    assert look.cell("B.7", (SPARK, "2 GPUs"), "Rank at this count") == "2"
    assert look.cell("B.7", (SPARK, "2 GPUs"), "Score (s)") == "200.00"
    assert look.cell("B.7", (SPARK, "2 GPUs"), "Runs scored") == "3", "fastest and slowest of 5 dropped"


def test_the_score_drops_the_fastest_and_slowest_of_five_or_more():
    assert score([10.0, 11.0, 12.0, 13.0, 100.0], [0.8] * 5).value == pytest.approx(12.0)
    four = score([10.0, 11.0, 12.0, 100.0], [0.8] * 4)
    assert (four.value, four.used, four.trimmed) == (pytest.approx(33.25), 4, False)


def test_a_run_under_the_target_is_dropped_and_two_invalidate_the_cell():
    times, accuracies = [10.0, 11.0, 12.0, 13.0, 14.0], [0.8, 0.8, 0.8, 0.8, 0.5]
    one_miss = score(times, accuracies, target_accuracy=0.75)
    # The miss counts as the slowest: trimmed away with the fastest, the mean of 11, 12, 13 is left.
    assert (one_miss.missed_target, one_miss.used, one_miss.value) == (1, 3, pytest.approx(12.0))
    assert score([10.0, 20.0, 30.0], [0.8, 0.5, 0.8], target_accuracy=0.75).value == pytest.approx(20.0)
    two = score(times, [0.8, 0.5, 0.8, 0.8, 0.5], target_accuracy=0.75)
    assert two.invalid and two.missed_target == 2
    assert not score(times, [0.5] * 5).invalid, "no target: no run misses it"


def test_the_profiles_target_accuracy_scores_table_b7(tmp_path, lookup, monkeypatch):
    matrix_file = tmp_path / "matrix.yml"
    matrix_file.write_text(
        "profiles:\n  study:\n    target_accuracy: 0.75\n"
        "    runs:\n      - {frameworks: [ddp], gpus: [1, 2], epochs: [20], seeds: [1, 2, 3, 4, 5]}\n"
    )
    monkeypatch.setattr(matrix, "MATRIX_FILE", matrix_file)
    store = store_with(tmp_path, {("ddp", 1): [100.0, 101.0, 102.0, 103.0, 104.0]})
    for seed, (span, accuracy) in enumerate(
        [(60.0, 0.8), (61.0, 0.5), (62.0, 0.8), (63.0, 0.5), (64.0, 0.8)], 1
    ):
        record(store, Cell("ddp", 2, 20, seed, "study"), time_total_s=span, final_accuracy=accuracy)
    look = lookup(build_report(store))
    assert "target accuracy: 0.7500" in look.table("B.7").title
    assert look.cell("B.7", (DDP, "1 GPU"), "Score (s)") == "102.00"
    assert look.cell("B.7", (DDP, "2 GPUs"), "Missed target") == "2"
    assert look.cell("B.7", (DDP, "2 GPUs"), "Score (s)").startswith("invalid")
    assert look.cell("B.7", (DDP, "2 GPUs"), "Rank at this count") == "not ranked (invalid)"


def test_the_study_report_says_its_spread_was_not_published(lookup):
    look = lookup(build_study_report())
    assert look.cell("5.8", (DDP, "2 GPUs vs 1"), "Speedup") == "1.36×"
    assert look.cell("5.8", (DDP, "2 GPUs vs 1"), "Speedup min–max") == "spread not published (n=5/5)"
    assert STUDY_SPREAD_NOTE in look.table("5.7").notes


@pytest.mark.parametrize(
    "profile_keys, seeds, message",
    [
        (
            "target_accuracy: 1.5",
            "[1, 2]",
            r"profiles\.p\.target_accuracy: must be a validation accuracy above 0",
        ),
        ("target_accuracy: 0", "[1]", r"profiles\.p\.target_accuracy: must be .* got 0$"),
        ("target_accuracy: high", "[1]", r"profiles\.p\.target_accuracy: expected float, got 'high'"),
        ("description: x", "[1, 2, 1]", r"profiles\.p\.runs\[0\]\.seeds: each seed once .* got \[1, 2, 1\]"),
    ],
)
def test_bad_scoring_keys_fail_with_one_line(tmp_path, profile_keys, seeds, message):
    path = tmp_path / "matrix.yml"
    path.write_text(
        f"profiles:\n  p:\n    {profile_keys}\n"
        f"    runs:\n      - {{frameworks: ddp, gpus: 1, epochs: 2, seeds: {seeds}}}\n"
    )
    with pytest.raises(DtlabError, match=message) as error:
        matrix.load("p", path)
    assert "\n" not in str(error.value)


def test_n_seeds_are_n_distinct_cells_with_the_target(tmp_path):
    path = tmp_path / "matrix.yml"
    path.write_text(
        "profiles:\n  p:\n    target_accuracy: 0.8\n"
        "    runs:\n      - {frameworks: ddp, gpus: 1, epochs: 2, seeds: [1, 2, 3, 4, 5]}\n"
    )
    loaded = matrix.load("p", path)
    assert [cell.key for cell in loaded] == [f"ddp-g1-e2-s{seed}" for seed in range(1, 6)]
    assert loaded.target_accuracy == 0.8


def test_figure_5_1_shows_overhead_against_ddp_with_its_spread_and_marks(tmp_path):
    runs = {
        ("ddp", 2): [14.6, 18.0, 12.9],
        ("spark", 2): [14.0, 15.5, 15.4],
        ("ray", 2): [16.7],
        ("spark", 1): [30.0, 31.0, 32.0],
    }
    this, study = figure_panels(figure_5_1(build_report(store_with(tmp_path, runs))))
    assert this["bars"][(SPARK, "2 GPUs")] == pytest.approx(44.9 / 45.5)
    assert this["bars"][(DDP, "2 GPUs")] == 1.0, "DDP is the baseline"
    assert this["spread"] and not study["spread"]
    assert {"0.99× (within noise)", "1.10× (1 run, no spread)", "1.00×"} <= set(this["labels"])
    assert "no DDP run" in this["missing"], "Spark's 1-GPU runs have no DDP run to be set against"
    assert study["bars"][(SPARK, "2 GPUs")] == pytest.approx(2.87)


def test_the_end_to_end_ratio_spread_of_table_b3():
    apart = ratio_spread([10.0, 11.0, 12.0], [20.0, 21.0, 22.0])
    assert (apart.low, apart.high, apart.runs, apart.verdict) == (pytest.approx(10 / 22), 0.6, (3, 3), "")
    assert ratio_spread([10.0, 11.0, 21.0], [20.0, 21.0, 22.0]).verdict == "within noise"
    assert ratio_spread([10.0, 11.0], [20.0, 21.0, 22.0]).verdict == "2 runs"
