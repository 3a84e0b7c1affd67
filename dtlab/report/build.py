"""Assemble the report from the store: environment header, tables, figures, notes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dtlab.cell import DEFAULT_DATA_PATH
from dtlab.errors import DtlabError
from dtlab.report.aggregate import (
    GroupKey,
    GroupStats,
    Sample,
    group,
    in_study_tables,
    long_epochs,
    primary_epochs,
)
from dtlab.report.comparison import (
    Comparison,
    Priorities,
    build_comparison,
    build_study_comparison,
    check_study_conclusion,
    with_recommendation,
)
from dtlab.report.data_paths import data_paths_table, etl_summaries
from dtlab.report.efficiency import efficiency_table
from dtlab.report.faults import FaultSection, fault_section, is_faulted
from dtlab.report.gate import GateSection, gate_section
from dtlab.report.numbers import ROUNDING_RULE, STUDY_34_00_NOTE, Value, text
from dtlab.report.own_tables import resumed_costs
from dtlab.report.search import search_measures, search_table
from dtlab.report.search import stand_ins as search_stand_ins
from dtlab.report.serving import serving_measures, serving_table
from dtlab.report.step_profile import is_profiled, step_profile_table
from dtlab.report.strategies import SizePoint, any_other_strategy, size_lines, strategies_table
from dtlab.report.study import (
    DISPLAY_NAMES,
    FRAMEWORKS,
    STUDY_GPU,
    STUDY_LONG_EPOCHS,
    STUDY_RUNS_PER_FIGURE,
    STUDY_SHORT_EPOCHS,
    Published,
    published,
)
from dtlab.report.tables import (
    Table,
    TableBuilder,
    config_label,
    failures_table,
    known_setup_differences,
    resumed_table,
)
from dtlab.report.verdict import Verdict, build_verdict
from dtlab.results import ResultStore, Run, newest_per_cell, unreadable_reason
from trainer.config import GENERATED_DATASET, GENERATED_MODEL_PREFIX


class EmptyStoreError(DtlabError):
    """Nothing is recorded yet: `invoke bench.report` says so and exits 1 (there is no report to
    read); bench.all, which ends with a report, takes it as a note."""

    exit_code = 1


@dataclass
class Report:
    title: str
    generated_at: str
    store_root: str
    profile: str | None
    other_profiles: list[str]
    environment: list[tuple[str, str]]
    node_table: Table | None
    run_labels: list[tuple[str, str, int]]  # (framework label, what ran, run count)
    tables: list[Table]
    extra_tables: list[Table]
    groups: dict[tuple[str, int, int], GroupStats]
    short_epochs: int | None
    long_epochs: int | None
    notes: list[str] = field(default_factory=list)  # warnings shown under the header
    # One line per stored run the report could not read and left out, for the console (bench.report).
    left_out: list[str] = field(default_factory=list)
    rounding: list[str] = field(default_factory=list)  # the rounding rule and the study's exception
    figures: list[dict[str, Any]] = field(default_factory=list)  # filled by render: {"title", "png", "svg"}
    from_study: bool = False  # `bench.report --study`: "this cluster" is the study's published runs
    faults: FaultSection | None = None  # "Fault recovery", when faulted cells were run (any profile)
    gate: GateSection | None = None  # "Health gate": the newest gate before this profile's matrix
    target_accuracy: float | None = None  # the profile's target_accuracy (Table B.8, Figure B.3)
    disagreements: Table | None = None  # "Where this cluster disagrees with the study" (Table B.9)
    # The study's qualitative comparison measured here (Table B.10; --study: Tables 5.10-5.11 too) and,
    # with --priorities, the recommendation (Table B.11).
    comparison: Comparison | None = None
    # Figure B.4's lines: (strategy, platform, world size, epochs) -> its model sizes, smallest first.
    size_lines: dict[tuple[str, str, int, int], list[SizePoint]] = field(default_factory=dict)
    verdict: Verdict | None = None  # the first screen: one line per scenario (dtlab.report.verdict)

    def count_label(self, count: int) -> str:
        devices = {d for (_f, g, _e), s in self.groups.items() if g == count for d in s.devices}
        return config_label(count, devices.pop() if len(devices) == 1 else "cuda")


def choose_profile(ok_runs: list[Run], profile: str | None, searched: Iterable[str] = ()
                   ) -> tuple[str | None, list[str]]:
    """The profile to report: the one asked for, else that of the newest ok run (profiles never mix);
    an undisturbed run's, when there is one: faulted runs have their own section, from every profile, and
    so have search and serve runs (`searched`: their profiles, which may be asked for: --profile tune)."""
    present = sorted({run.cell.profile for run in ok_runs})
    if profile is not None:
        recorded = sorted(set(present) | set(searched))
        if recorded and profile not in recorded:
            raise DtlabError(
                f"bench.report: --profile {profile} has no recorded runs; recorded profiles: "
                f"{', '.join(recorded)}"
            )
        return profile, [p for p in present if p != profile]
    if not ok_runs:
        return None, []
    chosen = ([run for run in ok_runs if not is_faulted(run)] or ok_runs)[-1].cell.profile
    return chosen, [p for p in present if p != chosen]


def _join(values) -> str:
    values = sorted({str(v) for v in values if v not in (None, "")})
    return ", ".join(values) if values else "not recorded"


def _flatten(prefix: str, value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        flat = {}
        for key, inner in value.items():
            flat |= _flatten(f"{prefix}.{key}" if prefix else str(key), inner)
        return flat
    return {prefix: str(value)}


def node_versions_table(runs: list[Run]) -> Table | None:
    """Node x version table from what the harness recorded per node (newest run wins)."""
    per_node: dict[str, dict[str, str]] = {}
    for run in runs:
        for node, versions in run.node_versions.items():
            per_node[node] = (
                _flatten("", versions) if isinstance(versions, dict) else {"version": str(versions)}
            )
    if not per_node:
        return None
    keys = sorted({k for versions in per_node.values() for k in versions})
    rows = [
        [text(node)] + [text(versions.get(k, "—")) for k in keys]
        for node, versions in sorted(per_node.items())
    ]
    return Table(
        "E.1", "table-e.1-nodes", "Node versions (as recorded by the harness)", ["Node", *keys], rows
    )


def environment(ok_runs: list[Run], all_runs: list[Run], pub: Published) -> list[tuple[str, str]]:
    results = [run.result for run in ok_runs if run.result]
    hostnames = {h for r in results for h in r["hostnames"]}
    devices = Counter(r["device"] for r in results)
    gpu_counts = sorted({r["gpus"] for r in results if r["device"] == "cuda"})
    worker_counts = sorted({r["world_size"] for r in results if r["device"] == "cpu"})
    hardware = []
    if gpu_counts:
        hardware.append(f"GPUs per run: {', '.join(map(str, gpu_counts))}")
    if worker_counts:
        hardware.append(
            f"CPU workers per run: {', '.join(map(str, worker_counts))} (one thread each, no GPU)"
        )
    driver = {
        v
        for run in ok_runs
        for node in run.node_versions.values()
        if isinstance(node, dict)
        for k, v in _flatten("", node).items()
        if "driver" in k.lower()
    }
    cuda = {r["versions"].get("cuda") for r in results}
    hyper = {tuple(sorted(r["hyperparameters"].items())) for r in results}
    recorded = sorted(run.recorded_at for run in all_runs)
    source = pub.source
    return [
        ("Inventory", _join(run.inventory for run in all_runs)),
        ("dtlab revision", _join(run.git_rev for run in all_runs)),
        ("Nodes", f"{len(hostnames)}: {_join(hostnames)}" if hostnames else "not recorded"),
        (
            "Devices",
            "; ".join([*(f"{n} run(s) on {d}" for d, n in sorted(devices.items())), *hardware])
            or "no successful runs",
        ),
        ("Driver / CUDA", f"driver {_join(driver)} / CUDA {_join(cuda)}"),
        (
            "Python / torch / transformers",
            " / ".join(
                _join(r["versions"].get(k) for r in results) for k in ("python", "torch", "transformers")
            ),
        ),
        ("NCCL", _join(r["versions"].get("nccl") for r in results)),
        (
            "Hyperparameters",
            "; ".join(", ".join(f"{k}={v}" for k, v in h) for h in sorted(hyper)) or "not recorded",
        ),
        ("Recorded", f"{recorded[0]} to {recorded[-1]}" if recorded else "nothing"),
        (
            "Study",
            f'{source["author"]}, "{source["title"]}", {source["kind"]}, {source["date"]}; '
            f"chapter {source['chapter']} (3 nodes, {STUDY_GPU} each, CUDA 12.2, NCCL)",
        ),
    ]


def incomparable_with_study(runs: list[Run]) -> str | None:
    """Why these runs cannot be set against the study's (GPUs, IMDB, a pretrained bert-tiny), or None."""
    results = [run.result for run in runs if run.result]
    reasons = []
    if any(result["device"] != "cuda" for result in results):
        reasons.append("this cluster's runs are on CPU, the study's on GPUs")
    hyperparameters = [result["hyperparameters"] for result in results]
    if any(h["dataset"] == GENERATED_DATASET for h in hyperparameters):
        reasons.append("they train on generated reviews, the study on IMDB")
    if any(h["model"].startswith(GENERATED_MODEL_PREFIX) for h in hyperparameters):
        reasons.append("from a randomly initialised model, the study from pretrained bert-tiny")
    return "; ".join(reasons) if reasons else None


