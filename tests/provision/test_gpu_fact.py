"""The common role's GPU fact script counts a node's NVIDIA GPUs without pciutils, from sysfs.

A lent H100 (tests/fixtures/gpu-h100, Ubuntu 24.04 as a cloud image) has no lspci: before this, its
fact said 0 GPUs and the nvidia role would have skipped the driver on a GPU node."""

import json
import subprocess
import sys
from pathlib import Path

FACT_SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "common" / "files" / "dtlab_gpu.fact"
H100 = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-h100"


def _sysfs(root: Path, devices: dict[str, dict[str, str]]) -> Path:
    for slot, files in devices.items():
        (root / slot).mkdir(parents=True)
        for name, value in files.items():
            (root / slot / name).write_text(value + "\n")
    return root


def _real_h100_devices() -> dict[str, dict[str, str]]:
    """The H100's NVIDIA PCI functions as its sysfs showed them (sysfs-nvidia.txt)."""
    devices = {}
    for line in (H100 / "sysfs-nvidia.txt").read_text().splitlines():
        slot, *fields = line.split()
        devices[slot] = dict(field.split("=", 1) for field in fields)
    return devices


def _fact(sysfs: Path, tmp_path: Path) -> dict:
    empty_path = tmp_path / "bin"  # neither lspci nor nvidia-smi on PATH
    empty_path.mkdir(exist_ok=True)
    answer = subprocess.run([sys.executable, str(FACT_SCRIPT)], capture_output=True, text=True, timeout=60,
                            env={"PATH": str(empty_path), "DTLAB_SYSFS_PCI": str(sysfs)}, check=True)
    return json.loads(answer.stdout)


def test_the_h100s_sysfs_gives_the_fact_it_gave_there(tmp_path):
    real = json.loads((H100 / "dtlab-gpu-fact.json").read_text())
    fact = _fact(_sysfs(tmp_path / "pci", _real_h100_devices()), tmp_path)
    assert fact["nvidia_count"] == real["nvidia_count"] == 1
    assert fact["pci"] == real["pci"] and "[0302]" in fact["pci"][0] and "10de:2330" in fact["pci"][0]
    assert real["names"] == ["NVIDIA H100 80GB HBM3"] and real["compute_capabilities"] == ["9.0"]


def test_only_nvidia_display_controllers_count_not_their_audio_or_other_vendors(tmp_path):
    sysfs = _sysfs(tmp_path / "pci", {
        "0000:01:00.0": {"vendor": "0x10de", "device": "0x1c03", "class": "0x030000"},  # GTX 1060, VGA
        "0000:01:00.1": {"vendor": "0x10de", "device": "0x10f1", "class": "0x040300"},  # its HDMI audio
        "0000:00:02.0": {"vendor": "0x8086", "device": "0x1234", "class": "0x030000"},  # another vendor
    })
    fact = _fact(sysfs, tmp_path)
    assert fact["nvidia_count"] == 1
    assert fact["pci"][0].startswith("0000:01:00.0 ") and "[0300]" in fact["pci"][0]
    assert fact["names"] == [] and fact["driver_version"] == ""  # no nvidia-smi: nothing invented


def test_a_node_with_no_pci_bus_in_sysfs_has_no_gpus(tmp_path):
    assert _fact(tmp_path / "absent", tmp_path)["nvidia_count"] == 0
