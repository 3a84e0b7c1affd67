"""Model FLOPs utilization and energy per run (beyond the study; issue #55): Table B.14.

MFU = the model's FLOPs per epoch (result.json's model_flops_per_epoch: its matmuls, forward and backward,
each review at its own length; trainer/flops.py) x the epochs trained / their training time (validation
left out), over the peak of every worker: a GPU's declared dense peak for the type the run computed in
(dtlab/data/gpu_compat.yml's `peaks`), or on CPU the fp32 GEMM rate rank 0's threads reached (measured by
the trainer after its timed span, the same threads per worker). Energy: the training span's joules as the
trainer measured them (NVML, RAPL), or "not measured" with the node's reason. Cost: each node's
node_cost_per_hour (the inventory's, recorded with the run) x the whole run, submit to recorded: the run
holds the cluster.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dtlab import platforms
from dtlab.report.numbers import Value, missing, text
from dtlab.report.run_figures import run_cost, run_energy, run_mfu
from dtlab.report.tables import Table, config_label

GroupKey = tuple[str, int, int, str]  # (framework, gpus, epochs, device)


def efficiency_table(results: Sequence[tuple[str, int, int, Mapping[str, Any]]]) -> Table | None:
    """Table B.14 from (framework, gpus, epochs, result) of the runs the study's tables use; None when no
    run recorded its model FLOPs (the table would only say "not recorded")."""
    if not any(result.get("model_flops_per_epoch") is not None for *_, result in results):
        return None
    groups: dict[GroupKey, list[Mapping[str, Any]]] = defaultdict(list)
    for framework, gpus, epochs, result in results:
        groups[(framework, gpus, epochs, str(result.get("device")))].append(result)
    order = {name: index for index, name in enumerate(platforms.NAMES)}
    rows = []
    for (framework, gpus, epochs, device), members in sorted(
            groups.items(), key=lambda item: (order.get(item[0][0], len(order)), item[0][1:])):
        mfus = [run_mfu(result) for result in members]
        energies = [run_energy(result) for result in members]
        costs = [run_cost(result) for result in members]
        rows.append([
            text(platforms.label(framework)),
            text(config_label(gpus, device)),
            text(str(epochs)),
            text(str(len(members))),
            _mean_range([value for value, _ in mfus], "pct"),
            text(_one_text(mfus)),
            _mean_range([value for value, _ in energies], "energy_j"),
            text(_one_text(energies)),
            _mean_range([value for value, _ in costs], "cost"),
            text(_one_text(costs)),
        ])
    return Table(
        "B.14",
        "table-b.14-efficiency",
        "Model FLOPs utilization, energy and cost per run (beyond the study)",
        ["Platform", "Configuration", "Epochs", "Runs", "MFU: mean (min–max)",
         "Peak per worker it is taken against", "Energy per run (J): mean (min–max)",
         "Energy: what it covers", "Cost per run: mean (min–max)", "Cost: what it covers"],
        rows,
        [
            "MFU: the model's matmul FLOPs (forward and backward, each review at its own length: "
            "trainer/flops.py, equal to torch's FLOP counter) per second of training, validation left "
            "out, over every worker's peak. A GPU's peak is its declared dense peak for the type the run "
            "computed in (dtlab/data/gpu_compat.yml); a CPU's is the fp32 GEMM rate rank 0's threads "
            "reached, measured after training: a rate this machine reaches, not a datasheet's.",
            "Energy: the training span, each rank's GPU by NVML (power sampled once a second) and each "
            "node's CPU packages by RAPL, once per node. Where a node exposes neither (the lab's "
            "containers, most VMs) it says \"not measured\" and why: no figure is estimated.",
            "Cost: each node's node_cost_per_hour (inventory; recorded with the run, in its unit) x the "
            "whole run, submit to recorded, summed over the cluster's nodes: a run holds the cluster.",
        ],
    )


def _mean_range(values: list[float | None], kind: str) -> Value:
    known = [value for value in values if value is not None]
    if not known:
        return missing()
    scale, unit, digits = {"pct": (100, "%", 2), "energy_j": (1, "", 0), "cost": (1, "", 4)}[kind]
    shown = f"{statistics.fmean(known) * scale:.{digits}f}{unit}"
    if len(known) > 1:
        shown += f" ({min(known) * scale:.{digits}f}–{max(known) * scale:.{digits}f}{unit})"
    if len(known) < len(values):
        shown += f", {len(known)} of {len(values)} runs"
    return text(shown)


def _one_text(pairs: list[tuple[float | None, str]]) -> str:
    """The group's peak (or reason) when every run shares it, else each distinct one."""
    return "; ".join(dict.fromkeys(note for _, note in pairs if note)) or "—"