def coverage_notes(profile: str | None, all_runs: list[Run], ok_runs: list[Run]) -> list[str]:
    """What the tables lack: cells whose latest attempt failed, and cells of the profile (as the matrix
    file declares it now) with no successful run at all. Faulted cells are the fault section's."""
    latest: dict[str, Run] = {}
    for run in sorted(all_runs, key=lambda run: run.attempt):
        if profile is None or run.cell.profile == profile:
            latest[run.cell_key] = run
    notes = []
    failed_last = sorted(key for key, run in latest.items() if run.status == "failed")
    if failed_last:
        notes.append(f"Cells whose last attempt failed (Table B.2 says why): {', '.join(failed_last)}.")
    if profile is not None:
        from dtlab import matrix

        try:
            declared = {cell.key for cell in matrix.load(profile).cells if not cell.fault}
        except DtlabError:  # a profile the matrix file no longer declares: nothing to compare with
            declared = set()
        missing = sorted(declared - {run.cell_key for run in ok_runs})
        if missing:
            notes.append(f"Cells of profile {profile} with no successful run yet: {', '.join(missing)}.")
    return notes


def profile_target_accuracy(profile: str | None) -> float | None:
    """The reported profile's target_accuracy in the matrix file (None: not set, or not declared)."""
    if profile is None:
        return None
    from dtlab import matrix

    try:
        return matrix.load(profile).target_accuracy
    except DtlabError:  # a profile the matrix file no longer declares: no target to score against
        return None


