"""Table B.8 and Figure B.3: time to the profile's target accuracy, and whether platforms agree on the
epoch they reach it at for the same seed (issue #28, item 3)."""

import pytest
from report_helpers import figure_panels
from result_factory import made_up_result

from dtlab import matrix
from dtlab.cell import Cell
from dtlab.report import build_report
from dtlab.report.aggregate import epoch_ends_from_submit
from dtlab.report.render import figure_time_to_target, write_report
from dtlab.results import Provenance, ResultStore

DDP, SPARK, RAY = "PyTorch DDP", "Apache Spark", "Ray Train"
SUBMITTED = 1_000_000.0


def timed_result(
    framework: str, seed: int, accuracies: list[float], *, start_s: float, epoch_s: float = 10.0
):
    """A 2-worker CPU run whose validation accuracy per epoch is `accuracies`; training starts `start_s`
    after submit, each epoch trains 0.9 and validates 0.1 of `epoch_s`, with 0.5 s between epochs."""
    epochs = len(accuracies)
    result = made_up_result(
        framework, 2, epochs, seed, time_total_s=epoch_s * epochs, final_accuracy=accuracies[-1], device="cpu"
    )
    for metrics, accuracy in zip(result["epoch_metrics"], accuracies, strict=True):
        metrics.update(val_accuracy=accuracy, train_time_s=epoch_s * 0.9, val_time_s=epoch_s * 0.1)
    started = SUBMITTED + start_s
    ended = started + epoch_s * epochs + 0.5 * (epochs - 1)
    result["timeline_unix"] = {
        "process_started": SUBMITTED + 1,
        "training_started": started,
        "first_step_done": started + 1,
        "training_ended": ended,
    }
    result["harness_timeline_unix"] = {"submitted": SUBMITTED, "recorded": ended + 1}
    return result


def store_of(tmp_path, runs: dict[tuple[str, int], tuple[list[float], float]]) -> ResultStore:
    store = ResultStore(tmp_path / "results")
    for (framework, seed), (accuracies, start_s) in runs.items():
        store.record_ok(
            Cell(framework, 2, len(accuracies), seed, "p"),
            timed_result(framework, seed, accuracies, start_s=start_s),
            Provenance(config_hash="0123456789abcdef", git_rev=None, inventory="lab"),
        )
    return store


@pytest.fixture
def target(tmp_path, monkeypatch):
    """Profile p of a matrix file with the given target_accuracy (None: the key left out)."""

    def set_target(value: float | None):
        path = tmp_path / "matrix.yml"
        key = f"    target_accuracy: {value}\n" if value is not None else ""
        path.write_text(
            f"profiles:\n  p:\n{key}    runs:\n"
            "      - {frameworks: [ddp, spark, ray], gpus: 2, epochs: 3, seeds: [1, 2, 3, 4]}\n"
        )
        monkeypatch.setattr(matrix, "MATRIX_FILE", path)

    return set_target


def test_an_epochs_end_is_derived_from_the_recorded_marks_and_epoch_times():
    result = timed_result("ddp", 1, [0.5, 0.6, 0.7], start_s=5.0)
    # 5 s to training, then 10 s per epoch and 0.5 s between epochs (the recorded span less the epochs).
    assert epoch_ends_from_submit(result) == pytest.approx((15.0, 25.5, 36.0))
    del result["harness_timeline_unix"]
    assert epoch_ends_from_submit(result) == (), "no submit mark: no clock, never a made-up one"


def test_time_to_target_per_platform_and_the_seed_whose_epochs_disagree(tmp_path, target, lookup):
    target(0.75)
    curve, late = [0.6, 0.8, 0.85], [0.6, 0.7, 0.85]
    runs = {("ddp", s): (curve, 2.0 + s) for s in (1, 2, 3)}
    runs |= {("spark", 1): (curve, 36.0), ("spark", 2): (curve, 40.0), ("spark", 3): (late, 44.0)}
    runs |= {("ray", 4): ([0.5, 0.6, 0.7], 10.0)}  # a seed no other platform ran
    look = lookup(build_report(store_of(tmp_path, runs)))
    table = look.table("B.8")
    assert "target accuracy: 0.7500" in table.title
    ddp = (DDP, "2 workers (CPU)", "3")
    assert look.cell("B.8", ddp, "Reached target") == "3"
    assert look.cell("B.8", ddp, "Epochs to target") == "2"
    # Epoch 2 ends 20.5 s after training started, which was 3, 4, 5 s after submit.
    assert look.cell("B.8", ddp, "Time to target mean (s)") == "24.50"
    assert look.cell("B.8", ddp, "Time to target min–max (s)") == "23.50–25.50 (n=3)"
    assert look.cell("B.8", ddp, "Same epoch on every platform") == "no: seed 3 (see the note)"
    spark = (SPARK, "2 workers (CPU)", "3")
    assert look.cell("B.8", spark, "Epochs to target") == "2 (seeds 1, 2), 3 (seed 3)"
    # 56.5, 60.5 and 75 (seed 3 at epoch 3: 31 s after its start at 44 s)
    assert look.cell("B.8", spark, "Time to target min–max (s)") == "56.50–75.00 (n=3)"
    assert look.cell("B.8", spark, "Time to target vs DDP, min–max") == "2.22×–3.19× (n=3/3)"
    ray = (RAY, "2 workers (CPU)", "3")
    assert look.cell("B.8", ray, "Epochs to target") == "never"
    assert look.cell("B.8", ray, "Time to target mean (s)") == "—"
    assert look.cell("B.8", ray, "Same epoch on every platform") == "no other platform ran these seeds"
    assert any("2 workers (CPU), 3 ep, seed 3: PyTorch DDP 2, Apache Spark 3" in note for note in table.notes)
    [panel] = figure_panels(figure_time_to_target(look.report))
    assert panel["bars"][(SPARK, "2 workers (CPU)")] == pytest.approx((56.5 + 60.5 + 75.0) / 3)
    assert panel["spread"] and "target not reached" in panel["missing"]


def test_without_a_target_the_section_says_how_to_set_one_and_the_report_is_written(tmp_path, target, lookup):
    target(None)
    report = build_report(store_of(tmp_path, {("ddp", 1): ([0.6, 0.8, 0.85], 3.0)}))
    table = lookup(report).table("B.8")
    assert table.rows == [] and "no target set" in table.title
    assert table.notes == [
        "No target accuracy: set target_accuracy (e.g. 0.80) under profiles.p in "
        "experiments/matrix.yml to get the time to target."
    ]
    files = write_report(report, tmp_path / "report")
    assert "Figure B.3" not in files.markdown.read_text()
    assert "set target_accuracy" in files.markdown.read_text()
