"""What Table B.10 measures per platform: the criteria, what each platform module says about itself, the
study's qualitative facts (dtlab/data/study_qualitative.yml), what is computed from the repository (the
lines a user writes, the moving parts) and each measure from the runs; Comparison holds them."""

from __future__ import annotations

import ast
import io
import statistics
import tokenize
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dtlab import platforms
from dtlab.paths import INVENTORY_DIR, REPO_ROOT
from dtlab.platforms import BASELINE
from dtlab.report.aggregate import GroupKey, GroupStats, Sample
from dtlab.report.faults import FaultSection
from dtlab.report.numbers import fmt
from dtlab.report.study import DISPLAY_NAMES
from dtlab.report.tables import Table
from dtlab.roles import all_defaults

# Every registered platform (dtlab/platforms/: one module each), the study's three first. What each
# module says about itself, as the comparison reads it:
# - launcher_files: what the user writes to run the training core on it (the trainer's own code is the
#   same for all; Slurm's is the driver that submits and follows the job, the sbatch options are dtlab's);
# - variable_prefixes: which group_vars names are its own (dtlab_doctor_port is the health gate's, no
#   platform's; tests/report/test_comparison.py checks every unit cluster.check looks for falls to one);
# - roles: which of site.yml's roles provision it, for the provisioning time (a role's time includes
#   the roles it imports: dtlab.provision.play_roles). Every other role (common, ssh, firewall, nvidia,
#   docker, trainer) and the tasks outside roles serve all platforms: "shared". DDP has none of its own:
#   torchrun runs from the trainer venv every platform uses. tests/report/test_comparison.py checks a
#   new stage of site.yml is some platform's or named as shared;
# - port_ranges: (first, last) variables counted as one listening entry, shown as a range.
PLATFORMS = tuple(DISPLAY_NAMES)
LAUNCHER_FILES = {p.name: p.launcher_files for p in platforms.ALL}
VARIABLE_PREFIXES = {p.name: p.variable_prefixes for p in platforms.ALL}
PLATFORM_ROLES = {p.name: p.roles for p in platforms.ALL}
PORT_RANGES = {p.name: p.port_ranges[0] for p in platforms.ALL if p.port_ranges}


# name -> (what it ranks on, which way is better). Every one is measured on this cluster (its runs, its
# records, or the repository dtlab deploys) but checklist and pipelines, the study's words: shown beside
# the measured, ranked only in the study's own report (bench.report --study).
# Scenario C's criteria, each from its own cells (search.search_measures, serving.serving_measures):
# {criterion: what a platform with none has no run of}.
TASK_CRITERIA = {"search": "search", "serving": "serve"}
CRITERIA = {
    "speed": "steady-state per-epoch time (Table 5.9), faster first",
    "whole_run": "the whole run, submit to result recorded, start-up included (Table B.3), faster first",
    "startup": "submit → first step (Table B.3), faster first",
    "recovery": "fault recovery: recovered first, then total / undisturbed time (Table B.5), lower first",
    "unattended": "recovery without a person: every fault run recovered within its first attempt first",
    "reproducibility": "per-epoch validation accuracy equal to DDP's for the same seed first",
    "adoption": "lines a user writes (its launcher's non-blank, non-comment lines), fewer first",
    "footprint": "services and listening ports it adds (moving parts), fewer first",
    "idle": "idle memory of its services, summed over the nodes (cluster.idle), less first",
    "provisioning": "its roles' seconds in a first site.yml converge (cluster.provision), fewer first",
    "mfu": "model FLOPs utilization of its runs (Table B.14), higher first",
    "energy": "joules per run, GPUs by NVML and CPU packages by RAPL (Table B.14), less first",
    "cost": "cost per run, node_cost_per_hour x the whole run (Table B.14), less first",
    "search": "scenario C's search: one plan of trials with ASHA's early stopping, start to end "
              "(Table B.16), faster first",
    "serving": "scenario C's serving: p99 latency of one trained checkpoint's server at the highest load "
               "(Table B.17), lower first",
    "checklist": "centralised management features (the study's Table 5.11; not measured here), more first",
    "pipelines": "training inside a data pipeline (the study's section 5.6.4; not measured here) first",
}
# The study's words, not dtlab's measurements: never ranked on a cluster's runs.
STUDY_ONLY = ("checklist", "pipelines")


# --- the study's qualitative facts -----------------------------------------------------------------


@cache
def study_qualitative() -> dict[str, Any]:
    return yaml.safe_load(resources.files("dtlab").joinpath("data/study_qualitative.yml").read_text())