def study_tables(builder: TableBuilder) -> list[Table]:
    """Tables 5.1-5.9, in the study's order."""
    tables = [builder.run_table(f) for f in builder.frameworks() if f in FRAMEWORKS]
    return tables + [
        builder.table_5_4(),
        builder.accuracy_table("5.5", builder.short, STUDY_SHORT_EPOCHS),
        builder.accuracy_table("5.6", builder.long, STUDY_LONG_EPOCHS),
        builder.table_5_7(),
        builder.table_5_8(),
        builder.table_5_9(),
    ]


def published_groups(pub: Published) -> dict[GroupKey, GroupStats]:
    """The study's runs as group statistics, holding only what it published: mean time and accuracy
    and the number of seeds behind them. Std, throughput, GPU utilisation, memory and the per-epoch
    curve were not published and stay missing."""
    return {
        (framework, gpus, epochs): GroupStats(
            framework=framework, gpus=gpus, epochs=epochs, n=STUDY_RUNS_PER_FIGURE[epochs],
            time_mean=time_s, time_std=None, accuracy_mean=accuracy, accuracy_std=None,
            samples_per_s_mean=None, samples_per_s_std=None, gpu_util_mean=None, peak_rss_mb_mean=None,
            harness_extra_s_mean=None, labels=(), devices=(pub.device,), seeds=(),
        )
        for (framework, gpus, epochs), (time_s, accuracy) in pub.runs.items()
    }


