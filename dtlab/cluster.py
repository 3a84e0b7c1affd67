"""cluster.check (is the cluster fit to run the matrix?) and cluster.reset (back to a clean, known state).

check: SSH to every node; GPUs seen by nvidia-smi where the inventory expects them; one identical trainer
environment on every node; the Spark master alive with all its workers (and their GPUs); the Determined
master and agents where installed; PostgreSQL on the master; clock skew; free disk; each node's socket
interface; on a cuda inventory each GPU usable from the trainer's venv (CUDA, arch list, a matmul), each
Determined agent's CUDA slots and each Spark worker's GPU amount. One table.

reset: stop every dtlab unit and container on every node, restart Spark (which ends its applications),
cancel Determined experiments (as admin, with the master's own password: a failed login is a failed row)
and restart its services where installed, clear node scratch and checkpoints of cells not recorded ok,
then run check. Recorded results (on the controller) are never touched.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass
from typing import Any

from dtlab import probes, remote
from dtlab.errors import DtlabError
from dtlab.gpucompat import code_runs_on
from dtlab.inventory import Cluster, Node

SERVICES_READY_TIMEOUT_S = 90  # after a reset: Spark workers registered, Ray workers joined
@dataclass(frozen=True)
class CheckRow:
    check: str
    node: str
    ok: bool
    detail: str
    required: bool = True  # informational rows never fail the check
    value: float | None = None  # the measured number the verdict judged (clock skew s, free GiB), for JSON


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


# The systemd units check and reset look for, each named by its variable in the inventory's group_vars.
SERVICE_VARIABLES = (
    "spark_master_service",
    "spark_worker_service",
    "postgresql_service",
    "determined_master_service",
    "determined_agent_service",
    "ray_head_service",
    "ray_worker_service",
    "munge_service",
    "slurmctld_service",
    "slurmd_service",
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
    max_skew_s = threshold(cluster, "dtlab_max_clock_skew_s")
    min_free_gb = threshold(cluster, "dtlab_min_free_disk_gb")
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
                    abs(skew) <= max_skew_s + (received - sent) / 2,
                    f"{skew:+.2f} s (limit ±{max_skew_s:g} s, round trip {received - sent:.2f} s)",
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
    rows += _check_services(cluster, node_states)
    rows += check_socket_interfaces(cluster, [n for n in cluster.nodes if n.name in node_states])
    rows += check_gpus(cluster, [n for n in cluster.workers if n.name in node_states])
    rows += check_determined_trial_image(cluster, [n for n in cluster.workers if n.name in node_states])
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
    rows += _check_ray(cluster, node_states, units)
    rows += _check_slurm(cluster, node_states, units)
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


def _check_ray(
    cluster: Cluster, node_states: dict[str, dict[str, str]], units: dict[str, str]
) -> list[CheckRow]:
    """The Ray head (its unit, and which worker nodes it sees alive with what they offer) and each
    worker's raylet unit."""
    master = cluster.master
    head_unit, worker_unit = units["ray_head_service"], units["ray_worker_service"]
    state = _service_state(node_states, master.name, head_unit)
    if not state:
        missing = f"no {head_unit} unit; run ansible-playbook site.yml"
        return [CheckRow("ray head", master.name, False, missing)]
    try:
        alive = probes.ray_alive_workers(cluster)
    except DtlabError as error:
        return [CheckRow("ray head", master.name, False, f"{head_unit} {state}; {error}")]
    resource = "GPU" if cluster.device == "cuda" else "CPU"
    offered = sum(node.get("resources_total", {}).get(resource, 0) for node in alive)
    rows = [CheckRow("ray head", master.name, state == "active" and len(alive) == len(cluster.workers),
                     f"{head_unit} {state}; {len(alive)}/{len(cluster.workers)} worker nodes alive; "
                     f"{resource}s offered: {offered:g}")]
    for worker in cluster.workers:
        state = _service_state(node_states, worker.name, worker_unit)
        rows.append(CheckRow("ray worker", worker.name, state == "active",
                             f"{worker_unit} {state or 'not installed'}"))
    return rows


