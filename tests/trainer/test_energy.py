"""The energy of a run's training span (trainer/energy.py, issue #55): where a node has no GPU and no RAPL
counter (this machine, the lab), "not measured" and why; the RAPL arithmetic on a sysfs tree shaped as the
kernel's (a stand-in: no RAPL counter is readable here)."""

from pathlib import Path

import torch

from trainer.energy import EnergyMeter, rapl_packages
from trainer.result import energy_summary


def kernel_rapl(root: Path, packages: dict[int, tuple[int, int]]) -> None:
    """intel-rapl:N/{name, energy_uj, max_energy_range_uj} per package, and a core sub-domain to skip."""
    for index, (energy, wrap) in packages.items():
        domain = root / f"intel-rapl:{index}"
        (domain / f"intel-rapl:{index}:0").mkdir(parents=True)
        (domain / f"intel-rapl:{index}:0" / "name").write_text("core\n")
        (domain / f"intel-rapl:{index}:0" / "energy_uj").write_text("5\n")
        (domain / "name").write_text(f"package-{index}\n")
        (domain / "energy_uj").write_text(f"{energy}\n")
        (domain / "max_energy_range_uj").write_text(f"{wrap}\n")
    (root / "intel-rapl-mmio:0").mkdir(parents=True)  # another zone, not a package counter


def test_a_node_without_a_gpu_or_rapl_says_not_measured_and_why(tmp_path):
    meter = EnergyMeter(torch.device("cpu"), rapl_root=tmp_path)
    meter.start()
    measured = meter.stop()
    assert measured["gpu_j"] is None and measured["cpu_package_j"] is None
    assert measured["why_not"] == ("no GPU on this rank (NVML); no RAPL counter "
                                   "(/sys/class/powercap/intel-rapl:*) readable on this node")


def test_rapl_packages_are_counted_across_a_wrap_around(tmp_path):
    kernel_rapl(tmp_path, {0: (1_000_000, 10_000_000), 1: (9_000_000, 10_000_000)})
    assert [p.name for p in rapl_packages(tmp_path)] == ["intel-rapl:0", "intel-rapl:1"]
    meter = EnergyMeter(torch.device("cpu"), rapl_root=tmp_path)
    meter.start()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("4000000\n")  # +3 J
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("1000000\n")  # wrapped: +2 J
    measured = meter.stop()
    assert measured["cpu_package_j"] == 5.0 and measured["gpu_j"] is None
    assert measured["why_not"] == "no GPU on this rank (NVML)"


def test_a_nodes_cpu_counter_counts_once_and_a_missing_part_stays_unmeasured():
    def rank(host, gpu_j, cpu_j, why=None):
        return {"host": host, "energy": {"gpu_j": gpu_j, "cpu_package_j": cpu_j, "why_not": why}}

    two_nodes = [rank("a", 100.0, 40.0), rank("a", 110.0, 41.0), rank("b", 90.0, 30.0)]
    assert energy_summary(two_nodes) == {"joules": 370.0, "gpu_j": 300.0, "cpu_package_j": 70.0,
                                         "why_not": None}
    lab = [rank("n1", None, None, "no GPU"), rank("n2", None, None, "no GPU")]
    assert energy_summary(lab) == {"joules": None, "gpu_j": None, "cpu_package_j": None, "why_not": "no GPU"}
