"""The study's qualitative comparison (its section 5.5), measured on this cluster, and a recommendation
computed from it and the user's priorities (issue #28, items 4 and 5).

Table B.10 puts, per platform, what the study judged in words beside what this cluster measured: start-up
(Table B.3's clock), steady-state overhead (Table 5.9), fault-recovery cost (Table B.5), reproducibility
(the same seed's per-epoch accuracy against DDP's), the lines a user writes (the launchers, counted) and
the moving parts (services and ports, from inventory/group_vars/all.yml). Table B.11 ranks the platforms
on the criteria the user puts first (`bench.report --priorities`). A platform is ahead of another on a
noisy criterion only when the runs' min-max support it (aggregate.MIN_RUNS_FOR_SPREAD runs each, the
intervals apart); counts (lines, services, features) are exact and always order.

This module builds the tables and is the entry the rest of the report uses; the parts live beside it:
comparison_measures (the criteria, each platform's measures, the study's qualitative facts),
comparison_records (the provisioning and idle records) and recommendation (--priorities, Table B.11).
Their names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from dtlab.platforms import BASELINE
from dtlab.report.aggregate import GroupKey, GroupStats, Sample
from dtlab.report.comparison_measures import (
    CRITERIA,
    LAUNCHER_FILES,
    PLATFORM_ROLES,
    PLATFORMS,
    PORT_RANGES,
    RUN_FIGURES,
    TASK_CRITERIA,
    VARIABLE_PREFIXES,
    Comparison,
    Measure,
    MovingParts,
    _exact,
    _qualitative,
    _recovery,
    _reproducibility,
    _speed,
    _unattended,
    _whole_run,
    centralised_features,
    code_lines,
    comparison_count,
    in_pipelines,
    launcher_lines,
    moving_parts,
    per_run,
    startup,
    study_qualitative,
    upstream_text,
)
from dtlab.report.comparison_records import (
    IDLE_NOT_MEASURED_NOTE,
    NOT_MEASURED,
    PROVISION_NOT_MEASURED_NOTE,
    READABLE_RECORD_FORMATS,
    RECORD_SHAPES,
    cluster_measures,
    cluster_ranked,
    idle_use,
    provisioning_times,
    read_records,
    shared_roles,
    variable_platform,
)
from dtlab.report.data_paths import etl_not_measured
from dtlab.report.faults import FaultSection
from dtlab.report.numbers import fmt, text
from dtlab.report.recommendation import (
    LOWER_FIRST,
    Placed,
    Priorities,
    better,
    check_study_conclusion,
    parse_priorities,
    rank,
    recommendation_table,
    tiers,
    with_recommendation,
)
from dtlab.report.study import DISPLAY_NAMES, STUDY_SCALED_GPUS, STUDY_SHORT_EPOCHS, Published
from dtlab.report.tables import Table

# --- the study's Tables 5.10 and 5.11, and Table B.10 ------------------------------------------------


def study_tables() -> list[Table]:
    """The study's Tables 5.10 and 5.11 as published."""
    data = study_qualitative()
    names = [DISPLAY_NAMES[p] for p in data["platforms"]]
    setup = data["setup"]
    management = data["management"]
    return [
        Table(
            setup["table"],
            "table-5.10-setup",
            f"Setup complexity comparison (the study, section {setup['section']}, as published)",
            ["Aspect", *names],
            [[text(row["aspect"]), *(text(row[p]) for p in data["platforms"])] for row in setup["rows"]],
        ),
        Table(
            management["table"],
            "table-5.11-management",
            f"Cluster management features (the study, section {management['section']}, as published)",
            ["Feature", *names],
            [
                [text(row["feature"]), *(text(row[p]["text"]) for p in data["platforms"])]
                for row in management["rows"]
            ],
            [
                "The checklist criterion counts the cells the study describes as done by the platform "
                "itself (automatic, built-in, yes); it ranks only the study's own figures, never a "
                "cluster's runs."
            ],
        ),
    ]


