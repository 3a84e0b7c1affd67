"""cluster.check (is the cluster fit to run the matrix?) and cluster.reset (back to a clean, known state).

check: SSH to every node; GPUs seen by nvidia-smi where the inventory expects them; one identical trainer
environment on every node; the Spark master alive with all its workers (and their GPUs); the Determined
master and agents where installed; PostgreSQL on the master; clock skew; free disk. One table.

reset: stop every dtlab unit and container on every node, restart Spark (which ends its applications),
cancel Determined experiments (as admin, with the master's own password: a failed login is a failed row)
and restart its services where installed, clear node scratch and checkpoints of cells not recorded ok,
then run check. Recorded results (on the controller) are never touched.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import Any

from dtlab import probes, remote
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node

MAX_CLOCK_SKEW_S = 1.0
MIN_FREE_DISK_GB_DEFAULT = 2.0
SPARK_READY_TIMEOUT_S = 90
@dataclass(frozen=True)
class CheckRow:
    check: str
    node: str
    ok: bool
    detail: str
    required: bool = True  # informational rows never fail the check


# The systemd units check and reset look for, each named by its variable in the inventory's group_vars.
SERVICE_VARIABLES = (
    "spark_master_service",
    "spark_worker_service",
    "postgresql_service",
    "determined_master_service",
    "determined_agent_service",
)


def _service_units(cluster: Cluster) -> dict[str, str]:
    """{variable: unit name} of the provisioned services, as the inventory names them."""
    return {variable: str(cluster.require(variable)) for variable in SERVICE_VARIABLES}


def _probe_script(cluster: Cluster, node: Node) -> str:
    """One round trip per node: time, disk, GPUs, running dtlab units, service states."""
    services = " ".join(shlex.quote(unit) for unit in _service_units(cluster).values())
    cell_units = " ".join(shlex.quote(p + ".service") for p in remote.CELL_UNIT_PATTERNS)
    return "; ".join(
        [
            "echo time=$(date +%s.%N)",
            # Free space where runs go, or on the nearest existing parent before the first run.
            f'd={shlex.quote(cluster.runs_dir)}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done; '
            "echo disk_kb=$(df -Pk \"$d\" | awk 'NR==2 {print $4}')",
            "echo gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr '\\n' ',')",
            f"echo units=$(systemctl list-units --plain --no-legend --state=active,activating {cell_units} "
            "| awk '{print $1}' | tr '\\n' ',')",
            # An installed service answers service.<unit>=<state>; one not installed, nothing.
            f"for u in {services}; do "
            'if [ -n "$(systemctl list-unit-files --plain --no-legend "$u.service")" ]; then '
            'echo "service.$u=$(systemctl is-active "$u.service")"; fi; done',
        ]
    )


def _parse_probe(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def check(cluster: Cluster) -> list[CheckRow]:
    rows: list[CheckRow] = []
    min_free_gb = float(cluster.var("dtlab_min_free_disk_gb", MIN_FREE_DISK_GB_DEFAULT))
    node_states: dict[str, dict[str, str]] = {}  # per node: the probe script's key=value answers

    def probe(node: Node) -> tuple[float, remote.CommandResult, float]:
        sent = time.time()
        answer = remote.run(node, _probe_script(cluster, node), timeout=30)
        return sent, answer, time.time()

    answers = remote.fan_out(cluster.nodes, probe)
    for node in cluster.nodes:
        answer = answers[node.name]
        if isinstance(answer, BaseException):
            rows.append(CheckRow("ssh", node.name, False, str(answer)))
            continue
        sent, result, received = answer
        values = _parse_probe(result.stdout)
        node_states[node.name] = values
        rows.append(CheckRow("ssh", node.name, True, f"{node.ssh_user}@{node.address}"))
        # Clock skew: the node's clock against the controller's at the middle of the round trip.
        try:
            skew = float(values["time"]) - (sent + received) / 2
            # The node read its clock somewhere inside the round trip: allow half of it as uncertainty.
            rows.append(
                CheckRow(
                    "clock skew",
                    node.name,
                    abs(skew) <= MAX_CLOCK_SKEW_S + (received - sent) / 2,
                    f"{skew:+.2f} s (limit ±{MAX_CLOCK_SKEW_S:.0f} s, round trip {received - sent:.2f} s)",
                )
            )
        except (KeyError, ValueError):
            rows.append(CheckRow("clock skew", node.name, False, "no time from the node"))
        try:
            free_gb = int(values["disk_kb"]) / 2**20
            rows.append(
                CheckRow(
                    "free disk",
                    node.name,
                    free_gb >= min_free_gb,
                    f"{free_gb:.1f} GiB free under {cluster.runs_dir} (need {min_free_gb:.0f})",
                )
            )
        except (KeyError, ValueError):
            rows.append(CheckRow("free disk", node.name, False, "df gave no answer"))
        if node.uses_gpu:
            seen = [g for g in values.get("gpus", "").split(",") if g.strip()]
            missing = [i for i in node.gpu_indices if str(i) not in seen]
            rows.append(
                CheckRow(
                    "nvidia-smi",
                    node.name,
                    not missing,
                    f"GPUs {','.join(seen) or 'none'} seen; inventory expects "
                    f"{','.join(map(str, node.gpu_indices))}",
                )
            )
        units = [u for u in values.get("units", "").split(",") if u]
        rows.append(
            CheckRow(
                "dtlab units",
                node.name,
                True,
                f"{len(units)} running" + (f": {', '.join(units)}" if units else ""),
                required=False,
            )
        )

    rows += _check_environment(cluster, [n for n in cluster.nodes if n.name in node_states])
    rows += _check_services(cluster, node_states)
    return rows


def _check_environment(cluster: Cluster, reachable: list[Node]) -> list[CheckRow]:
    if not reachable:
        return []
    versions = probes.node_versions(cluster, tuple(reachable))
    rows = []
    reference = None
    for node in reachable:
        found = versions.get(node.name, {})
        if "error" in found:
            rows.append(CheckRow("trainer env", node.name, False, f"{cluster.python}: {found['error']}"))
            continue
        reference = reference or found
        same = found == reference
        summary = (
            f"python {found.get('python')}, torch {found.get('torch')}, freeze {found.get('freeze_sha')}"
        )
        differs = [k for k in found if found.get(k) != reference.get(k)]
        rows.append(
            CheckRow(
                "trainer env",
                node.name,
                same,
                summary if same else f"{summary}; differs from the first node in {', '.join(differs)}",
            )
        )
    return rows


def _service_state(node_states: dict[str, dict[str, str]], node: str, unit: str) -> str | None:
    """systemd's active state of one unit on one node (active, failed, ...); None where not installed."""
    return node_states.get(node, {}).get(f"service.{unit}")


