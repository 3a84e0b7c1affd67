"""`bench.export CELL --mlperf DIR`: one cell's runs laid out as MLPerf's result summarizer and compliance
checker read a submission (mlperf-logging, the pinned 4.1.x; docs/results-and-report.md, "MLPerf's log
format")::

    DIR/results/<system>/bert/result_<n>.txt      each run's MLPerf log (dtlab.results.mlperf_log), seed order
    DIR/systems/<system>.json                     the system description the summarizer reads
    DIR/compliance/training_4.1.0/common.yaml     MLPerf's training 4.1.0 rules plus the profile's target

The runs are those the report's scored-time table (B.7) scores: each seed's newest ok attempt of the
profile, undisturbed (not resumed, no fault plan), of the newest setup. Their logs are written again
from the stored results with the profile's target now (the report's), so that export and report agree
even where a run's own mlperf.log was recorded under another target.

The ruleset file is MLPerf's own way to add a benchmark's quality target (as its closed_<benchmark>.yaml
do): it enqueues the package's training_4.1.0/common.yaml, then asks that the run's last eval_accuracy
reach the target and that run_stop says success. Give it to the checker with --config, or give the
summarizer's scoring ``usage=<DIR>/compliance/training`` (MlperfExport.usage): it reads
``<usage>_<ruleset>/common.yaml``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from dtlab.errors import DtlabError
from dtlab.report.build import newest_setup_only, profile_target_accuracy
from dtlab.report.faults import is_faulted
from dtlab.results import ResultStore, Run, mlperf_log
from dtlab.results.records import newest_per_cell

_LAYOUT = ("results", "systems", "compliance")


@dataclass(frozen=True)
class MlperfExport:
    """What bench.export wrote: the folder, each run's result file, the system file and the ruleset."""

    root: Path
    system: str
    results: tuple[Path, ...]
    system_file: Path
    ruleset_file: Path
    target_accuracy: float | None
    missed_target: int

    @property
    def benchmark_dir(self) -> Path:
        return self.root / "results" / self.system / mlperf_log.BENCHMARK

    @property
    def usage(self) -> str:
        """The summarizer's ``usage`` that makes it read this export's ruleset file."""
        return str(self.ruleset_file.parent.parent / mlperf_log.USAGE)


def export_mlperf(store: ResultStore, cell: str, out: str | os.PathLike[str], *,
                  profile: str | None = None) -> MlperfExport:
    """Lay out `cell`'s runs (a cell key without its seed, e.g. ddp-g2-e20) under `out`. Every check comes
    first: a missing store, an unknown cell, an `out` that cannot be written or already holds an export
    raise DtlabError before anything is written."""
    root = Path(out)
    runs, chosen = _runs(store, cell, profile)
    _check_out(root)
    target = profile_target_accuracy(chosen)
    system = mlperf_log.system_name(runs[0].inventory, runs[0].cell)
    logs = [mlperf_log.log_text(run.result, system=system, target_accuracy=target) for run in runs]
    benchmark_dir = root / "results" / system / mlperf_log.BENCHMARK
    benchmark_dir.mkdir(parents=True)
    results = []
    for number, text in enumerate(logs):
        results.append(benchmark_dir / f"result_{number}.txt")
        results[-1].write_text(text)
    system_file = root / "systems" / f"{system}.json"
    system_file.parent.mkdir()
    system_file.write_text(json.dumps(system_description(system, runs), indent=2) + "\n")
    ruleset_file = root / "compliance" / f"{mlperf_log.USAGE}_{mlperf_log.RULESET}" / "common.yaml"
    ruleset_file.parent.mkdir(parents=True)
    ruleset_file.write_text(ruleset_text(target))
    missed = sum(not mlperf_log.reached_target(run.result, target) for run in runs)
    return MlperfExport(root, system, tuple(results), system_file, ruleset_file, target, missed)


def _runs(store: ResultStore, cell: str, profile: str | None) -> tuple[list[Run], str]:
    """The cell's runs as Table B.7 scores them, in seed order, and their profile."""
    if not store.db_path.is_file():
        raise DtlabError(f"bench.export: no results store at {store.root} (no {store.db_path.name}); "
                         "run `invoke bench.all` first, or give --results-dir")
    store.check(writable=False)
    ok = [run for run in store.runs("ok") if not is_faulted(run)]
    present = sorted({run.cell.profile for run in ok})
    if profile is not None and profile not in present:
        raise DtlabError(f"bench.export: --profile {profile} has no recorded runs in {store.root}; "
                         f"recorded profiles: {', '.join(present) or 'none'}")
    chosen = profile or (ok[-1].cell.profile if ok else None)
    newest = newest_per_cell(ok, chosen) if chosen else []
    unbroken = [run for run in newest if not run.result.get("resumed_from_epoch")]
    undisturbed, _other_setup = newest_setup_only(unbroken)
    runs = sorted((run for run in undisturbed if mlperf_log.cell_group(run.cell) == cell),
                  key=lambda run: run.cell.seed)
    if not runs:
        cells = sorted({mlperf_log.cell_group(r.cell) for r in undisturbed})
        raise DtlabError(f"bench.export: no undisturbed ok run of cell {cell} in profile {chosen} of "
                         f"{store.root}; cells: {', '.join(cells) or 'none'} (a cell is a key without its "
                         "seed, e.g. ddp-g2-e20)")
    return runs, chosen


