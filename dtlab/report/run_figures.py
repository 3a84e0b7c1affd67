"""Each run's MFU, energy and cost from its result.json (issue #55): what Table B.14 groups and the
verdict's mfu, energy and cost criteria compare (dtlab.report.efficiency says how each is taken).
Nothing of the report's tables here: aggregate's Sample reads these for every run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtlab import gpucompat

PRECISIONS = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}  # mixed_precision as it ran -> the peak's type
NOT_RECORDED = "not recorded (a run from before dtlab counted model FLOPs)"


def run_mfu(result: Mapping[str, Any]) -> tuple[float | None, str]:
    """(MFU, the peak it was taken against), or (None, why it cannot be given)."""
    flops = result.get("model_flops_per_epoch")
    if flops is None:
        return None, NOT_RECORDED
    metrics = result.get("epoch_metrics") or []
    train_s = sum(m["train_time_s"] for m in metrics)
    if not metrics or train_s <= 0:
        return None, "no training time recorded"
    if result.get("device") == "cuda":
        gpu = (result.get("versions") or {}).get("gpu") or "an unnamed GPU"
        precision = PRECISIONS.get(str((result.get("hyperparameters") or {}).get("mixed_precision")), "fp32")
        declared = gpucompat.load().declared_peak(gpu, precision)
        if declared is None:
            return None, f"no declared {precision} peak for {gpu} (dtlab/data/gpu_compat.yml's peaks)"
        per_worker, source = declared
    else:
        peak = result.get("device_peak") or {}
        per_worker, source = peak.get("flops_per_s"), peak.get("source") or ""
        if not per_worker:
            return None, "no CPU peak recorded"
    return flops * len(metrics) / train_s / (per_worker * int(result["world_size"])), source


def run_energy(result: Mapping[str, Any]) -> tuple[float | None, str]:
    """(joules of the training span, what they cover), or (None, why not measured)."""
    energy = result.get("energy")
    if energy is None:
        return None, "not recorded (a run from before dtlab measured energy)"
    if energy.get("joules") is None:
        return None, f"not measured: {energy.get('why_not') or 'no reading'}"
    parts = [name for name, key in (("GPUs (NVML)", "gpu_j"), ("CPU packages (RAPL)", "cpu_package_j"))
             if energy.get(key) is not None]
    return float(energy["joules"]), " + ".join(parts)


def run_cost(result: Mapping[str, Any]) -> tuple[float | None, str]:
    """(what the run cost, in the inventory's unit), or (None, why not)."""
    rates = result.get("node_cost_per_hour")
    if not rates:
        return None, "no node_cost_per_hour in the inventory"
    unset = sorted(node for node, rate in rates.items() if rate is None)
    if unset:
        return None, f"no node_cost_per_hour for {', '.join(unset)}"
    marks = result.get("harness_timeline_unix") or {}
    if marks.get("submitted") is None or marks.get("recorded") is None:
        return None, "no whole-run clock"
    hours = (marks["recorded"] - marks["submitted"]) / 3600
    return sum(rates.values()) * hours, f"{len(rates)} nodes x the whole run (submit to recorded)"