def _check_services(cluster: Cluster, node_states: dict[str, dict[str, str]]) -> list[CheckRow]:
    rows: list[CheckRow] = []
    master = cluster.master
    if master is None or master.name not in node_states:
        return rows
    units = _service_units(cluster)
    spark_unit = units["spark_master_service"]
    spark_state = _service_state(node_states, master.name, spark_unit)
    if spark_state:
        alive = probes.spark_alive_workers(cluster)
        expected = len(cluster.workers)
        detail = f"{spark_unit} {spark_state}; {alive}/{expected} workers alive"
        if cluster.device == "cuda":
            detail += f"; GPUs offered: {spark_worker_gpus(cluster)}"
        rows.append(
            CheckRow(
                "spark master",
                master.name,
                alive == expected and spark_state == "active",
                detail,
            )
        )
    else:
        rows.append(
            CheckRow(
                "spark master", master.name, False, f"no {spark_unit} unit; run ansible-playbook site.yml"
            )
        )
    postgres_unit = units["postgresql_service"]
    if _service_state(node_states, master.name, postgres_unit):
        ready = remote.run(master, f"pg_isready -q -h 127.0.0.1 -p {cluster.postgresql_port}", timeout=20)
        rows.append(
            CheckRow(
                "postgresql",
                master.name,
                ready.ok,
                f"accepting connections on {cluster.postgresql_port}"
                if ready.ok
                else f"pg_isready exit {ready.exit_code}",
            )
        )
    else:
        rows.append(
            CheckRow(
                "postgresql", master.name, False, f"no {postgres_unit} unit; run ansible-playbook site.yml"
            )
        )
    if cluster.has_determined_master:
        master_unit, agent_unit = units["determined_master_service"], units["determined_agent_service"]
        state = _service_state(node_states, master.name, master_unit)
        rows.append(
            CheckRow(
                "determined master",
                master.name,
                state == "active",
                f"{master_unit} {state or 'not installed'}",
            )
        )
        for worker in cluster.workers:
            state = _service_state(node_states, worker.name, agent_unit)
            rows.append(
                CheckRow(
                    "determined agent",
                    worker.name,
                    state == "active",
                    f"{agent_unit} {state or 'not installed'}",
                )
            )
    else:
        rows.append(
            CheckRow(
                "determined",
                master.name,
                True,
                "binaries not installed here (determined_install_binaries: false): cells run the "
                "Core API off-cluster",
                required=False,
            )
        )
    return rows


