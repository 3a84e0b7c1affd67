"""The study's qualitative comparison (its section 5.5), measured on this cluster, and a recommendation
computed from it and the user's priorities (issue #28, items 4 and 5).

Table B.10 puts, per platform, what the study judged in words beside what this cluster measured: start-up
(Table B.3's clock), steady-state overhead (Table 5.9), fault-recovery cost (Table B.5), reproducibility
(the same seed's per-epoch accuracy against DDP's), the lines a user writes (the launchers, counted) and
the moving parts (services and ports, from inventory/group_vars/all.yml). Table B.11 ranks the platforms
on the criteria the user puts first (`bench.report --priorities`). A platform is ahead of another on a
noisy criterion only when the runs' min-max support it (aggregate.MIN_RUNS_FOR_SPREAD runs each, the
intervals apart); counts (lines, services, features) are exact and always order.
"""

from __future__ import annotations

import ast
import io
import json
import math
import tokenize
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dtlab import platforms
from dtlab.errors import DtlabError
from dtlab.paths import IDLE_DIRNAME, INVENTORY_DIR, PROVISION_DIRNAME, REPO_ROOT
from dtlab.platforms import BASELINE
from dtlab.report.aggregate import MIN_RUNS_FOR_SPREAD, GroupKey, GroupStats, Sample
from dtlab.report.faults import FaultSection
from dtlab.report.numbers import fmt, text
from dtlab.report.study import DISPLAY_NAMES, STUDY_SCALED_GPUS, STUDY_SHORT_EPOCHS, Published
from dtlab.report.tables import Table

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

STARTUP_PHASES = ("submit → trainer process", "→ first step")  # aggregate.WHOLE_RUN_PHASES' first two

NOT_MEASURED = "not measured"
# The two columns measured on the cluster rather than from the runs: what records each, and where.
PROVISION_NOT_MEASURED_NOTE = (
    f"Provisioning time is not measured: results/<cluster>/{PROVISION_DIRNAME}/ holds no record. "
    "invoke cluster.provision (or invoke demo) records each whole site.yml converge there, seconds per role."
)
IDLE_NOT_MEASURED_NOTE = (
    f"Idle memory / CPU is not measured: results/<cluster>/{IDLE_DIRNAME}/ holds no record. invoke "
    "cluster.idle, run with no cell running, records each platform unit's MemoryCurrent and CPUUsageNSec "
    "(systemctl show) per node there."
)
READABLE_RECORD_FORMATS = (1,)  # of dtlab.provision's and dtlab.idle's records

# name -> (what it ranks on, which way is better)
CRITERIA = {
    "speed": "steady-state per-epoch time (Table 5.9), faster first",
    "startup": "submit → first step (Table B.3), faster first",
    "recovery": "fault recovery: recovered first, then total / undisturbed time (Table B.5), lower first",
    "reproducibility": "per-epoch validation accuracy equal to DDP's for the same seed first",
    "adoption": "lines a user writes (its launcher's non-blank, non-comment lines), fewer first",
    "footprint": "services and listening ports it adds (moving parts), fewer first",
    "operations": "centralised management features (the study's Table 5.11), more first",
    "pipelines": "training inside a data pipeline (the study's section 5.6.4) first",
}


# --- the study's qualitative facts -----------------------------------------------------------------


@cache
def study_qualitative() -> dict[str, Any]:
    return yaml.safe_load(resources.files("dtlab").joinpath("data/study_qualitative.yml").read_text())


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
                "The operations criterion counts the cells the study describes as done by the platform "
                "itself (automatic, built-in, yes)."
            ],
        ),
    ]


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
    """The services and listening ports the inventory names for the platform (inventory/group_vars)."""
    if group_vars is None:
        group_vars = yaml.safe_load((INVENTORY_DIR / "group_vars" / "all.yml").read_text())
    mine = [k for k in group_vars if k.startswith(VARIABLE_PREFIXES[platform])]
    ranged = PORT_RANGES.get(platform)
    ports = [str(group_vars[k]) for k in mine if k.endswith("_port") and (not ranged or k not in ranged)]
    if ranged:
        ports.append(f"{group_vars[ranged[0]]}–{group_vars[ranged[1]]}")
    services = [str(group_vars[k]) for k in mine if k.endswith("_service")]
    return MovingParts(tuple(services), tuple(ports))


# --- measured on the cluster: provisioning and idle records ------------------------------------------


