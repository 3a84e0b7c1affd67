"""Table B.14: MFU against the peak it names, and energy or why it was not measured (issue #55)."""

import pytest
from report_helpers import record_with_clock

from dtlab.cell import Cell
from dtlab.report import build_report
from dtlab.report.recommendation import Priorities, rank
from dtlab.report.run_figures import run_cost, run_energy, run_mfu
from dtlab.results import ResultStore

FLOPS_PER_EPOCH = 4.5e12
CPU_PEAK = {"flops_per_s": 2.0e10, "source": "measured: fp32 GEMM 512x512 on 1 thread of rank 0, ..."}
NO_ENERGY = {"joules": None, "gpu_j": None, "cpu_package_j": None,
             "why_not": "no GPU on this rank (NVML); no RAPL counter readable on this node"}


def b14(store):
    return [t for t in build_report(store, profile="smoke").extra_tables if t.number == "B.14"]


def test_mfu_is_the_models_flops_per_training_second_over_every_workers_peak(tmp_path):
    older, newer = ResultStore(tmp_path / "older"), ResultStore(tmp_path / "newer")
    times = (100.0, 110.0, 120.0)
    for seed, time_s in enumerate(times):
        record_with_clock(older, Cell("ddp", 2, 2, seed, "smoke"), time_s=time_s, startup_s=5.0)
        record_with_clock(newer, Cell("ddp", 2, 2, seed, "smoke"), time_s=time_s, startup_s=5.0,
                          fields={"model_flops_per_epoch": FLOPS_PER_EPOCH, "device_peak": CPU_PEAK,
                                  "energy": NO_ENERGY})
    assert b14(older) == []  # runs from before dtlab counted FLOPs: no table of "not recorded"
    [row] = b14(newer)[0].rows
    # 2 epochs, each 0.45 of the run's time in training (made_up_result), 2 workers of CPU_PEAK each.
    expected = [FLOPS_PER_EPOCH * 2 / (0.9 * t) / (CPU_PEAK["flops_per_s"] * 2) for t in times]
    assert row[3].text == "3"
    assert row[4].text == (f"{sum(expected) / 3 * 100:.2f}% ({min(expected) * 100:.2f}–"
                           f"{max(expected) * 100:.2f}%)")
    assert row[5].text == CPU_PEAK["source"]
    assert row[6].text == "—" and row[7].text == f"not measured: {NO_ENERGY['why_not']}"
    assert (row[8].text, row[9].text) == ("—", "no node_cost_per_hour in the inventory")


def test_a_runs_cost_is_every_nodes_rate_times_its_whole_run(tmp_path):
    store = ResultStore(tmp_path / "results")
    rates = {"node0": 1.5, "node1": 2.0, "node2": 2.0}
    for seed in range(2):  # the helper's whole run: 5 s to the first step, 3595 s of training, 2 to record
        record_with_clock(store, Cell("ray", 2, 1, seed, "smoke"), time_s=3593.0 + 3600 * seed, startup_s=5.0,
                          fields={"model_flops_per_epoch": FLOPS_PER_EPOCH, "device_peak": CPU_PEAK,
                                  "energy": NO_ENERGY, "node_cost_per_hour": rates})
    [row] = b14(store)[0].rows
    assert row[8].text == "8.2500 (5.5000–11.0000)"  # 5.5 per hour x 1 and 2 hours
    assert row[9].text == "3 nodes x the whole run (submit to recorded)"
    assert run_cost({"node_cost_per_hour": {"node0": 1.0, "node1": None}}) == (
        None, "no node_cost_per_hour for node1")


def cuda_result(gpu: str, precision: str = "no", energy: dict | None = None) -> dict:
    return {"model_flops_per_epoch": 3.94e12 * 10, "device": "cuda", "world_size": 1,
            "epoch_metrics": [{"train_time_s": 10.0}, {"train_time_s": 10.0}],
            "hyperparameters": {"mixed_precision": precision}, "versions": {"gpu": gpu},
            "device_peak": {"flops_per_s": None, "source": "declared per GPU model"}, "energy": energy}


def test_a_gpus_peak_is_the_declared_one_for_the_type_it_computed_in():
    mfu, source = run_mfu(cuda_result("NVIDIA GeForce GTX 1060 3GB (sm 6.1)"))
    assert mfu == pytest.approx(1.0) and source.startswith("GTX 1060 3GB fp32, 1152 CUDA cores")
    mfu, source = run_mfu(cuda_result("NVIDIA H200 (sm 9.0)", precision="bf16"))
    assert mfu == pytest.approx(3.94e12 / 989.5e12) and source.startswith("H200 bf16")
    pascal = "NVIDIA GeForce GTX 1060 3GB (sm 6.1)"
    assert run_mfu(cuda_result(pascal, precision="bf16")) == (
        None, f"no declared bf16 peak for {pascal} (dtlab/data/gpu_compat.yml's peaks)")
    assert run_mfu({"device": "cpu"})[0] is None


def test_energy_is_what_was_measured_or_why_not():
    measured = {"joules": 500.0, "gpu_j": 400.0, "cpu_package_j": 100.0, "why_not": None}
    assert run_energy(cuda_result("NVIDIA H200", energy=measured)) == (
        500.0, "GPUs (NVML) + CPU packages (RAPL)")
    assert run_energy({}) == (None, "not recorded (a run from before dtlab measured energy)")
    assert run_energy({"energy": NO_ENERGY}) == (None, f"not measured: {NO_ENERGY['why_not']}")


def test_mfu_energy_and_cost_are_criteria_a_ranking_can_put_first(tmp_path):
    """--priorities cost (or mfu, energy): ordered on the runs' figures by the report's rule of noise."""
    store = ResultStore(tmp_path / "results")
    measured = {"joules": 900.0, "gpu_j": 900.0, "cpu_package_j": None, "why_not": "no RAPL counter"}
    for framework, rate in (("ddp", 3.0), ("ray", 1.0)):
        for seed in range(3):
            record_with_clock(store, Cell(framework, 2, 2, seed, "smoke"), time_s=100.0 + seed, startup_s=5.0,
                              fields={"model_flops_per_epoch": FLOPS_PER_EPOCH, "device_peak": CPU_PEAK,
                                      "energy": measured, "node_cost_per_hour": {"n0": rate, "n1": rate}})
    comparison = build_report(store, profile="smoke").comparison
    assert comparison.measures["cost"]["ray"].n == 3 and comparison.measures["energy"]["ddp"].value == 900.0
    cheapest = rank(comparison, Priorities(("cost",)))
    assert [x.platform for x in cheapest[:2]] == ["ray", "ddp"] and cheapest[1].rank == 2
    # Energy is the same for both: within noise, so neither is ahead on it.
    both = {x.platform: x.rank for x in rank(comparison, Priorities(("energy",)))}
    assert both["ddp"] == both["ray"] == 1
    assert comparison.measures["mfu"]["slurm"].shown == "no run"