def build_study_report(priorities: Priorities | None = None) -> Report:
    """`bench.report --study`: the study's published runs through the same derivation as a cluster's
    runs, beside the figures the study prints from them. Every derived figure must match, except the
    documented misprint; tables beyond the study are left out (it published none of their inputs)."""
    pub = published()
    groups = published_groups(pub)
    builder = TableBuilder(groups, pub, short=STUDY_SHORT_EPOCHS, long=STUDY_LONG_EPOCHS)
    comparison = with_recommendation(build_study_comparison(pub), priorities)
    comparison.conclusion_checks = check_study_conclusion(comparison)
    source = pub.source
    runs: Counter[tuple[str, str]] = Counter()
    for (framework, gpus, _epochs), stats in groups.items():
        runs[(DISPLAY_NAMES[framework], config_label(gpus, pub.device))] += stats.n
    return Report(
        title="dtlab report: the study's published runs",
        store_root="dtlab/data/study_results.yaml (the study's Tables 5.1-5.3)",
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        profile="study",
        other_profiles=[],
        environment=[
            ("Source", f'{source["author"]}, "{source["title"]}", {source["kind"]}, {source["date"]}; '
                       f"chapter {source['chapter']}"),
            ("Cluster", f"3 KVM VMs, one {STUDY_GPU} each; driver 535.247.01, CUDA 12.2, NCCL"),
            ("Runs", "each 20-epoch figure the mean of 5 seeds, each 100-epoch figure one run"),
        ],
        node_table=None,
        run_labels=[(f"{name} (as published)", config, n) for (name, config), n in sorted(runs.items())],
        tables=study_tables(builder),
        extra_tables=[],
        groups=groups,
        short_epochs=STUDY_SHORT_EPOCHS,
        long_epochs=STUDY_LONG_EPOCHS,
        notes=[
            "The \"this cluster\" columns are the study's own published runs, derived by dtlab: every "
            "derived figure should equal the study's, and the Study check notes under a table name any "
            "that does not. Spread over seeds, throughput, GPU utilisation and memory were not published "
            "and are missing (—); the tables beyond the study are left out.",
        ],
        rounding=[ROUNDING_RULE, STUDY_34_00_NOTE],
        from_study=True,
        comparison=comparison,
    )