COLUMNS = [
    "Platform",
    "Start-up: submit → first step",
    "Steady state: per epoch, overhead vs DDP",
    "Recovery from a fault: total / undisturbed",
    "Reproducible: per-epoch accuracy = DDP's (same seed)",
    "Lines a user writes",
    "Services",
    "Listening ports",
    "Centralised management (study)",
    "Data pipelines: own ETL, measured (the study's word)",
    "Provisioning time",
    "Idle memory / CPU per node",
    "Upstream",
]


def _table(
    platforms: list[str],
    measures: dict[str, dict[str, Measure]],
    parts: dict[str, MovingParts | None],
    title: str,
    notes: list[str],
    provisioning: Mapping[str, str] | None = None,
    idle: Mapping[str, str] | None = None,
) -> Table:
    """`provisioning` and `idle` None: not published (the study's figures)."""
    rows = []
    for p in platforms:
        moving = parts[p]
        rows.append(
            [
                text(DISPLAY_NAMES.get(p, p)),
                *(text(measures[c][p].shown) for c in ("startup", "speed", "recovery", "reproducibility")),
                text(measures["adoption"][p].shown),
                text(", ".join(moving.services) or "none") if moving else text("not published"),
                text(", ".join(moving.ports) or "none") if moving else text("not published"),
                text(measures["checklist"][p].shown),
                text(measures["pipelines"][p].shown),
                text(provisioning[p] if provisioning is not None else "not published"),
                text(idle[p] if idle is not None else "not published"),
                text(upstream_text(p)),
            ]
        )
    return Table("B.10", "table-b.10-comparison", title, COLUMNS, rows, notes)


COMPARISON_NOTE = (
    "Start-up: Table B.3's first two phases, per run. Steady state: the whole-run time per epoch of the "
    "short runs at the count every platform is compared at, and its overhead against DDP's with the min-max "
    "over runs (Table 5.9). Recovery from a fault: Table B.5's total over undisturbed time, per faulted run. "
    "Reproducible: each run's per-epoch validation accuracy against DDP's run with the same seed, count "
    "and epochs, compared exactly. Lines: the non-blank lines of code (comments and docstrings left out) "
    "of its launcher (Slurm: its driver; the sbatch options are dtlab.platforms.slurm's, not counted). "
    "Services and ports: the names inventory/group_vars/all.yml gives the platform (a port range counts "
    "once). The study's two columns are its Table 5.11 and section 5.6.4 (the study covers DDP, "
    "Determined and Spark only): shown beside the measured, never ranked on this cluster's runs; the data "
    "pipelines column leads with the platform's own ETL as Table B.13 measured it. "
    "Upstream: each platform's upstream_health (dtlab/platforms/<name>/), each fact with its source."
)


def build_comparison(
    groups: Mapping[GroupKey, GroupStats],
    samples: Iterable[Sample],
    faults: FaultSection | None,
    short: int | None,
    root: Path | None = None,
    etl: Mapping[str, str] | None = None,
    tasks: Mapping[str, Mapping[str, Measure]] | None = None,
) -> Comparison:
    """Table B.10 from this cluster's runs, and from the provisioning and idle records under `root` (its
    results folder); `etl`: each platform's own ETL as Table B.13 measured it (data_paths.etl_summaries);
    `tasks`: scenario C's criteria, {"search": each platform's search as Table B.16 measured it
    (search.search_measures), "serving": its serving as Table B.17 did (serving.serving_measures)}."""
    samples = list(samples)
    count = comparison_count(groups, short)
    measures: dict[str, dict[str, Measure]] = {c: {} for c in CRITERIA}
    parts = {}
    for p in PLATFORMS:
        key = (p, count, short)
        measures["startup"][p] = startup(samples, key) if count is not None else Measure(None, "no run")
        measures["speed"][p] = _speed(groups, key) if count is not None else Measure(None, "no run")
        measures["recovery"][p] = _recovery(faults, p)
        measures["reproducibility"][p] = _reproducibility(groups, p)
        lines = launcher_lines(p)
        measures["adoption"][p] = _exact(lines, f"{lines} ({', '.join(LAUNCHER_FILES[p])})")
        parts[p] = moving_parts(p)
        measures["footprint"][p] = _exact(parts[p].count, f"{parts[p].count}")
        measures["checklist"][p], study_pipelines = _qualitative(p)
        measured = (etl or {}).get(p) or etl_not_measured(p)  # never ranked: the study's word stays beside it
        measures["pipelines"][p] = Measure(None, f"{measured}; study: {study_pipelines.shown}")
        measures["whole_run"][p] = _whole_run(groups, key) if count is not None else Measure(None, "no run")
        measures["unattended"][p] = _unattended(faults, p)
        for criterion, what in TASK_CRITERIA.items():
            found = (tasks or {}).get(criterion, {}).get(p)
            measures[criterion][p] = found or Measure(None, f"no {what} run")
        for criterion in RUN_FIGURES:
            measures[criterion][p] = per_run(samples, key, criterion) if count is not None else Measure(
                None, "no run")
    for criterion, found in cluster_ranked(root).items():
        measures[criterion] = found
    at = f"{count} workers/GPUs, {short} epochs" if count is not None else "no runs"
    title = f"The study's qualitative comparison, measured on this cluster (at {at}; beyond the study)"
    provisioning, idle, notes = cluster_measures(root)
    table = _table(list(PLATFORMS), measures, parts, title, [COMPARISON_NOTE, *notes], provisioning, idle)
    ran = [p for p in PLATFORMS if any(f == p for f, _g, _e in groups)
           or any(p in found and not found[p].borrowed_from for found in (tasks or {}).values())]
    return Comparison(list(PLATFORMS), measures, table, ran=ran)