def variable_platform(variable: str) -> str:
    """The platform a group_vars name belongs to (VARIABLE_PREFIXES); DtlabError for no platform's."""
    for platform, prefixes in VARIABLE_PREFIXES.items():
        if variable.startswith(prefixes):
            return platform
    raise DtlabError(f"{variable}: no platform's variable (dtlab.report.comparison.VARIABLE_PREFIXES)")


def shared_roles(recorded: Iterable[str]) -> list[str]:
    """The recorded roles (and tasks outside roles) no platform owns."""
    owned = {role for roles in PLATFORM_ROLES.values() for role in roles}
    return sorted(set(recorded) - owned)


def _provision_record(content: Mapping[str, Any]) -> bool:
    roles = content.get("roles")
    return isinstance(roles, dict) and all(
        isinstance(r, dict) and isinstance(r.get("seconds"), int | float) for r in roles.values()
    )


def _idle_record(content: Mapping[str, Any]) -> bool:
    units = content.get("units")
    return isinstance(units, list) and all(
        isinstance(u, dict)
        and all(isinstance(u.get(k), str) for k in ("node", "unit", "platform", "state"))
        and isinstance(u.get("running"), list)
        for u in units
    )


RECORD_SHAPES = {PROVISION_DIRNAME: _provision_record, IDLE_DIRNAME: _idle_record}