def build_report(
    store: ResultStore, *, profile: str | None = None, priorities: Priorities | None = None
) -> Report:
    """Read the store and build every table; raises EmptyStoreError when nothing is recorded."""
    store.check(writable=False)
    recorded = store.runs(status=None)
    if not recorded:
        raise EmptyStoreError(
            f"bench.report: no recorded runs in {store.root}; "
            "run `invoke bench.all` (or bench.run) first, then `invoke bench.report`"
        )
    # Search and serve cells (scenario C) are measured in their own tables, from every profile, never in a
    # training table: their result is a search's or a server's, not a run's.
    search_runs = newest_per_cell(run for run in recorded if run.cell.search)
    serve_runs = newest_per_cell(run for run in recorded if run.cell.trained)
    task_tables = [table for table in (search_table(search_runs), serving_table(serve_runs)) if table]
    recorded = [run for run in recorded if not (run.cell.search or run.cell.trained)]
    # A stored result that lacks a field (an older or damaged row) is named in the header and left out;
    # it never stops the report. Its raw files stay in runs/ as recorded.
    unreadable = [(run, reason) for run in recorded if (reason := unreadable_reason(run))]
    left_out = {run.id for run, _ in unreadable}
    all_runs = [run for run in recorded if run.id not in left_out]
    readable_ok = [run for run in all_runs if run.status == "ok"]
    chosen, others = choose_profile(readable_ok, profile,
                                    {run.cell.profile for run in (*search_runs, *serve_runs)})
    # A faulted cell's runs (its injected failures too) are measured in their own section, never in the
    # study's tables, B.2 or B.4: their time is the fault's. Their undisturbed twins are ordinary cells.
    faults = fault_section(all_runs)
    study_runs = [run for run in all_runs if not is_faulted(run)]
    newest_ok = newest_per_cell(readable_ok, chosen) if chosen is not None else []
    ok_runs = [run for run in newest_ok if not is_faulted(run)]
    failed = [
        run for run in study_runs if run.status == "failed" and (chosen is None or run.cell.profile == chosen)
    ]
    pub = published()
    # A resumed run's time misses what the interruption cost (the lost epochs, the restart): only
    # undisturbed runs go into the tables and the figure, and the notes name the ones left out.
    resumed = [run for run in ok_runs if run.result.get("resumed_from_epoch")]
    # A profiled run's steps carry the profiler's cost: Table B.15 alone, never a timed table.
    profiled = [run for run in ok_runs if is_profiled(run.result)]
    undisturbed, other_setup = newest_setup_only(
        [run for run in ok_runs if not run.result.get("resumed_from_epoch") and not is_profiled(run.result)])
    samples = [Sample.from_run(run) for run in undisturbed]
    in_study = [in_study_tables(run.cell) for run in undisturbed]
    # The study's tables compare the platforms at the default strategy (ddp) on the profile's model through
    # the DataLoader, as the study ran them; other strategies, a run's models: and the platforms' own ETL
    # are set beside it in their own tables (B.12, B.13) and figure (B.4), never in these means.
    study_samples = [s for s, kept in zip(samples, in_study, strict=True) if kept]
    study_undisturbed = [run for run, kept in zip(undisturbed, in_study, strict=True) if kept]
    groups = group(study_samples)
    short = primary_epochs(k[2] for k in groups)
    long = long_epochs((k[2] for k in groups), short)
    incomparable = incomparable_with_study(study_undisturbed)
    builder = TableBuilder(groups, pub, short=short, long=long, incomparable=incomparable)
    tables = study_tables(builder)
    target_accuracy = profile_target_accuracy(chosen)
    extra = [
        builder.throughput_table(),
        builder.whole_run_table(),
        builder.scored_table(target_accuracy),
        builder.time_to_target_table(target_accuracy, chosen),
    ]
    if any_other_strategy(samples):
        extra.append(strategies_table(samples))
    if any(s.data_path != DEFAULT_DATA_PATH for s in samples):
        extra.append(data_paths_table(samples))
    efficiency = efficiency_table([(run.cell.framework, run.cell.gpus, run.cell.epochs, run.result)
                                   for run in study_undisturbed])
    if efficiency is not None:
        extra.append(efficiency)
    if profiled:
        extra.append(step_profile_table([(run.cell.framework, run.cell.gpus, run.result)
                                         for run in profiled]))
    extra += task_tables
    if failed:
        extra.append(failures_table(failed, ok_runs))
    if resumed:
        extra.append(resumed_table(resumed_costs(resumed, study_runs, groups)))
    labels = Counter(
        (run.result["framework_label"], config_label(run.cell.gpus, run.result["device"]))
        for run in undisturbed
    )
    notes = []
    if unreadable:
        named = "; ".join(f"{run.cell_key} attempt {run.attempt} ({reason})" for run, reason in unreadable)
        notes.append(f"Unreadable recorded run(s), left out of every table: {named}.")
    if not ok_runs:
        notes.append("No successful runs are recorded yet: only the study's figures are shown."
                     if faults is None else
                     "No successful undisturbed runs are recorded yet: only the study's figures are shown "
                     "(faulted runs: see Fault recovery).")
    notes += coverage_notes(chosen, study_runs, ok_runs)
    if incomparable:
        notes.append(f"This/study ratios are left out (—): {incomparable}.")
    if resumed:
        notes.append(f"Left out of the tables and the figure: runs resumed from a checkpoint, whose time "
                     f"misses what the interruption cost ({', '.join(sorted(r.cell_key for r in resumed))}); "
                     "Table B.4 shows their whole cost.")
    if other_setup:
        named = ", ".join(f"{run.cell_key} ({run.result['framework_label']})" for run in other_setup)
        notes.append(f"Left out of every table: runs recorded with another setup than their group's newest "
                      f"runs, so that no mean mixes a platform's default setup with another: {named}.")
    if short is not None and short != 20:
        notes.append(
            f"This cluster's short runs have {short} epochs, the study's 20: whole-run times are "
            "not comparable across the two (per-epoch times and ratios are)."
        )
    etl = etl_summaries(samples)
    tasks = {"search": search_measures(search_runs), "serving": serving_measures(serve_runs)}
    comparison = with_recommendation(build_comparison(groups, study_samples, faults, short, store.root, etl,
                                                      tasks), priorities)
    return Report(
        title=f"dtlab report: {_join(run.inventory for run in all_runs)}",
        size_lines=size_lines(samples),
        store_root=str(store.root),
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        profile=chosen,
        other_profiles=others,
        environment=environment(ok_runs, all_runs, pub),
        node_table=node_versions_table(all_runs),
        run_labels=[(label, config, n) for (label, config), n in sorted(labels.items())],
        tables=tables,
        extra_tables=extra,
        groups=groups,
        short_epochs=short,
        long_epochs=long,
        notes=notes,
        left_out=[f"run {run.id} ({run.cell_key} attempt {run.attempt}): {why}" for run, why in unreadable],
        rounding=[ROUNDING_RULE, STUDY_34_00_NOTE],
        faults=faults,
        gate=gate_section(store.root, chosen),
        target_accuracy=target_accuracy,
        disagreements=builder.disagreement_table(
            known_setup_differences(study_undisturbed, short, pub.device)),
        comparison=comparison,
        # What each profile took here counts its search and serve cells too.
        verdict=build_verdict(comparison, groups, [*all_runs, *search_runs, *serve_runs], priorities,
                              search_stand_ins=search_stand_ins(search_runs)),
    )


def newest_setup_only(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """(kept, left out): in each group of runs (framework, GPUs, epochs, strategy, model, data path), the
    runs whose framework_label is the newest run's. The label names the setup (the launcher, and options
    beyond the study's protocol such as ' + DDP static graph'), so a profile's runs from before and after a
    change of its trainer options never share a mean (a partly rerun matrix would otherwise mix them)."""
    def group_of(run: Run) -> tuple:
        return run.cell.framework, run.cell.gpus, run.cell.epochs, run.cell.strategy, run.cell.model, \
            run.cell.data_path

    newest_label = {group_of(run): run.result["framework_label"] for run in sorted(runs, key=lambda r: r.id)}
    kept = [run for run in runs if run.result["framework_label"] == newest_label[group_of(run)]]
    return kept, [run for run in runs if run.result["framework_label"] != newest_label[group_of(run)]]


__all__ = ["EmptyStoreError", "Report", "Value", "build_report", "build_study_report", "choose_profile"]