def _check_slurm(
    cluster: Cluster, node_states: dict[str, dict[str, str]], units: dict[str, str]
) -> list[CheckRow]:
    """slurmctld (its unit, and dtlab's partition as sinfo shows it) and each worker's slurmd and munge,
    with the node's Slurm state (idle, alloc, drain, down*: a trailing * means slurmd does not answer)."""
    master = cluster.master
    ctld_unit, slurmd_unit, munge_unit = (units["slurmctld_service"], units["slurmd_service"],
                                          units["munge_service"])
    state = _service_state(node_states, master.name, ctld_unit)
    if not state:
        return [CheckRow("slurm controller", master.name, False,
                         f"no {ctld_unit} unit; run ansible-playbook site.yml")]
    try:
        slurm_states = probes.slurm_node_states(cluster)
    except DtlabError as error:
        return [CheckRow("slurm controller", master.name, False, f"{ctld_unit} {state}; {error}")]
    usable = [w for w in cluster.workers if slurm_states.get(w.name) in probes.SLURM_USABLE_STATES]
    all_up = state == "active" and len(usable) == len(cluster.workers)
    rows = [CheckRow("slurm controller", master.name, all_up,
                     f"{ctld_unit} {state}; partition {cluster.var('slurm_partition')}: "
                     f"{len(usable)}/{len(cluster.workers)} workers up")]
    for worker in cluster.workers:
        daemon = _service_state(node_states, worker.name, slurmd_unit)
        munge = _service_state(node_states, worker.name, munge_unit)
        slurm_state = slurm_states.get(worker.name, "not in the partition")
        rows.append(CheckRow("slurm node", worker.name,
                             daemon == "active" and munge == "active" and worker in usable,
                             f"{slurmd_unit} {daemon or 'not installed'}, "
                             f"{munge_unit} {munge or 'not installed'}; Slurm says {slurm_state}"))
    return rows


def check_determined_trial_image(cluster: Cluster, workers: list[Node]) -> list[CheckRow]:
    """Per agent: Docker there has determined_trial_image and its python3 can install the pins, as
    startup-hook.sh will ask it to in every trial (dtlab.launch.determined.check_trial_image)."""
    if not cluster.has_determined_master:
        return [CheckRow("determined trial image", worker.name, True, "Determined not installed here",
                         required=False) for worker in workers]
    from dtlab.launch import determined

    return [CheckRow("determined trial image", verdict.node, verdict.ok, verdict.detail)
            for verdict in determined.check_trial_image(cluster, workers)]


def spark_worker_gpus(cluster: Cluster) -> int:
    """GPUs the Spark master sees on its alive workers (the study's Listings 4.2/4.3 make them visible)."""

    return sum(len((worker.get("resources") or {}).get("gpu", {}).get("addresses", []))
               for worker in probes.spark_alive_worker_info(cluster))


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
NO_GPU_CPU_INVENTORY = "no GPU (cpu inventory)"

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
    """Per worker: every GPU usable by the trainer's torch, Determined's slots, Spark's GPU amount."""
    if cluster.device != "cuda":
        return [CheckRow(check, worker.name, True, NO_GPU_CPU_INVENTORY, required=False)
                for worker in workers for check in ("gpu usable", "determined slots", "spark GPUs")]
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

    if cluster.has_determined_master:
        from dtlab import detmaster

        try:
            rows += determined_slot_rows(gpu_workers, detmaster.agents(cluster))
        except DtlabError as error:
            rows += [CheckRow("determined slots", w.name, False, str(error)) for w in gpu_workers]
    else:
        rows += [CheckRow("determined slots", w.name, True, "Determined not installed here", required=False)
                 for w in gpu_workers]
    rows += spark_gpu_rows(gpu_workers, probes.spark_alive_worker_info(cluster))
    return rows


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


def determined_slot_rows(workers: list[Node], agents: list[dict[str, Any]]) -> list[CheckRow]:
    """Each GPU worker's agent (determined_agent_id, default its name) registered with one CUDA slot per
    GPU in gpu_indices: an agent whose driver is broken registers with none and only logs a warning."""
    by_id = {str(agent.get("id")): agent for agent in agents}
    rows = []
    for worker in workers:
        agent_id = str(worker.var("determined_agent_id") or worker.name)
        expected = len(worker.gpu_indices)
        agent = by_id.get(agent_id)
        if agent is None:
            known = ", ".join(sorted(by_id)) or "none"
            rows.append(CheckRow("determined slots", worker.name, False,
                                 f"agent {agent_id} is not registered with the master (agents: {known})"))
            continue
        slots = list((agent.get("slots") or {}).values())
        cuda = [s for s in slots
                if (s.get("device") or {}).get("type") == "TYPE_CUDA" and s.get("enabled", True)]
        rows.append(CheckRow("determined slots", worker.name, len(cuda) == expected,
                             f"agent {agent_id}: {len(cuda)} CUDA slot(s) of {len(slots)},"
                             f" expected {expected}"))
    return rows


def spark_gpu_rows(workers: list[Node], alive: list[dict[str, Any]]) -> list[CheckRow]:
    """Each GPU worker alive on the Spark master (its /json/ "workers") with one GPU address per GPU."""
    rows = []
    for worker in workers:
        entries = [w for w in alive if w.get("host") == worker.address]
        expected = len(worker.gpu_indices)
        if not entries:
            rows.append(CheckRow("spark GPUs", worker.name, False,
                                 f"no alive Spark worker on {worker.address} at the master"))
            continue
        addresses = (entries[0].get("resources") or {}).get("gpu", {}).get("addresses", [])
        rows.append(CheckRow("spark GPUs", worker.name, len(addresses) == expected,
                             f"gpu amount {len(addresses)} (addresses {','.join(addresses) or 'none'}),"
                             f" expected {expected}"))
    return rows


