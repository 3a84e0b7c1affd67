"""cluster.check (is the cluster fit to run the matrix?) and cluster.reset (back to a clean, known state).

check: SSH to every node; GPUs seen by nvidia-smi where the inventory expects them; one identical trainer
environment on every node; clock skew; free disk; each node's socket interface; on a cuda inventory each
GPU usable from the trainer's venv (CUDA, arch list, a matmul); and each platform's own rows
(dtlab.platforms: its services up, its workers alive, the GPUs it offers). One table.

reset: stop every dtlab unit and container on every node, then each platform's own step (end its jobs,
restart its services), clear node scratch and checkpoints of cells not recorded ok, wait for each
platform's services, then run check. Recorded results (on the controller) are never touched.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass
from typing import Any

from dtlab import platforms, probes, remote
from dtlab.checks import CheckRow, NodeStates, failed
from dtlab.errors import DtlabError
from dtlab.gpucompat import code_runs_on
from dtlab.inventory import Cluster, Node
from dtlab.platforms.base import NO_GPU_CPU_INVENTORY, ResetSteps

SERVICES_READY_TIMEOUT_S = 90  # after a reset: each platform's services take cells again
# The one probe script per node, all nodes at once. It imports torch (Horovod's probe): on a 2-core machine
# running the lab's three nodes and the tests beside them, it took over 30 s on every node at once.
PROBE_TIMEOUT_S = 90


def threshold(cluster: Cluster, key: str) -> float:
    """A health threshold from the inventory (group_vars/all.yml, the lab's in lab.yml): a number >= 0."""
    value = cluster.require(key)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if isinstance(value, bool) or not number >= 0:
        raise DtlabError(f"inventory {cluster.inventory_path}: {key} {value!r} is not a threshold; "
                         "use a number >= 0 (group_vars/all.yml has the default)")
    return number


# The systemd units check and reset look for, each named by its variable in the inventory's group_vars:
# every platform's own (dtlab.platforms).
SERVICE_VARIABLES = tuple(variable for platform in platforms.ALL for variable in platform.service_variables)


def _service_units(cluster: Cluster) -> dict[str, str]:
    """{variable: unit name} of the provisioned services, as the inventory names them."""
    return {variable: unit for platform in platforms.ALL
            for variable, unit in platform.units(cluster).items()}


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
            *(line for platform in platforms.ALL for line in platform.probe_lines(cluster, node)),
            "echo time_end=$(date +%s.%N)",  # with time=, takes the script's own time out of the skew
        ]
    )


def clock_offset(sent: float, node_start: float, node_end: float, received: float) -> tuple[float, float]:
    """(offset, delay) of the node's clock against the controller's, as NTP computes them: the
    controller's send and receive times and the node's at the start and end of its script. The
    script's own time (its systemctl calls take seconds on a loaded node) is taken out of the round
    trip, so only the network's part of it, assumed symmetric, is uncertain."""
    offset = ((node_start - sent) + (node_end - received)) / 2
    delay = max(0.0, (received - sent) - (node_end - node_start))
    return offset, delay