def spark_worker_gpus(cluster: Cluster) -> int:
    """GPUs the Spark master sees on its alive workers (the study's Listings 4.2/4.3 make them visible)."""

    return sum(len((worker.get("resources") or {}).get("gpu", {}).get("addresses", []))
               for worker in probes.spark_alive_worker_info(cluster))


def failed(rows: list[CheckRow]) -> list[CheckRow]:
    return [r for r in rows if r.required and not r.ok]


def render(rows: list[CheckRow], cluster: Cluster, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(highlight=False)
    table = Table(title=f"cluster.check: {cluster.name} ({cluster.inventory_path.name})", show_lines=False)
    for column in ("check", "node", "status", "detail"):
        table.add_column(column, overflow="fold")
    for row in rows:
        status = "[green]ok[/]" if row.ok else ("[red]FAIL[/]" if row.required else "[yellow]note[/]")
        table.add_row(row.check, row.node, status, row.detail)
    console.print(table)
    bad = failed(rows)
    console.print(f"[red]{len(bad)} check(s) failed[/]" if bad else "[green]all checks passed[/]")


# --- reset -------------------------------------------------------------------------------


def reset(cluster: Cluster, console=None, recorded_cells: set[str] | None = None) -> list[CheckRow]:
    """Stop, restart, clear scratch of unrecorded cells; return cluster.check's rows. Safe to repeat."""
    from rich.console import Console

    console = console or Console(highlight=False)
    say = console.print
    say("[bold]1/5[/] stopping dtlab units and containers on every node")
    stop = (
        f"{_stop_units_command()}; "
        "if command -v docker >/dev/null; then ids=$(docker ps -aq --filter name=^dtlab-ddp-g); "
        '[ -n "$ids" ] && docker rm -f $ids >/dev/null; fi; true'
    )
    # A node that does not answer is reported once per step and skipped by the later steps; every
    # step runs for the nodes that answer, and the check's table at the end shows what is wrong.
    unreachable: set[str] = set()

    def on(nodes) -> list[Node]:
        return [node for node in nodes if node.name not in unreachable]

    def step(nodes, command: str, what: str, timeout: int) -> None:
        answers = remote.run_all(on(nodes), command, timeout=timeout)
        _report_failures(say, answers, what)
        unreachable.update(name for name, answer in answers.items() if isinstance(answer, BaseException))

    step(cluster.nodes, stop, "stop units", 90)
    masters = [cluster.master] if cluster.master is not None else []
    units = _service_units(cluster)
    say("[bold]2/5[/] restarting Spark (ends running applications)")
    step(masters, _restart_command(units["spark_master_service"]), "restart spark master", 120)
    step(cluster.workers, _restart_command(units["spark_worker_service"]), "restart spark workers", 120)

    say("[bold]3/5[/] Determined: cancel experiments, restart master and agents")
    determined_rows: list[CheckRow] = []
    if cluster.has_determined_master and on(masters):
        determined_rows = _cancel_determined_experiments(cluster, say)
        step(masters, _restart_command(units["determined_master_service"]), "restart determined master", 120)
        restart_agents = _restart_command(units["determined_agent_service"])
        step(cluster.workers, restart_agents, "restart determined agents", 120)
    elif cluster.has_determined_master:
        say("  the master does not answer; skipped")
    else:
        say("  not installed on this inventory; nothing to do")

    say("[bold]4/5[/] clearing scratch and checkpoints of unfinished cells (recorded results stay)")
    keep = " ".join(shlex.quote(k) for k in sorted(recorded_cells or ()))
    clear = (
        f'cd {shlex.quote(cluster.runs_dir)} 2>/dev/null || exit 0; for d in *; do [ -d "$d" ] || continue; '
        f'case " {keep} " in *" $d "*) continue;; esac; rm -rf -- "$d"; done'
    )
    step(cluster.nodes, clear, "clear scratch", 120)

    say("[bold]5/5[/] waiting for Spark workers to register, then cluster.check")
    if on(masters):
        probes.wait_for_spark(cluster, len(on(cluster.workers)), SPARK_READY_TIMEOUT_S)
    return determined_rows + check(cluster)


def _stop_units_command() -> str:
    pattern = " ".join(shlex.quote(p + ".service") for p in remote.CELL_UNIT_PATTERNS)
    return (
        f"systemctl stop {pattern} 2>/dev/null; systemctl kill --signal=SIGKILL {pattern} 2>/dev/null; "
        f"systemctl reset-failed {pattern} 2>/dev/null; true"
    )


def _restart_command(unit: str) -> str:
    """Restart <unit>.service where it is installed (not installed: nothing, exit 0)."""
    service = shlex.quote(unit + ".service")
    return (
        f'[ -z "$(systemctl list-unit-files --plain --no-legend {service})" ] || systemctl restart {service}'
    )


def _report_failures(say, answers: dict[str, Any], what: str) -> None:
    for name, answer in answers.items():
        if isinstance(answer, BaseException):
            say(f"  [red]{name}: {what}: {answer}[/]")
        elif not answer.ok:
            say(
                f"  [red]{name}: {what}: exit {answer.exit_code} "
                f"{(answer.stderr or answer.stdout).strip()[-200:]}[/]"
            )


def _cancel_determined_experiments(cluster: Cluster, say) -> list[CheckRow]:
    """Kill every unfinished experiment, as admin with the master's own password. A failed login (wrong or
    missing password, master not answering) is a failed row of reset's table, never a silent skip."""
    from dtlab import detmaster

    assert cluster.master is not None
    try:
        det = detmaster.connect(cluster)
    except DtlabError as error:
        say(f"  [red]{error}[/]")
        return [CheckRow("determined login", cluster.master.name, False,
                         f"{error}; experiments not cancelled")]
    killed = []
    try:
        for experiment in det.list_experiments():
            state = str(getattr(experiment, "state", ""))
            if any(s in state.upper() for s in ("ACTIVE", "PAUSED", "QUEUED", "RUNNING")):
                experiment.kill()
                killed.append(experiment.id)
                say(f"  killed experiment {experiment.id}")
    except Exception as error:  # the SDK raises its own types
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        say(f"  [red]determined: could not cancel experiments: {first_line}[/]")
        return [CheckRow("determined experiments", cluster.master.name, False,
                         f"could not cancel experiments ({first_line}); killed so far: {killed or 'none'}")]
    return [CheckRow("determined login", cluster.master.name, True,
                     f"{detmaster.ADMIN_USER} at {detmaster.master_url(cluster)};"
                     f" {len(killed)} experiment(s) killed")]


def check_or_raise(cluster: Cluster, console=None) -> list[CheckRow]:
    rows = check(cluster)
    render(rows, cluster, console)
    if failed(rows):
        raise ClusterUnhealthy(f"cluster.check: {len(failed(rows))} check(s) failed on {cluster.name}")
    return rows


class ClusterUnhealthy(DtlabError):
    exit_code = 1