def read_records(root: Path, dirname: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON records in results/<cluster>/<dirname>/, oldest first (their names sort by time), and one
    note per file that cannot be read (left out, never a stopped report)."""
    directory = root / dirname
    records, unreadable = [], []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        source = path.relative_to(root).as_posix()
        try:
            content = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            unreadable.append(f"{source} ({error})")
            continue
        if (not isinstance(content, dict) or content.get("format") not in READABLE_RECORD_FORMATS
                or not RECORD_SHAPES[dirname](content)):
            unreadable.append(f"{source} (not a {dirname} record of format "
                              f"{', '.join(map(str, READABLE_RECORD_FORMATS))})")
            continue
        records.append(content)
    return records, unreadable


def _range(values: Sequence[float], places: int, unit: str) -> str:
    """'97 s', or '90–104 s' (min–max over the runs)."""
    low, high = (f"{v:.{places}f}" for v in (min(values), max(values)))
    return f"{low if low == high else f'{low}–{high}'}{unit}"


def _runs(n: int) -> str:
    return "1 run" if n == 1 else f"n={n}"


def _role_seconds(records: Iterable[Mapping[str, Any]], roles: Sequence[str]
                  ) -> tuple[list[float], list[float]]:
    """Per run in which any of `roles` ran: their wall seconds, apart for the runs in which they changed
    something (a first converge) and those in which they changed nothing (an idempotent re-run)."""
    changed, unchanged = [], []
    for record in records:
        mine = [record["roles"][role] for role in roles if role in record.get("roles", {})]
        if mine:
            seconds = sum(float(m["seconds"]) for m in mine)
            (changed if any(m.get("changed") for m in mine) else unchanged).append(seconds)
    return changed, unchanged


def _seconds_text(changed: list[float], unchanged: list[float]) -> str:
    parts = [f"{_range(changed, 0, ' s')} with changes ({_runs(len(changed))})"] if changed else []
    parts += [f"{_range(unchanged, 0, ' s')} changing nothing ({_runs(len(unchanged))})"] if unchanged else []
    return "; ".join(parts)


def provisioning_times(records: Sequence[Mapping[str, Any]]) -> tuple[dict[str, str], str]:
    """Per platform, its roles' seconds in the recorded converges; and the shared roles' line."""
    shown = {}
    for platform, roles in PLATFORM_ROLES.items():
        if not roles:
            shown[platform] = "no role of its own (it runs on the shared roles)"
        else:
            shown[platform] = _seconds_text(*_role_seconds(records, roles)) or "its roles never ran"
    shared = shared_roles({role for record in records for role in record.get("roles", {})})
    line = f"Shared roles ({', '.join(shared)}): {_seconds_text(*_role_seconds(records, shared))}."
    return shown, line


def idle_use(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Per platform and node, the memory and CPU of its running units (dtlab.idle.UnitIdle.running),
    min–max over the probes."""
    shown = {}
    for platform in PLATFORMS:
        per_node: dict[str, tuple[list[float], list[float]]] = {}
        states = set()
        probes = 0  # the records in which the platform had an active unit
        for record in records:
            totals: dict[str, list[float | None]] = {}
            for unit in record.get("units", []):
                if unit.get("platform") != platform:
                    continue
                states.add(f"{unit['unit']} {unit['state']}")
                if not unit.get("running"):  # neither the unit nor a member of it ran
                    continue
                total = totals.setdefault(unit["node"], [0.0, 0.0])
                for index, key in enumerate(("memory_bytes", "cpu_pct")):
                    value = unit.get(key)
                    total[index] = None if value is None or total[index] is None else total[index] + value
            probes += bool(totals)
            for node, (memory, cpu) in totals.items():
                memories, cpus = per_node.setdefault(node, ([], []))
                if memory is not None:
                    memories.append(memory / 2**20)
                if cpu is not None:
                    cpus.append(cpu)
        if not per_node:
            shown[platform] = ("none running: " + ", ".join(sorted(states)) if states
                               else "no daemon of its own" if not platforms.get(platform).service_variables
                               else "not installed")
            continue
        shown[platform] = "; ".join(
            f"{node}: {_range(memories, 0, ' MiB') if memories else 'memory not accounted'}, "
            f"{_range(cpus, 2, '% CPU') if cpus else 'CPU not accounted'}"
            for node, (memories, cpus) in sorted(per_node.items())
        ) + f" ({'1 probe' if probes == 1 else f'n={probes}'})"
    return shown


def cluster_measures(root: Path | None) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """Table B.10's two columns measured on the cluster, from results/<cluster>/provision/ and idle/
    (NOT_MEASURED where no record is), and their notes."""
    provision, unreadable = read_records(root, PROVISION_DIRNAME) if root else ([], [])
    idle, unreadable_idle = read_records(root, IDLE_DIRNAME) if root else ([], [])
    notes = []
    if provision:
        times, shared = provisioning_times(provision)
        notes.append(
            f"Provisioning time: the wall time of each platform's roles ({_roles_named()}) in the "
            f"{len(provision)} whole site.yml converge(s) recorded in {PROVISION_DIRNAME}/ (invoke "
            "cluster.provision, invoke demo), min–max over them; runs in which those roles changed "
            "something (a first converge) shown apart from runs in which they changed nothing (an "
            f"idempotent re-run). {shared}"
        )
    else:
        times = dict.fromkeys(PLATFORMS, NOT_MEASURED)
        notes.append(PROVISION_NOT_MEASURED_NOTE)
    if idle:
        used = idle_use(idle)
        intervals = sorted({float(record.get("interval_s", 0)) for record in idle})
        sources = sorted({u.get("source") for r in idle for u in r["units"] if u.get("source")})
        over = ", ".join(f"{i:g}" for i in intervals)
        notes.append(
            f"Idle memory / CPU: {len(idle)} probe(s) by invoke cluster.idle ({IDLE_DIRNAME}/), no cell "
            "running: per node, the sum over the platform's units (its *_service names in group_vars, "
            "each with the units that are PartOf it, of those running at both samples) of its memory "
            f"(the mean of two samples) and its CPU over {over} s as % of one core, min–max over the "
            "probes. Both from systemd's accounts (MemoryCurrent, page cache charged to the unit "
            "included; CPUUsageNSec) where it keeps them, else from the unit's processes (PSS, and the "
            "CPU ticks of those alive at both samples), as on the lab's nodes; here from: "
            f"{', '.join(sources) or 'no running unit'}."
        )
    else:
        used = dict.fromkeys(PLATFORMS, NOT_MEASURED)
        notes.append(IDLE_NOT_MEASURED_NOTE)
    if unreadable or unreadable_idle:
        notes.append(f"Left out, unreadable: {'; '.join(unreadable + unreadable_idle)}.")
    return times, used, notes


def _roles_named() -> str:
    return "; ".join(f"{DISPLAY_NAMES.get(p, p)}: {', '.join(roles)}" for p, roles in PLATFORM_ROLES.items()
                     if roles)


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

    @property
    def measured(self) -> bool:
        return self.value is not None


def _interval_text(values: Sequence[float], quantity: str, suffix: str = "") -> str:
    n = len(values)
    if n <= 1:
        return f"1 run, no spread (n={n})"
    return f"{fmt(min(values), quantity)}–{fmt(max(values), quantity)}{suffix} (n={n})"


def better(a: Measure, b: Measure, lower_first: bool) -> bool | None:
    """True when a is ahead of b and the data support it; None when they cannot be told apart."""
    if not a.measured or not b.measured:
        return None
    if math.isinf(a.value) != math.isinf(b.value):  # did not recover against recovered: always apart
        return (a.value < b.value) == lower_first
    if a.exact or (a.published and b.published):
        if a.value == b.value:
            return None
        return (a.value < b.value) == lower_first
    if a.published or b.published or min(len(a.values), len(b.values)) < MIN_RUNS_FOR_SPREAD:
        return None
    if lower_first:
        return True if max(a.values) < min(b.values) else None
    return True if min(a.values) > max(b.values) else None


LOWER_FIRST = {
    "speed": True,
    "startup": True,
    "recovery": True,
    "reproducibility": False,
    "adoption": True,
    "footprint": True,
    "operations": False,
    "pipelines": False,
}


@dataclass
class Comparison:
    """Table B.10 as data: per platform, per criterion, the measure; plus the table itself."""

    platforms: list[str]
    measures: dict[str, dict[str, Measure]]  # criterion -> platform -> Measure
    table: Table
    study_tables: list[Table] = field(default_factory=list)
    recommendation: Table | None = None
    conclusion_checks: list[str] = field(default_factory=list)


def comparison_count(groups: Mapping[GroupKey, GroupStats], short: int | None) -> int | None:
    """The count every platform is compared at: the largest at which DDP ran the short runs, else the
    largest any platform did."""
    ddp = [g for f, g, e in groups if e == short and f == BASELINE]
    counts = ddp or [g for _f, g, e in groups if e == short]
    return max(counts) if counts else None


def _startup(samples: Iterable[Sample], key: GroupKey) -> Measure:
    values = tuple(
        sum(dict(s.phases)[p] for p in STARTUP_PHASES)
        for s in samples
        if (s.framework, s.gpus, s.epochs) == key and all(p in dict(s.phases) for p in STARTUP_PHASES)
    )
    if not values:
        return Measure(None, "no whole-run clock recorded")
    mean = sum(values) / len(values)
    return Measure(mean, f"{fmt(mean, 'time_s')} s; {_interval_text(values, 'time_s', ' s')}", values)


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


def _recovery(faults: FaultSection | None, framework: str) -> Measure:
    outcomes = [o for o in (faults.outcomes if faults else []) if o.framework == framework]
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
        return Measure(0.0, shown, exact=True)
    return Measure(
        1.0, f"yes ({compared} same-seed run{'s' if compared != 1 else ''} equal DDP's)", exact=True
    )


def _exact(value: float | None, shown: str) -> Measure:
    return Measure(value, shown, exact=True) if value is not None else Measure(None, shown)


def _qualitative(platform: str) -> tuple[Measure, Measure]:
    features = centralised_features(platform)
    pipelines = in_pipelines(platform)
    total = len(study_qualitative()["management"]["rows"])
    outside = "not in the study"
    return (
        _exact(features, f"{features} of {total} (Table 5.11)" if features is not None else outside),
        _exact(
            None if pipelines is None else float(pipelines),
            f"{'yes' if pipelines else 'no'} (section 5.6.4)" if pipelines is not None else outside,
        ),
    )


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
    "Data pipelines (study)",
    "Provisioning time",
    "Idle memory / CPU per node",
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
                text(measures["operations"][p].shown),
                text(measures["pipelines"][p].shown),
                text(provisioning[p] if provisioning is not None else "not published"),
                text(idle[p] if idle is not None else "not published"),
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
    "Determined and Spark only)."
)


