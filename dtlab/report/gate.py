"""The report's "Health gate" section: the diagnosis that preceded the reported profile's matrix.

bench.all writes it beside the results, results/<cluster>/gate/gate-<UTC time>.json (dtlab.doctor's
JSON, format 1), before its first cell, and adds every re-check of a node a cell failed on during the
matrix. The section shows the newest gate of the reported profile: when it ran, how many checks passed,
the all-reduce between each pair of workers against the inventory's limits (Table B.6), and each node
the gate drained. The gate's file is read, never written, and never counts as a recorded run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtlab.paths import GATE_DIRNAME
from dtlab.report.numbers import num, text
from dtlab.report.tables import Table

GATE_TABLE_NUMBER = "B.6"
READABLE_FORMATS = (1,)
LATENCY_KEY = "dtlab_max_allreduce_latency_ms"
BANDWIDTH_KEY = "dtlab_min_allreduce_bandwidth_mb_s"


@dataclass
class GateSection:
    source: str  # the gate file, relative to the results folder
    summary: str
    table: Table | None  # the all-reduce pairs; None when the gate was skipped or measured none
    notes: list[str] = field(default_factory=list)


def gate_files(root: Path) -> list[Path]:
    """Every gate file under the results folder, oldest first (their names sort by time)."""
    directory = root / GATE_DIRNAME
    return sorted(directory.glob("gate-*.json")) if directory.is_dir() else []


def gate_section(root: Path, profile: str | None) -> GateSection | None:
    """The newest gate before a matrix of `profile` (any profile's when None); None if there is none.
    A file that cannot be read is a section saying so, never a stopped report."""
    for path in reversed(gate_files(root)):
        source = path.relative_to(root).as_posix()
        try:
            content = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            return GateSection(source, f"The gate file {source} cannot be read ({error}).", None)
        if not isinstance(content, dict):
            return GateSection(source, f"The gate file {source} is not a gate's JSON object.", None)
        matrix = content.get("matrix") or {}
        if profile is not None and matrix.get("profile") != profile:
            continue
        if content.get("format") not in READABLE_FORMATS:
            return GateSection(
                source,
                f"The gate file {source} has format {content.get('format')!r}; this "
                f"dtlab reads {', '.join(map(str, READABLE_FORMATS))}.",
                None,
            )
        return _section(source, content, matrix)
    return None


def _section(source: str, content: dict[str, Any], matrix: dict[str, Any]) -> GateSection:
    cells = len(matrix.get("cells") or [])
    before = f"before the {matrix.get('profile', '?')} matrix ({cells} cell{'' if cells == 1 else 's'})"
    if content.get("status") == "skipped":
        return GateSection(
            source,
            f"Skipped (--skip-gate) {before}, {content.get('started_at')}: the "
            "cluster was not checked, and no node was drained during the matrix.",
            None,
        )
    checks = content.get("checks") or []
    passed = sum(check.get("verdict") == "pass" for check in checks)
    summary = (
        f"Passed {before}, {content.get('started_at')}: {passed} checks of {content.get('cluster')} "
        f"in {content.get('seconds')} s: cluster.check's rows and the all-reduce below."
    )
    notes = _threshold_notes(content)
    for recheck in content.get("rechecks") or []:
        verdict = (
            "drained for the rest of the matrix: " + "; ".join(recheck.get("failures") or [])
            if recheck.get("drained")
            else "passed again and stayed in the matrix"
        )
        notes.append(
            f"{recheck.get('scope')} re-checked after {recheck.get('after_cell')} failed there: {verdict}."
        )
    return GateSection(source, summary, _allreduce_table(content), notes)


def _threshold_notes(content: dict[str, Any]) -> list[str]:
    """The clock and disk figures the gate judged, beside the inventory's limits."""
    thresholds = content.get("thresholds") or {}
    values: dict[str, list[float]] = {}
    for check in content.get("checks") or []:
        if isinstance(check.get("value"), int | float):
            values.setdefault(check.get("check"), []).append(check["value"])
    notes = []
    if values.get("clock skew"):
        worst = max(values["clock skew"], key=abs)
        notes.append(
            f"Clock offsets against the controller: at most {worst:+.2f} s "
            f"(limit ±{_number(thresholds.get('dtlab_max_clock_skew_s'))} s)."
        )
    if values.get("free disk"):
        notes.append(
            f"Free disk under the runs folder: at least {min(values['free disk']):.1f} GiB per node "
            f"(need {_number(thresholds.get('dtlab_min_free_disk_gb'))})."
        )
    return notes


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def _allreduce_table(content: dict[str, Any]) -> Table | None:
    allreduce = content.get("allreduce") or {}
    pairs = allreduce.get("pairs") or []
    if not pairs:
        return None
    thresholds = content.get("thresholds") or {}
    limit, need = thresholds.get(LATENCY_KEY), thresholds.get(BANDWIDTH_KEY)
    sizes = allreduce.get("message_bytes") or []
    rows = []
    for pair in pairs:
        latency, bandwidth = pair.get("latency_ms"), pair.get("bandwidth_mb_s")
        if pair.get("error"):
            verdict = f"not measured: {pair['error']}"
        else:
            ok = latency is not None and bandwidth is not None and latency <= limit and bandwidth >= need
            verdict = "ok" if ok else "failed"
        rows.append(
            [
                text("↔".join(pair.get("nodes") or [])),
                num(latency, "latency_ms"),
                num(limit, "latency_ms"),
                num(bandwidth, "bandwidth_mb_s"),
                num(need, "bandwidth_mb_s"),
                text(verdict),
            ]
        )
    return Table(
        GATE_TABLE_NUMBER,
        "table-b.6-gate-allreduce",
        f"Health gate: all-reduce between workers ({allreduce.get('backend')})",
        ["Pair", "Latency (ms)", "Limit (ms)", "Bandwidth (MB/s)", "Need (MB/s)", "Verdict"],
        rows,
        notes=[
            f"Latency: the median time of one all_reduce of {sizes[0] if sizes else '?'} bytes; bandwidth: "
            f"the algorithm bandwidth (bytes / time, as the NCCL tests define it) of "
            f"{sizes[-1] if sizes else '?'} bytes, median of {allreduce.get('iterations')} after a warm-up. "
            "Limits: the inventory's dtlab_max_allreduce_latency_ms and "
            "dtlab_min_allreduce_bandwidth_mb_s."
        ],
    )
