"""The energy a run's training span used, measured where a node exposes it (issue #55).

- A rank's GPU: NVML's power draw (torch.cuda.power_draw, through nvidia-ml-py), sampled once a second
  in a thread of its own and integrated (MLPerf's power rules sample every node at least once a second).
- A node's CPU packages: the kernel's RAPL counters (/sys/class/powercap/intel-rapl:N, the package
  domains), read at the start and the end; node-wide, so the result counts them once per node.

Where a node has neither (the lab's containers, most VMs), each rank says why, and the report says
"not measured" with that reason: no figure is ever made up.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

RAPL_ROOT = Path("/sys/class/powercap")
SAMPLE_EVERY_S = 1.0


def rapl_packages(root: Path = RAPL_ROOT) -> list[Path]:
    """The package domains' directories (intel-rapl:0, intel-rapl:1, ...) whose counter this process reads."""
    found = []
    for domain in sorted(root.glob("intel-rapl:*")):
        with contextlib.suppress(OSError):
            if ":" not in domain.name.removeprefix("intel-rapl:") and \
                    (domain / "name").read_text().startswith("package") and \
                    int((domain / "energy_uj").read_text()) >= 0:
                found.append(domain)
    return found


def _read_uj(domain: Path) -> int:
    return int((domain / "energy_uj").read_text())


class EnergyMeter:
    """start() before the training span and stop() after it: this rank's GPU joules (None without one)
    and its node's CPU package joules (None without RAPL), with why not."""

    def __init__(self, device, rapl_root: Path = RAPL_ROOT):
        self.device = device
        self.rapl = rapl_packages(rapl_root)
        self._rapl_start: list[int] = []
        self._gpu_j = 0.0
        self._gpu_ok = device.type == "cuda"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._rapl_start = [_read_uj(domain) for domain in self.rapl]
        if self._gpu_ok:
            self._thread = threading.Thread(target=self._sample_gpu, name="dtlab-energy", daemon=True)
            self._thread.start()

    def _sample_gpu(self) -> None:
        """CUDA-only: power (mW) once a second, integrated by the trapezoid rule until stop()."""
        import torch

        try:
            last_at, last_mw = time.monotonic(), torch.cuda.power_draw(self.device)
            while not self._stop.wait(SAMPLE_EVERY_S):
                now, mw = time.monotonic(), torch.cuda.power_draw(self.device)
                self._gpu_j += (now - last_at) * (last_mw + mw) / 2 / 1000
                last_at, last_mw = now, mw
            now, mw = time.monotonic(), torch.cuda.power_draw(self.device)
            self._gpu_j += (now - last_at) * (last_mw + mw) / 2 / 1000
        except Exception:  # noqa: BLE001 (NVML unloadable, or a GPU without power readings)
            self._gpu_ok = False

    def stop(self) -> dict:
        """{"gpu_j", "cpu_package_j", "why_not"}: each None where not measured, and why_not then says why."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * SAMPLE_EVERY_S)
        cpu_j = None
        if self.rapl:
            cpu_j = sum(_wrapped(domain, start, _read_uj(domain))
                        for domain, start in zip(self.rapl, self._rapl_start, strict=True)) / 1e6
        missing = []
        if not self._gpu_ok:
            missing.append("no NVML power reading of a GPU on this rank" if self.device.type == "cuda"
                           else "no GPU on this rank (NVML)")
        if cpu_j is None:
            missing.append(f"no RAPL counter ({RAPL_ROOT}/intel-rapl:*) readable on this node")
        return {"gpu_j": self._gpu_j if self._gpu_ok else None, "cpu_package_j": cpu_j,
                "why_not": "; ".join(missing) or None}


def _wrapped(domain: Path, start: int, end: int) -> int:
    """The counter's increase, across one wrap-around (max_energy_range_uj)."""
    if end >= start:
        return end - start
    return int((domain / "max_energy_range_uj").read_text()) - start + end