def build_comparison(
    groups: Mapping[GroupKey, GroupStats],
    samples: Iterable[Sample],
    faults: FaultSection | None,
    short: int | None,
    root: Path | None = None,
) -> Comparison:
    """Table B.10 from this cluster's runs, and from the provisioning and idle records under `root` (its
    results folder)."""
    samples = list(samples)
    count = comparison_count(groups, short)
    measures: dict[str, dict[str, Measure]] = {c: {} for c in CRITERIA}
    parts = {}
    for p in PLATFORMS:
        key = (p, count, short)
        measures["startup"][p] = _startup(samples, key) if count is not None else Measure(None, "no run")
        measures["speed"][p] = _speed(groups, key) if count is not None else Measure(None, "no run")
        measures["recovery"][p] = _recovery(faults, p)
        measures["reproducibility"][p] = _reproducibility(groups, p)
        lines = launcher_lines(p)
        measures["adoption"][p] = _exact(lines, f"{lines} ({', '.join(LAUNCHER_FILES[p])})")
        parts[p] = moving_parts(p)
        measures["footprint"][p] = _exact(parts[p].count, f"{parts[p].count}")
        measures["operations"][p], measures["pipelines"][p] = _qualitative(p)
    at = f"{count} workers/GPUs, {short} epochs" if count is not None else "no runs"
    title = f"The study's qualitative comparison, measured on this cluster (at {at}; beyond the study)"
    provisioning, idle, notes = cluster_measures(root)
    table = _table(list(PLATFORMS), measures, parts, title, [COMPARISON_NOTE, *notes], provisioning, idle)
    return Comparison(list(PLATFORMS), measures, table)


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
        measures["operations"][p], measures["pipelines"][p] = _qualitative(p)
    title = (
        "The study's qualitative comparison, from its published figures (Table 5.9 at 2 GPUs, "
        "Tables 5.10-5.11, section 5.6.4)"
    )
    table = _table(platforms, measures, dict.fromkeys(platforms), title, [COMPARISON_NOTE])
    return Comparison(platforms, measures, table, study_tables())