def centralised_features(platform: str) -> int | None:
    data = study_qualitative()
    if platform not in data["platforms"]:
        return None
    return sum(bool(row[platform]["centralised"]) for row in data["management"]["rows"])


def in_pipelines(platform: str) -> bool | None:
    return study_qualitative()["pipelines"].get(platform)


# --- what is computed from the repository ----------------------------------------------------------


def code_lines(source: str) -> int:
    """Non-blank lines that hold code: comments and docstrings left out."""
    tree = ast.parse(source)
    docstring_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                docstring_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    skipped = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    }
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstring_lines)


def launcher_lines(platform: str, root: Path = REPO_ROOT) -> int:
    return sum(code_lines((root / path).read_text()) for path in LAUNCHER_FILES[platform])


@dataclass(frozen=True)
class MovingParts:
    services: tuple[str, ...]  # systemd unit names
    ports: tuple[str, ...]  # "7077", "10002–10999"

    @property
    def count(self) -> int:
        return len(self.services) + len(self.ports)


def moving_parts(platform: str, group_vars: Mapping[str, Any] | None = None) -> MovingParts:
    """The services and listening ports the inventory names for the platform: inventory/group_vars/all.yml
    over the roles' defaults, as every host reads them (a unit one role runs is named in its defaults)."""
    if group_vars is None:
        site = yaml.safe_load((INVENTORY_DIR / "group_vars" / "all.yml").read_text())
        group_vars = {**site, **{key: value for key, value in all_defaults().items() if key not in site}}
    mine = [k for k in group_vars if k.startswith(VARIABLE_PREFIXES[platform])]
    ranged = PORT_RANGES.get(platform)
    ports = [str(group_vars[k]) for k in mine if k.endswith("_port") and (not ranged or k not in ranged)]
    if ranged:
        ports.append(f"{group_vars[ranged[0]]}–{group_vars[ranged[1]]}")
    # By variable name: the same order whichever file (the site's or a role's defaults) names a unit.
    services = [str(group_vars[k]) for k in sorted(mine) if k.endswith("_service")]
    return MovingParts(tuple(services), tuple(ports))


# --- measures ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measure:
    """One platform's figure on one criterion. `values` are the runs behind it (min-max, n); empty with a
    value for an exact count or a published mean; `value` None when not measured."""

    value: float | None
    shown: str
    values: tuple[float, ...] = ()
    exact: bool = False  # a count or a yes/no: any difference orders
    published: bool = False  # the study's printed mean: spread not published
    runs: int | None = None  # the runs an exact yes/no rests on (same-seed runs, fault runs); None: none
    # Another platform whose runs stand for this one's (the plain server's, for a platform with no server of
    # its own): the figure is the platform's, the runs are not, so it does not put it among those that ran.
    borrowed_from: str | None = None

    @property
    def measured(self) -> bool:
        return self.value is not None

    @property
    def n(self) -> int | None:
        """The runs (or probes, or converges) behind it; None for a count from the repository."""
        return len(self.values) if self.values else self.runs

    @classmethod
    def of_runs(cls, values: Sequence[float], quantity: str, unit: str, shown: str) -> Measure:
        """The runs' mean, shown as `shown` (its {mean} the rounded mean), then their min-max and n."""
        mean = statistics.fmean(values)
        spread = _interval_text(values, quantity, f" {unit}")
        return cls(mean, f"{shown.format(mean=fmt(mean, quantity))}; {spread}", tuple(values))


def _interval_text(values: Sequence[float], quantity: str, suffix: str = "") -> str:
    n = len(values)
    if n <= 1:
        return f"1 run, no spread (n={n})"
    return f"{fmt(min(values), quantity)}–{fmt(max(values), quantity)}{suffix} (n={n})"


@dataclass
class Comparison:
    """Table B.10 as data: per platform, per criterion, the measure; plus the table itself."""

    platforms: list[str]
    measures: dict[str, dict[str, Measure]]  # criterion -> platform -> Measure
    table: Table
    study_tables: list[Table] = field(default_factory=list)
    recommendation: Table | None = None
    conclusion_checks: list[str] = field(default_factory=list)
    ran: list[str] | None = None  # the platforms with runs here (None: all of `platforms`)

    @property
    def ranked_field(self) -> list[str]:
        """The platforms a ranking orders: those that ran here; the rest are named, never placed."""
        return [p for p in self.platforms if self.ran is None or p in self.ran]