def build_study_comparison(pub: Published) -> Comparison:
    """Table B.10 from the study's published figures: speed from Table 5.9 at 2 GPUs, the rest as the
    study published it (not published, not tested)."""
    platforms = list(study_qualitative()["platforms"])
    measures: dict[str, dict[str, Measure]] = {c: {} for c in CRITERIA}
    for p in platforms:
        per_epoch = pub.per_epoch_s.get((p, STUDY_SCALED_GPUS, STUDY_SHORT_EPOCHS))
        pct = pub.overhead_pct.get((p, STUDY_SCALED_GPUS))
        overhead = "– (baseline)" if p == BASELINE else f"{fmt(pct, 'overhead_pct', sign=True)}% vs DDP"
        measures["speed"][p] = Measure(
            per_epoch, f"{fmt(per_epoch, 'per_epoch_s')} s/epoch, {overhead} (Table 5.9)", published=True
        )
        measures["startup"][p] = Measure(None, "not published (the study timed training only)")
        measures["recovery"][p] = Measure(None, "not tested in the study (section 5.5.2)")
        measures["reproducibility"][p] = Measure(None, "not published (per-epoch metrics per seed)")
        measures["adoption"][p] = Measure(None, "not published")
        measures["footprint"][p] = Measure(None, "not published")
        measures["checklist"][p], measures["pipelines"][p] = _qualitative(p, ranked=True)
        for criterion in ("whole_run", "unattended", "idle", "provisioning", *TASK_CRITERIA):
            measures[criterion][p] = Measure(None, "not published")
    title = (
        "The study's qualitative comparison, from its published figures (Table 5.9 at 2 GPUs, "
        "Tables 5.10-5.11, section 5.6.4)"
    )
    table = _table(platforms, measures, dict.fromkeys(platforms), title, [COMPARISON_NOTE])
    return Comparison(platforms, measures, table, study_tables())


__all__ = [
    "COLUMNS", "COMPARISON_NOTE", "CRITERIA", "IDLE_NOT_MEASURED_NOTE", "LAUNCHER_FILES", "LOWER_FIRST",
    "NOT_MEASURED", "PLATFORMS", "PLATFORM_ROLES", "PORT_RANGES", "PROVISION_NOT_MEASURED_NOTE",
    "READABLE_RECORD_FORMATS", "RECORD_SHAPES", "VARIABLE_PREFIXES", "Comparison",
    "Measure", "MovingParts", "Placed", "Priorities", "better", "build_comparison",
    "build_study_comparison", "centralised_features", "check_study_conclusion", "cluster_measures",
    "cluster_ranked",
    "code_lines", "comparison_count", "idle_use", "in_pipelines", "launcher_lines", "moving_parts",
    "parse_priorities", "provisioning_times", "rank", "read_records", "recommendation_table",
    "shared_roles", "startup", "study_qualitative", "study_tables", "tiers", "variable_platform",
    "with_recommendation",
]