def _check_out(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise DtlabError(f"bench.export: --mlperf {root} is a file, not a folder; give a folder")
    held = [part for part in _LAYOUT if (root / part).exists()]
    if held:
        raise DtlabError(f"bench.export: --mlperf {root} already holds an export ({', '.join(held)}); "
                         "give a new or empty folder")
    existing = next(folder for folder in (root, *root.absolute().parents) if folder.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise DtlabError(f"bench.export: --mlperf {root} cannot be written ({existing} is not a folder "
                         "this user can write); give a folder you can write")


def ruleset_text(target: float | None) -> str:
    """MLPerf's training rules for this package version, plus the profile's quality target. The target is
    checked in the END block: a later config's rules for a key (the package's run_stop) replace an
    earlier config's messages for that key, never an END block's."""
    lines = [
        "# Written by dtlab's bench.export: MLPerf's own training rules of this mlperf-logging (the",
        f"# package's {mlperf_log.USAGE}_{mlperf_log.RULESET}/common.yaml, enqueued below), plus the "
        "profile's quality target.",
        "- BEGIN:",
        f"    CODE: \"enqueue_config('{mlperf_log.USAGE}_{mlperf_log.RULESET}/common.yaml'); "
        "s.update(last_eval_accuracy=None, status=None)\"",
    ]
    if target is None:
        return "\n".join([*lines, "# No target_accuracy in the profile: every run counts.", ""])
    return "\n".join([
        *lines,
        "- KEY:",
        "    NAME: eval_accuracy",
        "    POST: \"s['last_eval_accuracy'] = v['value']\"",
        "- KEY:",
        "    NAME: run_stop",
        "    POST: \"s['status'] = v['metadata'].get('status')\"",
        f"# The run's final accuracy reaches the target ({mlperf_log.TARGET_KEY} in the log), and its",
        "# run_stop says success.",
        "- END:",
        "    CHECK:",
        f"        - \"s['last_eval_accuracy'] is not None and s['last_eval_accuracy'] >= {target!r}\"",
        "        - \"s['status'] == 'success'\"",
        "",
    ])


def system_description(system: str, runs: list[Run]) -> dict[str, object]:
    """The summarizer's system description, from what the runs recorded; what dtlab does not record is
    left empty."""
    result = runs[-1].result
    nodes = int(result["nodes"])
    gpus = int(result["gpus"])
    versions = result.get("versions") or {}
    unknown = ""
    return {
        "submitter": mlperf_log.ORG,
        "division": mlperf_log.DIVISION,
        "status": "Research, Development, or Internal (RDI)",
        "system_name": system,
        "number_of_nodes": nodes,
        "host_processors_per_node": 1,
        "host_processor_model_name": unknown,
        "host_processor_core_count": unknown,
        "host_processor_vcpu_count": unknown,
        "host_processor_frequency": unknown,
        "host_processor_caches": unknown,
        "host_processor_interconnect": unknown,
        "host_memory_capacity": unknown,
        "host_storage_type": unknown,
        "host_storage_capacity": unknown,
        "host_networking": unknown,
        "host_networking_topology": unknown,
        "host_memory_configuration": unknown,
        "accelerators_per_node": gpus // nodes if nodes else 0,
        "accelerator_model_name": unknown if gpus else "none (CPU workers)",
        "accelerator_host_interconnect": unknown,
        "accelerator_frequency": unknown,
        "accelerator_on-chip_memories": unknown,
        "accelerator_memory_configuration": unknown,
        "accelerator_memory_capacity": unknown,
        "accelerator_interconnect": unknown,
        "accelerator_interconnect_topology": unknown,
        "cooling": unknown,
        "hw_notes": f"dtlab cluster {runs[-1].inventory}; hosts {', '.join(result.get('hostnames') or [])}",
        "framework": f"{result['framework_label']}; torch {versions.get('torch', unknown)}",
        "other_software_stack": ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v),
        "operating_system": unknown,
        "sw_notes": f"dtlab {mlperf_log.cell_group(runs[-1].cell)}, profile {runs[-1].cell.profile}, "
                    f"{len(runs)} run(s); fields dtlab does not record are empty",
    }