def _parse_probe(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def probe_timeout_rows(node: Node, result: remote.CommandResult) -> list[CheckRow]:
    """The row that says why a node's probe rows all lack answers: the script ran out of time, answering
    nothing; none where it answered."""
    if result.exit_code != remote.TIMED_OUT or _parse_probe(result.stdout):
        return []
    return [CheckRow("probe", node.name, False, f"the probe script gave no answer within {PROBE_TIMEOUT_S} "
                     "s: the node too loaded, or a command in it hung")]


def check(cluster: Cluster) -> list[CheckRow]:
    rows: list[CheckRow] = []
    max_skew_s = threshold(cluster, "dtlab_max_clock_skew_s")
    min_free_gb = threshold(cluster, "dtlab_min_free_disk_gb")
    node_states: NodeStates = {}  # per node: the probe script's key=value answers

    def probe(node: Node) -> tuple[float, remote.CommandResult, float]:
        # The SSH handshake happens before the clock starts: it is one-sided and would bias the skew.
        connection, script = sessions.connection(node), _probe_script(cluster, node)
        sent = time.time()
        answer = remote.run(node, script, timeout=PROBE_TIMEOUT_S, connection=connection)
        return sent, answer, time.time()

    with remote.Sessions() as sessions:
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
        rows += probe_timeout_rows(node, result)  # first: every row below lacks its answer then
        try:
            skew, delay = clock_offset(sent, float(values["time"]), float(values["time_end"]), received)
            # The node read its clock somewhere inside the network's part of the round trip: allow half
            # of it as uncertainty.
            rows.append(
                CheckRow(
                    "clock skew",
                    node.name,
                    abs(skew) <= max_skew_s + delay / 2,
                    f"{skew:+.2f} s (limit ±{max_skew_s:g} s, round trip {delay:.2f} s)",
                    value=skew,
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
                    f"{free_gb:.1f} GiB free under {cluster.runs_dir} (need {min_free_gb:g})",
                    value=free_gb,
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
    for platform in platforms.ALL:
        rows += platform.check_rows(cluster, node_states)
    rows += check_socket_interfaces(cluster, [n for n in cluster.nodes if n.name in node_states])
    rows += check_gpus(cluster, [n for n in cluster.workers if n.name in node_states])
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


# --- the socket interface: the file the common role wrote, naming an interface the node has ------------

def check_socket_interfaces(cluster: Cluster, reachable: list[Node]) -> list[CheckRow]:
    """One row per node: the interface its trainer units get (cluster.socket_env_file), and its addresses."""
    path = shlex.quote(cluster.socket_env_file)
    command = (f"i=$(sed -n 's/^GLOO_SOCKET_IFNAME=//p' {path} 2>/dev/null); echo \"ifname=$i\"; "
               '[ -n "$i" ] && echo "addresses=$(ip -o addr show dev "$i" 2>/dev/null '
               "| awk '{print $4}' | tr '\\n' ' ')\"")
    rows = []
    for name, answer in remote.run_all(reachable, command, timeout=30).items():
        if isinstance(answer, BaseException):
            rows.append(CheckRow("socket interface", name, False, str(answer)))
            continue
        rows.append(socket_interface_row(cluster, cluster.node(name), _parse_probe(answer.stdout)))
    return rows


def socket_interface_row(cluster: Cluster, node: Node, values: dict[str, str]) -> CheckRow:
    ifname, addresses = values.get("ifname", ""), values.get("addresses", "").split()
    if not ifname:
        return CheckRow("socket interface", node.name, False,
                        f"no interface in {cluster.socket_env_file}; run ansible-playbook site.yml")
    if not addresses:
        return CheckRow("socket interface", node.name, False,
                        f"{ifname} (from {cluster.socket_env_file}) has no address on the node")
    holds = any(a.split("/")[0] == node.address for a in addresses)
    source = "" if holds else f" (the inventory's dtlab_socket_ifname; {node.address} is elsewhere)"
    return CheckRow("socket interface", node.name, True, f"{ifname} {' '.join(addresses)}{source}")


# --- GPUs: usable from the trainer's venv, offered by Determined's agents and Spark's workers ---------
# Only on a cuda inventory; on a cpu one each row says so instead (nothing to prove there).

# Run by the trainer venv's python on a GPU node, with CUDA_VISIBLE_DEVICES = the node's gpu_indices
# (as the trainer runs): one JSON line.
GPU_PROBE = """
import json, torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available(),
       "arch_list": [], "devices": []}
if out["available"]:
    out["arch_list"] = torch.cuda.get_arch_list()
    a = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64) / 4096
    expected = a @ a
    for i in range(torch.cuda.device_count()):
        device = {"index": i, "name": torch.cuda.get_device_name(i),
                  "capability": list(torch.cuda.get_device_capability(i))}
        try:
            on_gpu = (a.to(f"cuda:{i}") @ a.to(f"cuda:{i}")).cpu()
            device["matmul_max_error"] = float((on_gpu - expected).abs().max())
        except Exception as error:
            lines = str(error).strip().splitlines()
            device["error"] = type(error).__name__ + (": " + lines[0] if lines else "")
        out["devices"].append(device)
print(json.dumps(out))
"""
MATMUL_TOLERANCE = 1e-3  # |GPU - CPU| of a 64x64 float32 product of values in [0, 1)


def check_gpus(cluster: Cluster, workers: list[Node]) -> list[CheckRow]:
    """Per worker: every GPU usable by the trainer's torch, then what each platform offers of them."""
    platform_rows = [row for platform in platforms.ALL for row in platform.gpu_rows(cluster, workers)]
    if cluster.device != "cuda":
        return [CheckRow("gpu usable", w.name, True, NO_GPU_CPU_INVENTORY, required=False)
                for w in workers] + platform_rows
    gpu_workers = [w for w in workers if w.uses_gpu]
    rows = [CheckRow("gpu usable", w.name, True, "no GPU (gpu_indices empty)", required=False)
            for w in workers if not w.uses_gpu]

    def probe(node: Node) -> remote.CommandResult:
        visible = ",".join(str(i) for i in node.gpu_indices)
        command = f"CUDA_VISIBLE_DEVICES={visible} {shlex.quote(cluster.python)} -c {shlex.quote(GPU_PROBE)}"
        return remote.run(node, command, timeout=180)

    answers = remote.fan_out(gpu_workers, probe)
    for worker in gpu_workers:
        answer = answers[worker.name]
        if isinstance(answer, BaseException):
            rows.append(CheckRow("gpu usable", worker.name, False, str(answer)))
            continue
        try:
            report = json.loads(answer.stdout.strip().splitlines()[-1]) if answer.ok else None
        except (ValueError, IndexError):
            report = None
        if report is None:
            error = (answer.stderr or answer.stdout).strip()[-200:] or f"exit {answer.exit_code}"
            rows.append(CheckRow("gpu usable", worker.name, False, f"{cluster.python}: {error}"))
            continue
        rows += gpu_usable_rows(worker, report)
    return rows + platform_rows


def arch_runs_on(capability: tuple[int, int], arch_list: list[str]) -> str | None:
    """The entry of torch.cuda.get_arch_list() whose code runs on a device of this compute capability:
    sm_XY (a cubin) on X.Y' with Y' >= Y; compute_XY (PTX, compiled by the driver) on any X.Y and newer;
    sm_XYa only on X.Y itself. None: torch has no kernel for the device."""
    for entry in arch_list:
        match = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", entry)
        if not match:
            continue
        number = int(match.group(2))
        kind = "ptx" if match.group(1) == "compute" else "sass-a" if match.group(3) == "a" else "sass"
        if code_runs_on(capability, (number // 10, number % 10), kind):
            return entry
    return None


def gpu_usable_rows(node: Node, report: dict[str, Any]) -> list[CheckRow]:
    """Rows from GPU_PROBE's JSON on one node: CUDA available, each expected device present, torch built
    for its capability, and a matmul on it that matches the CPU's."""
    torch_build = f"torch {report.get('torch')}" + (f", CUDA {report['cuda']}" if report.get("cuda") else "")
    if not report.get("available"):
        reason = ("a CPU-only build" if not report.get("cuda")
                  else "the driver or the device is not usable (nvidia-smi on the node says why)")
        return [CheckRow("gpu usable", node.name, False, f"CUDA not available to {torch_build}: {reason}")]
    devices = report.get("devices") or []
    rows = []
    if len(devices) != len(node.gpu_indices):
        rows.append(CheckRow("gpu usable", node.name, False,
                             f"{len(devices)} GPU(s) visible to torch; inventory expects gpu_indices "
                             f"{list(node.gpu_indices)}"))
    arch_list = list(report.get("arch_list") or [])
    for device, index in zip(devices, node.gpu_indices, strict=False):
        major, minor = device.get("capability") or (0, 0)
        where = f"GPU {index} ({device.get('name')}, sm_{major}{minor})"
        runs = arch_runs_on((major, minor), arch_list)
        if runs is None:
            rows.append(CheckRow("gpu usable", node.name, False,
                                 f"{where}: {torch_build} has no kernels for it (arch list "
                                 f"{' '.join(arch_list) or 'empty'}); install a torch build that covers "
                                 f"sm_{major}{minor}"))
        elif "error" in device:
            rows.append(CheckRow("gpu usable", node.name, False,
                                 f"{where}: matmul failed: {device['error']}"))
        elif not device.get("matmul_max_error", 1.0) <= MATMUL_TOLERANCE:
            rows.append(CheckRow("gpu usable", node.name, False, f"{where}: matmul differs from the "
                                 f"CPU's by {device.get('matmul_max_error')}"))
        else:
            rows.append(CheckRow("gpu usable", node.name, True,
                                 f"{where}: {torch_build} runs it ({runs}); matmul matches the CPU's"))
    return rows


def render(rows: list[CheckRow], cluster: Cluster, console=None, command: str = "cluster.check") -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(highlight=False)
    table = Table(title=f"{command}: {cluster.name} ({cluster.inventory_path.name})", show_lines=False)
    for column in ("check", "node", "status", "detail"):
        table.add_column(column, overflow="fold")
    for row in rows:
        status = "[green]ok[/]" if row.ok else ("[red]FAIL[/]" if row.required else "[yellow]note[/]")
        table.add_row(row.check, row.node, status, row.detail)
    console.print(table)
    bad = failed(rows)
    console.print(f"[red]{len(bad)} check(s) failed[/]" if bad else "[green]all checks passed[/]")


# --- reset -------------------------------------------------------------------------------


@dataclass
class ResetOutcome:
    """What cluster.reset did: cluster.check's rows at the end (none when no node answered), and the
    nodes that did not answer (each said once, in one line, and skipped by every step)."""

    rows: list[CheckRow]
    unreachable: list[str]


def reset(cluster: Cluster, console=None, recorded_cells: set[str] | None = None) -> ResetOutcome:
    """Stop, restart, clear scratch of unrecorded cells; then cluster.check on the nodes that answered.
    Safe to repeat."""
    from rich.console import Console

    console = console or Console(highlight=False)

    def say(line: str) -> None:
        console.print(line, soft_wrap=True)  # one line each, also on a narrow terminal

    total = len(platforms.ALL) + 3
    say(f"[bold]1/{total}[/] stopping dtlab units and containers on every node")
    stop = (
        f"{_stop_units_command()}; "
        f"if command -v docker >/dev/null; then ids=$(docker ps -aq --filter name=^{remote.UNIT_PREFIX}); "
        '[ -n "$ids" ] && docker rm -f $ids >/dev/null; fi; true'
    )
    # A node that does not answer is said once, in this first step, and skipped by the later ones; every
    # step runs for the nodes that answer.
    unreachable: list[str] = []

    def reachable(nodes) -> list[Node]:
        return [node for node in nodes if node.name not in unreachable]

    def run(nodes, command: str, what: str, timeout: int) -> None:
        answers = remote.run_all(reachable(nodes), command, timeout=timeout)
        _report_failures(say, answers, what)
        unreachable.extend(name for name, answer in answers.items() if isinstance(answer, BaseException))

    run(cluster.nodes, stop, "stop units", 90)
    if not reachable(cluster.nodes):
        return ResetOutcome([], unreachable)
    steps = ResetSteps(cluster, say, run, reachable)
    platform_rows: list[CheckRow] = []
    for index, platform in enumerate(platforms.ALL, start=2):
        say(f"[bold]{index}/{total}[/] {platform.reset_title}")
        platform_rows += platform.reset(steps)

    say(f"[bold]{total - 1}/{total}[/] clearing scratch and checkpoints of unfinished cells "
        "(recorded results stay)")
    keep = " ".join(shlex.quote(k) for k in sorted(recorded_cells or ()))

    def clear(directory: str) -> str:
        return (f'cd {shlex.quote(directory)} 2>/dev/null || exit 0; for d in *; do [ -d "$d" ] || continue; '
                f'case " {keep} " in *" $d "*) continue;; esac; rm -rf -- "$d"; done')

    run(cluster.nodes, clear(cluster.runs_dir), "clear scratch", 120)
    if cluster.shared_checkpoint_dir and reachable(cluster.workers):  # one mount: cleared from one node
        first_worker = reachable(cluster.workers)[:1]
        run(first_worker, clear(cluster.shared_checkpoint_dir), "clear shared checkpoints", 120)

    say(f"[bold]{total}/{total}[/] waiting for each platform's services to take cells again, "
        "then cluster.check")
    if steps.masters:
        for platform in platforms.ALL:
            platform.wait_ready(cluster, reachable(cluster.workers), SERVICES_READY_TIMEOUT_S)
    # The nodes said above are not said again, row by row, in the table.
    rows = [row for row in platform_rows + check(cluster) if row.node not in unreachable]
    return ResetOutcome(rows, unreachable)


def _stop_units_command() -> str:
    pattern = " ".join(shlex.quote(p + ".service") for p in remote.CELL_UNIT_PATTERNS)
    return (
        f"systemctl stop {pattern} 2>/dev/null; systemctl kill --signal=SIGKILL {pattern} 2>/dev/null; "
        f"systemctl reset-failed {pattern} 2>/dev/null; true"
    )


def _report_failures(say, answers: dict[str, Any], what: str) -> None:
    for name, answer in answers.items():
        if isinstance(answer, BaseException):
            say(f"  [red]{name}: does not answer, skipped from here on: {answer}[/]")
        elif not answer.ok:
            say(
                f"  [red]{name}: {what}: exit {answer.exit_code} "
                f"{(answer.stderr or answer.stdout).strip()[-200:]}[/]"
            )


def check_or_raise(cluster: Cluster, console=None) -> list[CheckRow]:
    rows = check(cluster)
    render(rows, cluster, console)
    if failed(rows):
        raise ClusterUnhealthy(f"cluster.check: {len(failed(rows))} check(s) failed on {cluster.name}")
    return rows


class ClusterUnhealthy(DtlabError):
    exit_code = 1
