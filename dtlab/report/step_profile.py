"""Where a step's time goes (beyond the study; issue #55): Table B.15, from the runs that asked for a step
profile (profile_steps: torch.profiler over a few steady optimizer steps on every rank:
trainer/step_profile.py).

A profiled run is its own cell, labelled " + step profile": the profiler's own cost is in its step time, so
the report keeps it out of every timed table and sets it here alone."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dtlab import platforms
from dtlab.report.numbers import text
from dtlab.report.tables import Table, config_label
from trainer import strategies

PHASES = (("data_ms", "Data loading"), ("forward_backward_ms", "Forward and backward"),
          ("optimizer_ms", "Optimizer"), ("collectives_ms", "Collectives' span (beside backward)"))
TOP_SHOWN = 3


def is_profiled(result: Mapping[str, Any]) -> bool:
    return bool(result.get("step_profile"))


def step_profile_table(results: Sequence[tuple[str, int, Mapping[str, Any]]]) -> Table | None:
    """Table B.15 from (framework, gpus, result) of the profiled runs; None when there is none."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for framework, gpus, result in results:
        if is_profiled(result):
            strategy = str(result.get("hyperparameters", {}).get("strategy", strategies.DEFAULT))
            groups[(framework, config_label(gpus, str(result.get("device"))), strategy)].append(result)
    if not groups:
        return None
    order = {name: index for index, name in enumerate(platforms.NAMES)}
    rows = []
    for (framework, configuration, strategy), members in sorted(
            groups.items(), key=lambda item: (order.get(item[0][0], len(order)), item[0][1:])):
        ranks = [rank for result in members for rank in result["step_profile"]["ranks"] if rank]
        steps = sorted({result["step_profile"]["steps"] for result in members})
        rows.append([
            text(platforms.label(framework)), text(configuration), text(strategy),
            text(f"{len(members)} ({len(ranks)} ranks, {'/'.join(map(str, steps))} steps each)"),
            *(text(_mean_range([rank[key] for rank in ranks])) for key, _ in PHASES),
            text(_top_operators(ranks)),
            text(_mean_range([rank["peak_memory_mb"] for rank in ranks], digits=0)),
        ])
    return Table(
        "B.15",
        "table-b.15-step-profile",
        "Where a steady step's time goes, per rank (beyond the study; profiled runs only)",
        ["Platform", "Configuration", "Strategy", "Runs",
         *(f"{title} (ms per step): mean (min–max over ranks)" for _, title in PHASES),
         f"Top {TOP_SHOWN} operators by their own time (ms per step)", "Peak memory (MiB)"],
        rows,
        [
            "torch.profiler over `profile_steps` optimizer steps after the first 3 (warm-up), on every rank "
            "of the run; the phases are the trainer's own marks (loading and moving the batch, forward and "
            "backward, the optimizer step), each the rank's wall time inside it. The collectives' span is "
            "the gloo or NCCL operations' own span (DDP's bucket all-reduce, Horovod's, the sharded "
            "strategies' gathers), which runs beside backward: it overlaps forward and backward, it is not "
            "added to it. Operators: their own time on the CPU, or the CUDA kernels' on a GPU.",
            "A profiled run pays the profiler in its step time: it is its own cell (profile_steps is part "
            "of the config hash) and is left out of every other table.",
        ],
    )


def _mean_range(values: list[float], digits: int = 1) -> str:
    if not values:
        return "—"
    shown = f"{statistics.fmean(values):.{digits}f}"
    return shown + (f" ({min(values):.{digits}f}–{max(values):.{digits}f})" if len(values) > 1 else "")


def _top_operators(ranks: list[Mapping[str, Any]]) -> str:
    """The operators that took the most own time, averaged over every rank that listed them."""
    times: dict[str, list[float]] = defaultdict(list)
    for rank in ranks:
        for operator in rank["top_operators"]:
            times[operator["name"]].append(operator["ms_per_step"])
    ranked = sorted(times.items(), key=lambda item: -statistics.fmean(item[1]))[:TOP_SHOWN]
    return "; ".join(f"{name} {statistics.fmean(values):.1f}" for name, values in ranked) or "—"