def comparison_count(groups: Mapping[GroupKey, GroupStats], short: int | None) -> int | None:
    """The count every platform is compared at: the largest at which DDP ran the short runs, else the
    largest any platform did."""
    ddp = [g for f, g, e in groups if e == short and f == BASELINE]
    counts = ddp or [g for _f, g, e in groups if e == short]
    return max(counts) if counts else None


def startup(samples: Iterable[Sample], key: GroupKey) -> Measure:
    """Submit → first step (Table B.3's first two phases) of each run of the group `key` that has them."""
    mine = [s for s in samples if (s.framework, s.gpus, s.epochs) == key]
    values = tuple(s.startup_s for s in mine if s.startup_s is not None)
    if not values:
        return Measure(None, "no whole-run clock recorded" if mine else "no run")
    mean = sum(values) / len(values)
    return Measure(mean, f"{fmt(mean, 'time_s')} s; {_interval_text(values, 'time_s', ' s')}", values)


def per_run(samples: Iterable[Sample], key: GroupKey, criterion: str) -> Measure:
    """Table B.14's figure (mfu, energy or cost) of each run of the group `key` that has it."""
    mine = [s for s in samples if (s.framework, s.gpus, s.epochs) == key]
    values = tuple(v for s in mine if (v := getattr(s, RUN_FIGURES[criterion][0])) is not None)
    if not values:
        return Measure(None, f"not measured ({RUN_FIGURES[criterion][2]})" if mine else "no run")
    quantity, scale = RUN_FIGURES[criterion][1], 100 if criterion == "mfu" else 1
    shown = [f"{v * scale:.{2 if criterion == 'mfu' else 1}f}" for v in (sum(values) / len(values),
                                                                       min(values), max(values))]
    unit = "%" if criterion == "mfu" else f" {quantity}"
    spread = f"{shown[1]}–{shown[2]}{unit} (n={len(values)})" if len(values) > 1 else \
        f"1 run, no spread (n={len(values)})"
    return Measure(sum(values) / len(values), f"{shown[0]}{unit}; {spread}", values)


# criterion -> (Sample's field, its unit, what a run without it lacks)
RUN_FIGURES = {
    "mfu": ("mfu", "", "no model FLOPs or peak recorded"),
    "energy": ("energy_j", "J", "no NVML GPU or RAPL counter on the nodes"),
    "cost": ("cost", "per run", "no node_cost_per_hour in the inventory"),
}


def _speed(groups: Mapping[GroupKey, GroupStats], key: GroupKey) -> Measure:
    stats = groups.get(key)
    if stats is None:
        return Measure(None, "no run")
    framework, gpus, epochs = key
    per_epoch = tuple(t / epochs for t in stats.times)
    ddp = groups.get((BASELINE, gpus, epochs))
    if framework == BASELINE:
        overhead = "– (baseline)"
    elif ddp is None:
        overhead = "no DDP run"
    else:
        pct = (stats.time_mean / ddp.time_mean - 1) * 100
        low = (min(stats.times) / max(ddp.times) - 1) * 100
        high = (max(stats.times) / min(ddp.times) - 1) * 100
        overlap = min(stats.times) <= max(ddp.times) and min(ddp.times) <= max(stats.times)
        noise = ", within noise" if overlap else ""
        spread = (
            f"{fmt(low, 'overhead_pct', sign=True)}–{fmt(high, 'overhead_pct', sign=True)}%{noise}"
            if min(stats.n, ddp.n) >= 2
            else "1 run, no spread"
        )
        overhead = f"{fmt(pct, 'overhead_pct', sign=True)}% vs DDP ({spread}, n={stats.n}/{ddp.n})"
    mean = stats.time_mean / epochs
    return Measure(mean, f"{fmt(mean, 'per_epoch_s')} s/epoch, {overhead}", per_epoch)


def _restart_outcomes(faults: FaultSection | None, framework: str):
    """The platform's fault runs in its default recovery (restart). An elastic run is another setup (fewer
    workers at the end, other numbers): Table B.5 shows it, and the criteria never mix it in."""
    return [o for o in (faults.outcomes if faults else []) if o.framework == framework and not o.elastic]


def _recovery(faults: FaultSection | None, framework: str) -> Measure:
    outcomes = _restart_outcomes(faults, framework)
    if not outcomes:
        return Measure(None, "no fault run")
    if any(o.state == "not recovered" for o in outcomes):
        reasons = "; ".join(o.recovered_by for o in outcomes if o.state == "not recovered")
        return Measure(float("inf"), f"did not recover ({reasons})", (float("inf"),) * len(outcomes))
    ratios = tuple(
        o.total_s / o.undisturbed_s
        for o in outcomes
        if o.measured and o.total_s is not None and o.undisturbed_s
    )
    if not ratios:
        return Measure(None, "no measured recovery (no undisturbed twin, or the fault never fired)")
    mean = sum(ratios) / len(ratios)
    return Measure(mean, f"{fmt(mean, 'ratio')}× undisturbed; {_interval_text(ratios, 'ratio', '×')}", ratios)