def failed(rows: list[CheckRow]) -> list[CheckRow]:
    return [r for r in rows if r.required and not r.ok]


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


def reset(cluster: Cluster, console=None, recorded_cells: set[str] | None = None) -> list[CheckRow]:
    """Stop, restart, clear scratch of unrecorded cells; return cluster.check's rows. Safe to repeat."""
    from rich.console import Console

    console = console or Console(highlight=False)
    say = console.print
    say("[bold]1/7[/] stopping dtlab units and containers on every node")
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
    say("[bold]2/7[/] restarting Spark (ends running applications)")
    step(masters, _restart_command(units["spark_master_service"]), "restart spark master", 120)
    step(cluster.workers, _restart_command(units["spark_worker_service"]), "restart spark workers", 120)

    say("[bold]3/7[/] Determined: cancel experiments, restart master and agents")
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

    say("[bold]4/7[/] Ray: stop its jobs, restart the head, then the workers (they rejoin the new head)")
    if on(masters):
        try:
            stopped = probes.stop_ray_jobs(cluster)
            say(f"  stopped {len(stopped)} Ray job(s)" if stopped else "  no Ray job running")
        except DtlabError as error:
            say(f"  [yellow]could not list Ray jobs ({error}); the restart ends them[/]")
    step(masters, _restart_command(units["ray_head_service"]), "restart ray head", 120)
    step(cluster.workers, _restart_command(units["ray_worker_service"]), "restart ray workers", 120)

    say("[bold]5/7[/] Slurm: cancel dtlab's jobs, start slurmd where it is down, resume drained nodes")
    step(masters, f"scancel --user={shlex.quote(cluster.user)} 2>/dev/null; true", "cancel slurm jobs", 60)
    slurmd = shlex.quote(units["slurmd_service"] + ".service")
    start_slurmd = (f'[ -z "$(systemctl list-unit-files --plain --no-legend {slurmd})" ] || '
                    f"systemctl is-active -q {slurmd} || systemctl restart {slurmd}")
    step(cluster.workers, start_slurmd, "start slurmd", 120)
    if on(masters):
        _resume_slurm_nodes(cluster, say)

    say("[bold]6/7[/] clearing scratch and checkpoints of unfinished cells (recorded results stay)")
    keep = " ".join(shlex.quote(k) for k in sorted(recorded_cells or ()))

    def clear(directory: str) -> str:
        return (f'cd {shlex.quote(directory)} 2>/dev/null || exit 0; for d in *; do [ -d "$d" ] || continue; '
                f'case " {keep} " in *" $d "*) continue;; esac; rm -rf -- "$d"; done')

    step(cluster.nodes, clear(cluster.runs_dir), "clear scratch", 120)
    if cluster.shared_checkpoint_dir and on(cluster.workers):  # one mount: cleared from one node
        step(on(cluster.workers)[:1], clear(cluster.shared_checkpoint_dir), "clear shared checkpoints", 120)

    say("[bold]7/7[/] waiting for Spark workers to register, Ray workers to join and Slurm nodes to be idle, "
        "then cluster.check")
    if on(masters):
        probes.wait_for_spark(cluster, len(on(cluster.workers)), SERVICES_READY_TIMEOUT_S)
        probes.wait_for_ray(cluster, len(on(cluster.workers)), SERVICES_READY_TIMEOUT_S, head_restarted=True)
        probes.wait_for_slurm(cluster, tuple(on(cluster.workers)), SERVICES_READY_TIMEOUT_S)
    return determined_rows + check(cluster)


def _resume_slurm_nodes(cluster: Cluster, say) -> None:
    """Return drained, down or failed workers to service (Slurm keeps them out until told)."""
    try:
        states = probes.slurm_node_states(cluster)
    except DtlabError as error:
        say(f"  [yellow]could not ask Slurm for its nodes ({error})[/]")
        return
    held = [w.name for w in cluster.workers
            if probes.slurm_base_state(states.get(w.name, "")) in probes.SLURM_HELD_STATES]
    if not held:
        say("  no node drained or down")
        return
    answer = remote.run(cluster.master, f"scontrol update nodename={','.join(held)} state=resume", timeout=30)
    say(f"  resumed {', '.join(held)}" if answer.ok else
        f"  [red]could not resume {', '.join(held)}: {(answer.stderr or answer.stdout).strip()[-200:]}[/]")


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
