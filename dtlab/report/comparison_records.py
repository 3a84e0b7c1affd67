"""Table B.10's two columns measured on the cluster rather than from the runs: the provisioning records
(dtlab.provision) and the idle records (dtlab.idle) under results/<cluster>/, read and summed per platform."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dtlab import platforms
from dtlab.errors import DtlabError
from dtlab.paths import IDLE_DIRNAME, PROVISION_DIRNAME
from dtlab.report.comparison_measures import PLATFORM_ROLES, PLATFORMS, VARIABLE_PREFIXES, Measure
from dtlab.report.study import DISPLAY_NAMES

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


def _mean_measure(values: Sequence[float], places: int, unit: str, what: str) -> Measure:
    mean = sum(values) / len(values)
    spread = f"{_range(values, places, unit)}, {_runs(len(values))}"
    return Measure(mean, f"{mean:.{places}f}{unit} ({what}: {spread})", tuple(values))


def idle_memory(records: Sequence[Mapping[str, Any]]) -> dict[str, Measure]:
    """Per platform, its running units' memory summed over the nodes, one value per probe (the ranked
    form of idle_use); a platform with no daemon of its own idles at 0 MiB, exactly."""
    found = {}
    for platform in PLATFORMS:
        totals = []
        for record in records:
            mine = [u for u in record.get("units", []) if u.get("platform") == platform and u.get("running")]
            if mine and all(u.get("memory_bytes") is not None for u in mine):
                totals.append(sum(u["memory_bytes"] for u in mine) / 2**20)
        if totals:
            found[platform] = _mean_measure(totals, 0, " MiB", "over the nodes, per probe")
        elif not platforms.get(platform).service_variables:
            found[platform] = Measure(0.0, "0 MiB (no daemon of its own)", exact=True)
        else:
            found[platform] = Measure(None, "none running" if records else NOT_MEASURED)
    return found


def first_converge(records: Sequence[Mapping[str, Any]]) -> dict[str, Measure]:
    """Per platform, its roles' seconds in each recorded converge that changed them (a first converge);
    a platform with no role of its own adds 0 s, exactly."""
    found = {}
    for platform, roles in PLATFORM_ROLES.items():
        changed, unchanged = _role_seconds(records, roles)
        if not roles:
            found[platform] = Measure(0.0, "0 s (no role of its own)", exact=True)
        elif changed:
            found[platform] = _mean_measure(changed, 0, " s", "first converges")
        else:
            found[platform] = Measure(None, "only idempotent re-runs recorded" if unchanged else NOT_MEASURED)
    return found


def cluster_ranked(root: Path | None) -> dict[str, dict[str, Measure]]:
    """The ranked criteria measured from the cluster's records: idle memory and provisioning time."""
    provision = read_records(root, PROVISION_DIRNAME)[0] if root else []
    idle = read_records(root, IDLE_DIRNAME)[0] if root else []
    return {"idle": idle_memory(idle), "provisioning": first_converge(provision)}


def _roles_named() -> str:
    return "; ".join(f"{DISPLAY_NAMES.get(p, p)}: {', '.join(roles)}" for p, roles in PLATFORM_ROLES.items()
                     if roles)