# --- priorities and the recommendation -------------------------------------------------------------


@dataclass(frozen=True)
class Priorities:
    """Ordered criteria (lexicographic: the first decides, the next breaks its ties) or weights."""

    order: tuple[str, ...]
    weights: dict[str, float] | None = None

    @property
    def described(self) -> str:
        if self.weights is None:
            return ", then ".join(self.order)
        return ", ".join(f"{c} ×{w:g}" for c, w in self.weights.items())


def _unknown(name: str, where: str) -> DtlabError:
    return DtlabError(
        f"bench.report: --priorities {where}: unknown criterion {name!r}; known: {', '.join(CRITERIA)}"
    )


def parse_priorities(spec: str) -> Priorities:
    """`speed,recovery,operations` (ordered) or a YAML file of {criterion: weight > 0}; one-line errors."""
    spec = spec.strip()
    if spec.endswith((".yml", ".yaml")) or Path(spec).is_file():
        path = Path(spec)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as error:
            raise DtlabError(
                f"bench.report: --priorities {spec}: cannot read it ({error.strerror})"
            ) from None
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise DtlabError(f"bench.report: --priorities {spec}: not valid YAML{where}") from None
        if not isinstance(data, dict) or not data:
            raise DtlabError(
                f"bench.report: --priorities {spec}: must map criteria to weights, e.g. 'speed: 3'"
            )
        weights = {}
        for name, weight in data.items():
            if name not in CRITERIA:
                raise _unknown(str(name), spec)
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
                raise DtlabError(
                    f"bench.report: --priorities {spec}: {name}: weight must be a number > 0, got {weight!r}"
                )
            weights[name] = float(weight)
        order = tuple(sorted(weights, key=lambda c: -weights[c]))
        return Priorities(order, weights)
    names = [name.strip() for name in spec.split(",")]
    if not spec or any(not name for name in names):
        raise DtlabError(
            f"bench.report: --priorities {spec!r}: give criteria separated by commas, "
            f"e.g. speed,recovery,operations"
        )
    for name in names:
        if name not in CRITERIA:
            raise _unknown(name, spec)
    if len(set(names)) != len(names):
        raise DtlabError(f"bench.report: --priorities {spec}: a criterion is named twice")
    return Priorities(tuple(names))


@dataclass(frozen=True)
class Placed:
    platform: str
    rank: int
    tiers: dict[str, int]  # criterion -> 1 + platforms ahead of it (the unmeasured after the measured)
    reasons: dict[str, str]  # criterion -> its figure and who it ties with


