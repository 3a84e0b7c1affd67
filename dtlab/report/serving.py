"""Scenario C's serving section (beyond the study, issue #54): each way of serving one trained checkpoint
beside the plain server (Table B.17). Shown only when a serve cell is recorded.

A row is one way at one load level: (platform, replicas, concurrency), over the seeds whose checkpoints it
served. Every way served the same checkpoint of each seed and answered the same reviews, so their
latencies differ by how the way serves; the plain server (the report's baseline platform's way) at the
same level is what each throughput ratio is taken against, with its min-max over the runs and "within
noise" where they overlap. An answer that is not the trainer's own is counted, never averaged away.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace

from dtlab import platforms
from dtlab.report.comparison_measures import Measure
from dtlab.report.numbers import mean_range, missing, text
from dtlab.report.strategies import ratio_cells
from dtlab.report.table_base import Table
from dtlab.results import Run

ServeKey = tuple[str, int]  # (framework, replicas)


def by_way(runs: Iterable[Run]) -> dict[ServeKey, list[Run]]:
    """The ok serve runs grouped by way, the baseline's first, then by platform; each by seed."""
    groups: dict[ServeKey, list[Run]] = defaultdict(list)
    for run in runs:
        if run.status == "ok" and run.cell.trained and run.result:
            groups[(run.cell.framework, int(run.result["replicas"]))].append(run)

    def order(key: ServeKey) -> tuple:
        return key[0] != platforms.BASELINE, key

    return {key: sorted(groups[key], key=lambda run: run.cell.seed) for key in sorted(groups, key=order)}


def _level(run: Run, concurrency: int) -> dict | None:
    return next((level for level in run.result["levels"] if level["concurrency"] == concurrency), None)


def serving_table(runs: Iterable[Run]) -> Table | None:
    """Table B.17: every recorded way of serving beside the plain server; None without one."""
    groups = by_way(runs)
    if not groups:
        return None
    rows = []
    for (framework, replicas), members in groups.items():
        plain = next((m for (f, _), m in groups.items() if f == platforms.BASELINE), [])
        levels = sorted({level["concurrency"] for run in members for level in run.result["levels"]})
        for concurrency in levels:
            mine = [lv for run in members if (lv := _level(run, concurrency))]
            theirs = [lv for run in plain if (lv := _level(run, concurrency))]
            throughput = [float(lv["throughput_rps"]) for lv in mine]
            ratio = (text("1 (baseline)"), missing()) if framework == platforms.BASELINE else ratio_cells(
                throughput, [float(lv["throughput_rps"]) for lv in theirs])
            answered = sum(lv["requests"] for lv in mine)
            rows.append([
                text(members[-1].result["label"]),
                text(str(replicas)),
                text(str(concurrency)),
                text(str(len(mine))),
                mean_range([float(lv["p50_ms"]) for lv in mine], "latency_ms"),
                mean_range([float(lv["p99_ms"]) for lv in mine], "latency_ms"),
                mean_range(throughput, "requests_per_s"),
                *ratio,
                text(f"{sum(lv['errors'] for lv in mine)} / {sum(lv['mismatches'] for lv in mine)} of "
                     f"{answered}"),
                mean_range([float(run.result["ready_s"]) for run in members], "time_s"),
            ])
    served = sorted({run.result["serves"] for members in groups.values() for run in members})
    return Table(
        "B.17",
        "table-b.17-serving",
        "Scenario C: one trained checkpoint served each way beside the plain server (beyond the study)",
        ["Way", "Replicas", "Concurrency", "Runs (seeds)", "p50 (ms)", "p99 (ms)", "Throughput (req/s)",
         "÷ plain server", "÷ plain server: min–max (n)", "Errors / wrong answers", "Ready after (s)"],
        rows,
        [
            f"Each seed's checkpoint ({', '.join(served)}) served by every way, on the workers; the load "
            "test on the controller sends one review a request, each level's requests over that many "
            "threads with a kept-alive connection to each server, alternating between the servers.",
            "p50, p99: nearest-rank latency of the answered requests; throughput: answered requests over "
            "the level's wall time. Each the mean over the seeds, (min–max) where two or more. ÷ plain "
            "server: throughput over the plain server's at the same concurrency; min–max: fastest over "
            "slowest and slowest over fastest run, then (n=…) the runs of each; \"within noise\": the "
            "runs overlap, so the spread does not support a difference.",
            "Errors: requests that failed, timed out or answered other than one label; wrong answers: a "
            "label other than the trainer's own evaluation of that review with the same checkpoint. "
            "Ready after: from the cell's start (the trainer's answers computed first) until every server "
            "answered.",
        ],
    )


def serving_measures(runs: Iterable[Run]) -> dict[str, Measure]:
    """The verdict's serving criterion per platform: p99 latency at the highest concurrency every way was
    loaded at (one value per seed), the mean with its min-max; a way with a wrong answer has none. A
    platform with no server of its own (no `server`: Determined, say) is deployed as its users deploy it,
    with the plain server, the baseline's way: it has the baseline's figure, and its text says so."""
    groups = by_way(runs)
    if not groups:
        return {}
    common = set.intersection(*({lv["concurrency"] for run in members for lv in run.result["levels"]}
                                for members in groups.values()))
    if not common:
        return {}
    concurrency = max(common)
    found = {}
    for (framework, _), members in groups.items():
        levels = [lv for run in members if (lv := _level(run, concurrency))]
        if any(lv["mismatches"] or lv["errors"] for lv in levels):
            found[framework] = Measure(None, f"wrong answers or errors at {concurrency} at once (B.17)")
            continue
        found[framework] = Measure.of_runs([float(lv["p99_ms"]) for lv in levels], "latency_ms", "ms",
                                           f"p99 {{mean}} ms at {concurrency} requests at once (B.17)")
    plain = found.get(platforms.BASELINE)
    if plain is not None and plain.measured:
        for platform in platforms.ALL:
            if not platform.server and platform.name not in found:
                found[platform.name] = replace(plain, borrowed_from=platforms.BASELINE,
                                               shown=f"{plain.shown}, by the plain server: {platform.label} "
                                                     "has no server of its own")
    return found


__all__ = ["by_way", "serving_measures", "serving_table"]
