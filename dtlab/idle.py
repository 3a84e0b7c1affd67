"""invoke cluster.idle: what each platform's daemons cost while no cell runs (the report's Table B.10).

On every node at once, with no cell unit running (remote.CELL_UNIT_PATTERNS; one is refused), each
platform unit cluster.check looks for (each platform's service_variables, by the names in group_vars) is read
twice, `interval_s` apart on the node's monotonic clock, by dtlab/data/idle_probe.py: memory (bytes, the
mean of the two samples) and CPU (its increase over the interval: % of one core). Both come from
systemd's own accounting (MemoryCurrent, CPUUsageNSec) where it keeps one, else from the unit's
processes (its cgroup's PIDs: PSS from /proc/<pid>/smaps_rollup, CPU ticks from /proc/<pid>/stat, the
processes alive at both samples), as on the lab's nodes, whose systemd runs in a container under a
cgroup-v1 host and accounts nothing; each figure says which. A unit's figures include the units that are
PartOf it (ConsistsOf: Debian's postgresql.service is an umbrella over postgresql@<version>-main, which
runs the server), of those active at both samples. Units not installed on a node are left out; one
installed but not running, with no running member, is written with its state and no figures. The
result goes to results/<cluster>/idle/<UTC time>.json, the same numbers to the terminal.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from dtlab import paths, platforms, remote
from dtlab.errors import DtlabError
from dtlab.files import atomic_write_text
from dtlab.inventory import Cluster, Node
from dtlab.platforms import load_cluster

IDLE_FORMAT = 1  # the record's JSON layout, read by dtlab.report.comparison
DEFAULT_INTERVAL_S = 10.0
MAX_INTERVAL_S = 600.0
UNSET = 2**64 - 1  # what older systemd prints for a counter it does not keep ("[not set]" now)
SYSTEMD, PROCESSES = "systemd", "processes"  # where a figure came from


@dataclass(frozen=True)
class UnitIdle:
    """One platform unit on one node; memory and CPU None when neither it nor a member is active."""

    node: str
    unit: str
    variable: str  # its name in group_vars (spark_master_service, ...)
    platform: str
    state: str  # systemd's ActiveState of the unit itself
    memory_bytes: int | None
    cpu_pct: float | None  # % of one core over the interval
    members: tuple[str, ...] = ()  # units PartOf it
    running: tuple[str, ...] = ()  # the unit and members active at both samples: the figures are theirs
    source: str | None = None  # "systemd" (its accounting) or "processes" (/proc)


def platform_units(cluster: Cluster) -> dict[str, tuple[str, str]]:
    """{unit file name: (group_vars variable, platform)} of every unit cluster.check looks for."""
    return {f"{unit}.service": (variable, platform.name)
            for platform in platforms.ALL for variable, unit in platform.units(cluster).items()}


def probe_command(units: list[str], interval_s: float) -> str:
    """The node's python3 runs dtlab/data/idle_probe.py, given on stdin, with its config as argument."""
    script = resources.files("dtlab").joinpath("data/idle_probe.py").read_text()
    config = {"units": units, "interval_s": interval_s,
              "cell_patterns": [p + ".service" for p in remote.CELL_UNIT_PATTERNS]}
    return f"python3 - {shlex.quote(json.dumps(config))} <<'DTLAB_IDLE_PROBE'\n{script}\nDTLAB_IDLE_PROBE\n"


def _counter(value: str | None) -> int | None:
    if value is None or not value.strip().isdigit():
        return None
    number = int(value)
    return None if number == UNSET else number


def _systemd_figures(first: dict, second: dict, seconds: float) -> tuple[float, float] | None:
    """(memory bytes, CPU %) from systemd's accounting of one unit; None where it keeps none."""
    memory = [_counter(s.get("MemoryCurrent")) for s in (first, second)]
    cpu = [_counter(s.get("CPUUsageNSec")) for s in (first, second)]
    if None in memory or None in cpu:
        return None
    return sum(memory) / 2, 100 * (cpu[1] - cpu[0]) / 1e9 / seconds


def _process_figures(first: dict, second: dict, seconds: float, ticks_per_s: float) -> tuple[float, float]:
    """(memory bytes, CPU %) from one unit's processes: PSS, and the CPU ticks of those alive throughout."""
    before, after = first.get("processes", {}), second.get("processes", {})
    memory = (sum(kb for _, kb in before.values()) + sum(kb for _, kb in after.values())) / 2 * 1024
    ticks = sum(after[pid][0] - before[pid][0] for pid in before.keys() & after.keys())
    return memory, 100 * ticks / ticks_per_s / seconds