def _reproducibility(groups: Mapping[GroupKey, GroupStats], framework: str) -> Measure:
    if framework == BASELINE:
        return Measure(1.0, "– (baseline)", exact=True)
    compared, differing = 0, []
    for (f, gpus, epochs), stats in groups.items():
        ddp = groups.get((BASELINE, gpus, epochs))
        if f != framework or ddp is None:
            continue
        theirs = {clock.seed: clock.epoch_accuracy for clock in ddp.clocks}
        for clock in stats.clocks:
            if clock.seed in theirs:
                compared += 1
                if clock.epoch_accuracy != theirs[clock.seed]:
                    differing.append(f"{gpus}×{epochs} ep seed {clock.seed}")
    if not compared:
        return Measure(None, "no same-seed DDP run")
    if differing:
        shown = f"no: differs from DDP's ({', '.join(differing)}; {compared} compared)"
        return Measure(0.0, shown, exact=True, runs=compared)
    return Measure(
        1.0, f"yes ({compared} same-seed run{'s' if compared != 1 else ''} equal DDP's)", exact=True,
        runs=compared,
    )


def _exact(value: float | None, shown: str) -> Measure:
    return Measure(value, shown, exact=True) if value is not None else Measure(None, shown)


def _qualitative(platform: str, ranked: bool = False) -> tuple[Measure, Measure]:
    """The study's checklist (Table 5.11) and pipelines (5.6.4) for a platform. `ranked` only for the study's
    own figures (bench.report --study); on a cluster they are shown beside the measured, valued None, so
    that no ranking rests on them and no platform the study left out is placed after the others for it."""
    features = centralised_features(platform)
    pipelines = in_pipelines(platform)
    total = len(study_qualitative()["management"]["rows"])
    outside = "not in the study"
    beside = "" if ranked else "; the study's word, not ranked here"
    return (
        _exact(features if ranked else None,
               f"{features} of {total} (Table 5.11{beside})" if features is not None else outside),
        _exact(
            None if pipelines is None or not ranked else float(pipelines),
            f"{'yes' if pipelines else 'no'} (section 5.6.4{beside})" if pipelines is not None else outside,
        ),
    )


def _whole_run(groups: Mapping[GroupKey, GroupStats], key: GroupKey) -> Measure:
    """Submit to result recorded, per run (the whole-run clock's end to end, Table B.3)."""
    stats = groups.get(key)
    values = stats.end_to_end if stats is not None else ()
    if not values:
        return Measure(None, "no whole-run clock recorded" if stats is not None else "no run")
    mean = sum(values) / len(values)
    return Measure(mean, f"{fmt(mean, 'time_s')} s; {_interval_text(values, 'time_s', ' s')}", tuple(values))


def _unattended(faults: FaultSection | None, framework: str) -> Measure:
    """Yes when every fault run recovered within its first attempt (the platform restarted its workers
    itself); no when one needed another attempt (dtlab's retry, what a person would do) or never recovered."""
    outcomes = [o for o in _restart_outcomes(faults, framework) if o.state in ("recovered", "not recovered")]
    if not outcomes:
        return Measure(None, "no fault run")
    by_itself = [o for o in outcomes if o.recovered and o.attempts == 1]
    n = len(outcomes)
    runs = f"{n} fault run{'s' if n != 1 else ''}"
    if len(by_itself) == n:
        return Measure(1.0, f"yes: recovered within the attempt ({runs})", exact=True, runs=n)
    return Measure(0.0, f"no: {n - len(by_itself)} of {runs} needed another attempt or did not recover",
                   exact=True, runs=n)


# --- upstream health ---------------------------------------------------------------------------------

@cache
def upstream() -> dict[str, dict[str, Any]]:
    """Per platform, whether upstream is maintained, its last release, the source (its
    Platform.upstream_health)."""
    return {platform: platforms.get(platform).upstream() for platform in PLATFORMS}


def upstream_text(platform: str) -> str:
    entry = upstream()[platform]
    state = "maintained" if entry["maintained"] else "unmaintained"
    return (f"{state}; last release: {entry['last_release']} "
            f"(source: {entry['source']}; checked {entry['checked']})")
