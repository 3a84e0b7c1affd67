"""Scenario C's search section (beyond the study, issue #54): each way of running one search plan beside
dtlab's plain sequential sweep (Table B.16). Shown only when a search cell is recorded.

A row is one way: (platform, workers, early stopping), over its seeds. Every way trained the same drawn
trials (dtlab/search.py) for the same budget, so the wall times differ by how the way schedules and stops
them; the plain sweep (ddp, no early stopping) at the same workers is the baseline each ratio is taken
against, with its min-max over the runs and "within noise" where the runs overlap. Whether each way found
the baseline's best trial is said seed by seed.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence

from dtlab import platforms
from dtlab.report.comparison_measures import Measure
from dtlab.report.numbers import mean_range, missing, num, text
from dtlab.report.strategies import ratio_cells
from dtlab.report.table_base import Table
from dtlab.results import Run

SearchKey = tuple[str, int, str]  # (framework, workers, early stopping)


def baseline() -> tuple[str, str]:
    """The plain sweep's way: the report's baseline platform's search without early stopping."""
    return platforms.BASELINE, "none"


def by_way(runs: Iterable[Run]) -> dict[SearchKey, list[Run]]:
    """The ok search runs grouped by way, the baseline first at each worker count, then by platform."""
    groups: dict[SearchKey, list[Run]] = defaultdict(list)
    for run in runs:
        if run.status == "ok" and run.cell.search and run.result:
            groups[(run.cell.framework, run.cell.gpus, run.cell.search)].append(run)

    def order(key: SearchKey) -> tuple:
        framework, gpus, stopping = key
        return gpus, (framework, stopping) != baseline(), framework, stopping

    return {key: sorted(groups[key], key=lambda run: run.cell.seed) for key in sorted(groups, key=order)}


def _best(run: Run) -> int | None:
    best = run.result.get("best")
    return None if best is None else int(best["number"]) + 1  # trials are numbered from 1 in the logs


def _best_trials(members: Sequence[Run], plain: Sequence[Run]) -> str:
    """Per seed: the best trial, and whether the plain sweep's run of that seed found the same one."""
    theirs = {run.cell.seed: _best(run) for run in plain}
    shown = []
    for run in members:
        found, expected = _best(run), theirs.get(run.cell.seed)
        same = " =" if found == expected else f" ≠ {expected}"
        mark = "" if expected is None or run in plain else same
        shown.append(f"s{run.cell.seed}: {found if found is not None else '—'}{mark}")
    return ", ".join(shown)


def search_table(runs: Iterable[Run]) -> Table | None:
    """Table B.16: every recorded way of running the search beside the plain sweep; None without one."""
    groups = by_way(runs)
    if not groups:
        return None
    rows = []
    for (framework, gpus, stopping), members in groups.items():
        plain = groups.get((baseline()[0], gpus, baseline()[1]), [])
        results = [run.result for run in members]
        walls = [float(r["wall_s"]) for r in results]
        is_baseline = (framework, stopping) == baseline()
        ratio = (text("1 (baseline)"), missing()) if is_baseline else ratio_cells(
            walls, [float(run.result["wall_s"]) for run in plain])
        best = [r["best"] for r in results if r.get("best")]
        counts = [r["counts"] for r in results]
        rows.append([
            text(members[-1].result["label"]),
            text(str(gpus)),
            text(stopping),
            text(str(len(members))),
            mean_range(walls, "time_s"),
            *ratio,
            mean_range([float(b["reached_s"]) for b in best], "time_s"),
            mean_range([float(b["val_accuracy"]) for b in best], "accuracy"),
            text(_best_trials(members, plain)),
            text(f"{sum(c['started'] for c in counts)} / {sum(c['stopped_early'] for c in counts)} / "
                 f"{sum(c['failed'] for c in counts)}"),
            num(statistics.fmean(float(r["busy_fraction"]) for r in results), "ratio"),
        ])
    plan = next(iter(groups.values()))[0].cell.task_plan
    return Table(
        "B.16",
        "table-b.16-search",
        "Scenario C: one hyperparameter search, each way beside the plain sweep (beyond the study)",
        ["Way", "Workers", "Early stopping", "Runs (seeds)", "Wall to the end (s)", "÷ plain sweep",
         "÷ plain sweep: min–max (n)", "To the best trial (s)", "Best accuracy", "Best trial per seed",
         "Trials started / stopped early / failed", "Busy fraction"],
        rows,
        [
            f"One plan: {len(plan.get('trials', ()))} trials drawn once from the profile's search space, "
            f"{plan.get('budget_epochs')} epochs at most each; ASHA's rungs at epochs "
            f"{', '.join(str(r) for r in _rungs(plan))} (reduction factor {plan.get('reduction_factor')}). "
            "Every way trains the same trials with the seed of its row's runs.",
            "Wall to the end: the way's own clock, from its launcher's start to its last trial's end; to the "
            "best trial: to the end of the best trial's last epoch. Each the mean over the seeds, (min–max) "
            "where two or more. ÷ plain sweep: the mean over the plain sweep's at the same workers; min–max: "
            "fastest over slowest and slowest over fastest run, then (n=…) the runs of each; \"within "
            "noise\": the runs overlap, so the spread does not support a difference.",
            "Best trial per seed: the trial (numbered from 1) with the highest last validation accuracy; "
            "= / ≠ N: the same as the plain sweep's best for that seed, or not (its best was N).",
            "Busy fraction: trial-seconds x workers per trial over the way's slots x its wall time. The "
            "sweep runs one trial at a time on every worker of the cell (DDP); Ray Tune runs as many "
            "one-worker trials at once as the cell has workers.",
            *_stand_in_notes(groups),
        ],
    )


def search_measures(runs: Iterable[Run]) -> dict[str, Measure]:
    """The verdict's search criterion per platform: its runs' wall time to the end with ASHA at the largest
    worker count any platform searched at (one value per seed), the mean with its min-max."""
    groups = {key: members for key, members in by_way(runs).items() if key[2] == "asha"}
    if not groups:
        return {}
    workers = max(gpus for _, gpus, _ in groups)
    found = {}
    for (framework, gpus, _), members in groups.items():
        if gpus == workers:
            found[framework] = Measure.of_runs(
                [float(run.result["wall_s"]) for run in members], "time_s", "s",
                f"{{mean}} s to the end of the plan, {workers} workers (B.16)")
    return found


def _rungs(plan: dict) -> list[int]:
    from trainer.search import rung_epochs

    if not {"grace_epochs", "budget_epochs", "reduction_factor"} <= set(plan):
        return []
    return rung_epochs(plan["grace_epochs"], plan["budget_epochs"], plan["reduction_factor"])


def stand_ins(runs: Iterable[Run]) -> dict[str, str]:
    """Per platform, the label of its search runs that is one of its stand-in labels (stand_in_labels)."""
    return {framework: members[-1].result["label"] for (framework, _, _), members in by_way(runs).items()
            if members[-1].result["label"].startswith(platforms.get(framework).stand_in_labels)}


def _stand_in_notes(groups: dict[SearchKey, list[Run]]) -> list[str]:
    """A row whose label is a stand-in's says so."""
    runs = [run for members in groups.values() for run in members]
    named = sorted(f"{platforms.label(framework)} ({label})" for framework, label in stand_ins(runs).items())
    if not named:
        return []
    return [f"Stand-in, not the platform itself: {'; '.join(named)}. Its row measures dtlab's ASHA sweep, "
            "not the platform's searcher; the searcher's own config is validated and kept with each run."]


__all__ = ["by_way", "search_measures", "search_table", "stand_ins"]