def node_idle(node: str, answer: dict[str, Any], units: dict[str, tuple[str, str]]) -> list[UnitIdle]:
    """Each installed platform unit's memory and CPU from the node's two samples (with its members)."""
    samples = answer.get("samples") or []
    if len(samples) != 2:
        raise DtlabError(f"cluster.idle: host {node}: {len(samples)} samples came back, expected 2")
    first, second = samples
    seconds = (second["monotonic_ns"] - first["monotonic_ns"]) / 1e9
    found = []
    for unit, (variable, platform) in units.items():
        shown = second["units"].get(unit, {})
        if shown.get("LoadState") != "loaded":
            continue  # not installed here (not-found)
        members = tuple(answer.get("members", {}).get(unit, []))
        # An umbrella may be inactive while its member runs the server (the lab's postgresql@15-main is
        # started by itself): the figures are those of every part active at both samples.
        running = tuple(u for u in (unit, *members)
                        if all(s["units"].get(u, {}).get("ActiveState") == "active" for s in samples))
        state = shown.get("ActiveState", "unknown")
        if not running or seconds <= 0:
            found.append(UnitIdle(node, unit, variable, platform, state, None, None, members))
            continue
        pairs = [(first["units"][u], second["units"][u]) for u in running]
        figures = [_systemd_figures(a, b, seconds) for a, b in pairs]
        source = SYSTEMD
        if None in figures:  # one account missing: every part from its processes, so nothing mixes
            source = PROCESSES
            figures = [_process_figures(a, b, seconds, answer["clock_ticks_per_s"]) for a, b in pairs]
        memory, cpu = (sum(f[i] for f in figures) for i in (0, 1))
        found.append(UnitIdle(node, unit, variable, platform, state, round(memory), round(cpu, 3), members,
                              running, source))
    return found


def _check_interval(interval_s: float) -> float:
    if not 0 < interval_s <= MAX_INTERVAL_S:
        raise DtlabError(f"cluster.idle: --seconds {interval_s:g}: must be > 0 and <= {MAX_INTERVAL_S:g}")
    return interval_s


@dataclass(frozen=True)
class IdleMeasure:
    cluster: str
    started_at: str
    interval_s: float
    units: list[UnitIdle]

    def as_json(self) -> dict[str, Any]:
        return {"format": IDLE_FORMAT, "cluster": self.cluster, "started_at": self.started_at,
                "interval_s": self.interval_s, "units": [asdict(u) for u in self.units]}


def measure(cluster: Cluster, interval_s: float = DEFAULT_INTERVAL_S) -> IdleMeasure:
    """Sample every node at once; refuse (DtlabError, one line) when a node does not answer or a cell
    runs on one before or during the samples."""
    _check_interval(interval_s)
    units = platform_units(cluster)
    command = probe_command(list(units), interval_s)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")

    def probe(node: Node) -> remote.CommandResult:
        return remote.run(node, command, timeout=interval_s + 60)

    answers = remote.fan_out(cluster.nodes, probe)
    probes: dict[str, dict[str, Any]] = {}
    for node in cluster.nodes:
        answer = answers[node.name]
        if isinstance(answer, BaseException):
            raise DtlabError(f"cluster.idle: host {node.name}: {answer}; every node is measured at once")
        if not answer.ok:
            raise DtlabError(f"cluster.idle: host {node.name}: the probe exited {answer.exit_code}: "
                             f"{(answer.stderr or answer.stdout).strip()[-300:]}")
        try:
            probes[node.name] = json.loads(answer.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise DtlabError(f"cluster.idle: host {node.name}: the probe printed no JSON: "
                             f"{(answer.stderr or answer.stdout).strip()[-300:]}") from None
    running = {name: p.get("cells") for name, p in probes.items() if p.get("cells")}
    if running:
        named = "; ".join(f"{name}: {', '.join(sorted(set(cells)))}" for name, cells in running.items())
        raise DtlabError(f"cluster.idle: a cell is running ({named}); idle use is measured with no cell "
                         "running: wait for it to end or stop it with invoke cluster.reset")
    found = [u for node in cluster.nodes for u in node_idle(node.name, probes[node.name], units)]
    return IdleMeasure(cluster.name, started_at, interval_s, found)


def record_idle(found: IdleMeasure, directory: Path) -> Path:
    stamp = datetime.fromisoformat(found.started_at).strftime("%Y%m%dT%H%M%SZ")
    path = directory / f"{stamp}.json"
    atomic_write_text(path, json.dumps(found.as_json(), indent=2) + "\n")
    return path


def render(found: IdleMeasure, path: Path, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(highlight=False)
    table = Table(title=f"cluster.idle: {found.cluster}, no cell running, {found.interval_s:g} s sampled")
    for column in ("node", "platform", "unit", "state", "memory", "CPU (% of one core)", "from"):
        table.add_column(column, overflow="fold")
    for u in found.units:
        unit = u.unit + (f" (running: {', '.join(u.running)})" if u.running not in ((), (u.unit,)) else "")
        memory = f"{u.memory_bytes / 2**20:.1f} MiB" if u.memory_bytes is not None else "—"
        cpu = f"{u.cpu_pct:.2f}%" if u.cpu_pct is not None else "—"
        table.add_row(u.node, u.platform, unit, u.state, memory, cpu, u.source or "—")
    console.print(table)
    console.print(f"recorded: {path}")


def idle_command(inventory: str | None, seconds: str | float | None = None) -> IdleMeasure:
    """invoke cluster.idle: measure, write results/<cluster>/idle/<UTC time>.json, show the table."""
    try:
        interval_s = DEFAULT_INTERVAL_S if seconds in (None, "") else float(seconds)
    except ValueError:
        raise DtlabError(f"cluster.idle: --seconds {seconds!r}: must be a number of seconds") from None
    _check_interval(interval_s)  # before the inventory is read
    cluster = load_cluster(inventory)
    found = measure(cluster, interval_s)
    path = record_idle(found, paths.results_dir_for(cluster.name) / paths.IDLE_DIRNAME)
    render(found, path)
    return found