def tiers(measures: Mapping[str, Measure], criterion: str) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Per platform: 1 + the platforms ahead of it with support, and the platforms it cannot be told from
    although their figures differ (within noise / too few runs)."""
    lower = LOWER_FIRST[criterion]
    measured = [p for p, m in measures.items() if m.measured]
    found, ties = {}, {}
    for p, m in measures.items():
        if not m.measured:
            found[p] = len(measured) + 1
            ties[p] = []
            continue
        found[p] = 1 + sum(bool(better(measures[q], m, lower)) for q in measured if q != p)
        ties[p] = [
            q
            for q in measured
            if q != p
            and measures[q].value != m.value
            and not better(measures[q], m, lower)
            and not better(m, measures[q], lower)
        ]
    return found, ties


def rank(comparison: Comparison, priorities: Priorities) -> list[Placed]:
    """The platforms in order: lexicographic over the places on the ordered criteria, or the weighted sum
    of the places; equal keys share a rank."""
    per_criterion = {c: tiers(comparison.measures[c], c) for c in priorities.order}
    keys: dict[str, tuple[float, ...]] = {}
    found: dict[str, dict[str, int]] = {}
    reasons: dict[str, dict[str, str]] = {}
    for p in comparison.platforms:
        found[p] = {c: per_criterion[c][0][p] for c in priorities.order}
        if priorities.weights is None:
            keys[p] = tuple(found[p][c] for c in priorities.order)
        else:
            keys[p] = (sum(priorities.weights[c] * found[p][c] for c in priorities.order),)
        reasons[p] = {}
        for c in priorities.order:
            m = comparison.measures[c][p]
            tied = per_criterion[c][1][p]
            mark = ""
            if not m.measured:
                mark = " (not measured: placed after the measured)" if found[p][c] > 1 else ""
            elif tied:
                names = ", ".join(DISPLAY_NAMES.get(q, q) for q in tied)
                mark = f" (not ranked against {names}: within noise or too few runs)"
            elif m.published:
                mark = " (ranked on the printed means: spread not published)"
            reasons[p][c] = f"#{found[p][c]}: {m.shown}{mark}"
    placed = [
        Placed(p, 1 + sum(keys[q] < keys[p] for q in keys), found[p], reasons[p])
        for p in comparison.platforms
    ]
    return sorted(placed, key=lambda x: (x.rank, comparison.platforms.index(x.platform)))


def recommendation_table(comparison: Comparison, priorities: Priorities) -> Table:
    placed = rank(comparison, priorities)
    first = [x.platform for x in placed if x.rank == 1]
    names = " and ".join(DISPLAY_NAMES.get(p, p) for p in first)
    summary = (
        f"Recommended for {priorities.described}: {names}"
        if len(first) == 1
        else f"For {priorities.described}, {names} share first place: the data do not separate them "
        "on any criterion asked"
    )
    how = (
        "Ordered priorities: the first criterion decides, each next one only breaks the ties left."
        if priorities.weights is None
        else "Weights: the sum of weight × place on each criterion decides, smaller first."
    )
    rows = [
        [
            text(str(x.rank)),
            text(DISPLAY_NAMES.get(x.platform, x.platform)),
            *(text(x.reasons[c]) for c in priorities.order),
        ]
        for x in placed
    ]
    return Table(
        "B.11",
        "table-b.11-recommendation",
        f"Recommendation for the priorities {priorities.described} (beyond the study)",
        ["Rank", "Platform", *priorities.order],
        rows,
        [
            summary + ".",
            how,
            "A place (#) on a criterion is 1 + the platforms ahead of it with "
            f"support: on a measured time, {MIN_RUNS_FOR_SPREAD} or more runs each and min-max "
            "intervals apart; counts and yes/no always order. Criteria: "
            + "; ".join(f"{c}: {w}" for c, w in CRITERIA.items())
            + ".",
        ],
    )


def check_study_conclusion(comparison: Comparison) -> list[str]:
    """Each of the study's conclusions (5.6, 5.7) against the ranking its priorities give here."""
    lines = []
    for conclusion in study_qualitative()["conclusions"]:
        priorities = Priorities(tuple(conclusion["priorities"]))
        placed = rank(comparison, priorities)
        first = [x.platform for x in placed if x.rank == 1]
        claim = (
            f"Study (section {conclusion['section']}): {DISPLAY_NAMES[conclusion['platform']]} for "
            f"{conclusion['for']} (priorities: {priorities.described})"
        )
        if first == [conclusion["platform"]]:
            lines.append(f"{claim}: reproduced.")
        else:
            computed = " and ".join(DISPLAY_NAMES.get(p, p) for p in first)
            lines.append(f"{claim}: differs, computed first: {computed}.")
    return lines


def with_recommendation(comparison: Comparison, priorities: Priorities | None) -> Comparison:
    if priorities is not None:
        comparison.recommendation = recommendation_table(comparison, priorities)
    return comparison
