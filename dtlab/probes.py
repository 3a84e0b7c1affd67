"""What the harness asks the nodes about their services, shared by bench, cluster and deploy:
the trainer venv's fingerprint (trainer/env_fingerprint.py), the Spark master's alive workers, and the Ray
head's alive nodes and running jobs (its dashboard's REST API, with the cluster's token)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtlab import remote
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.waiting import wait_until
from trainer import env_fingerprint

# The fingerprint's one definition, the file itself: its text runs on each node with the venv's Python,
# as the trainer role runs it (roles/trainer/tasks/fingerprint.yml).
FINGERPRINT_SOURCE = Path(env_fingerprint.__file__).read_text()


def fingerprint_command(python: str) -> str:
    """The shell command that prints the fingerprint of the environment of `python` (one JSON line)."""
    return f"{shlex.quote(python)} -c {shlex.quote(FINGERPRINT_SOURCE)}"


def parse_fingerprint(answer: remote.CommandResult) -> dict[str, Any]:
    """The fingerprint from one node's answer, or {"error": why}."""
    if not answer.ok:
        return {"error": (answer.stderr or answer.stdout).strip()[-200:] or f"exit {answer.exit_code}"}
    try:
        return json.loads(answer.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {"error": f"unreadable: {answer.stdout.strip()[:100]}"}


def node_versions(cluster: Cluster, nodes: tuple[Node, ...] | None = None) -> dict[str, Any]:
    """Per node: the trainer venv's fingerprint (python, key package versions, hash of its full freeze)."""
    command = fingerprint_command(cluster.python)
    return {
        name: {"error": str(answer)} if isinstance(answer, BaseException) else parse_fingerprint(answer)
        for name, answer in remote.run_all(nodes or cluster.nodes, command, timeout=60).items()
    }


def spark_alive_worker_info(cluster: Cluster) -> list[dict]:
    """The alive workers from the Spark master's JSON endpoint, asked on the master itself ([] if none)."""
    master = cluster.master
    if master is None:
        return []
    url = f"http://{master.address}:{cluster.spark_master_webui_port}/json/"
    probe = (
        f'{cluster.python} -c "import json,urllib.request;'
        f"w=json.load(urllib.request.urlopen('{url}', timeout=5)).get('workers', []);"
        "print(json.dumps([x for x in w if x.get('state') == 'ALIVE']))\""
    )
    answer = remote.run(master, probe, timeout=30)
    try:
        return json.loads(answer.stdout.strip().splitlines()[-1]) if answer.ok else []
    except (ValueError, IndexError):
        return []


def spark_alive_workers(cluster: Cluster) -> int:
    return len(spark_alive_worker_info(cluster))


def wait_for_spark(cluster: Cluster, expected: int, timeout_s: float) -> int:
    """Alive Spark workers once `expected` have registered, or after `timeout_s` (workers re-register
    for a while after a restart); stops early when the master does not answer."""

    def alive_workers() -> int | None:
        try:
            return spark_alive_workers(cluster)
        except DtlabError:  # the master does not answer: the caller reports what is alive
            return None

    alive = wait_until(alive_workers, until=lambda count: count is None or count >= expected,
                       timeout_s=timeout_s, every_s=2)
    return alive or 0


# --- Ray: the head's dashboard API, asked on the master with the token file there --------------------

# Runs on the master with the venv's Python: reads the token file (never printed), calls one endpoint
# of the dashboard and prints its JSON `data` (or the HTTP error as {"error": ...}).
_RAY_API_CALL = """
import json, sys, urllib.error, urllib.request
url, token_file, method = sys.argv[1:4]
token = open(token_file).read().strip()
request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None,
                                 headers={"Authorization": "Bearer " + token})
try:
    with urllib.request.urlopen(request, timeout=10) as answer:
        body = json.load(answer)
except urllib.error.HTTPError as error:
    body = {"error": f"HTTP {error.code} {error.reason}"}
except (OSError, ValueError) as error:
    body = {"error": str(error)}
print(json.dumps(body))
"""


def ray_api_command(cluster: Cluster, path: str, method: str = "GET") -> str:
    """The shell command, run on the master, that calls one dashboard endpoint with the token file."""
    return " ".join(shlex.quote(part) for part in (
        cluster.python, "-c", _RAY_API_CALL, cluster.ray_dashboard_url + path, cluster.ray_auth_token_file,
        method))


def parse_ray_api(answer: remote.CommandResult, where: str, path: str) -> Any:
    """The endpoint's JSON, or DtlabError naming the host and what went wrong."""
    try:
        body = json.loads(answer.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DtlabError(f"host {where}: Ray dashboard gave no answer: "
                         f"{(answer.stderr or answer.stdout).strip()[-200:]}") from None
    if isinstance(body, dict) and "error" in body:
        raise DtlabError(f"host {where}: Ray dashboard {path}: {body['error']}")
    return body


def ray_api(cluster: Cluster, path: str, method: str = "GET") -> Any:
    """One call to the Ray dashboard's REST API on the master; DtlabError when it does not answer."""
    master = cluster.require_master("Ray")
    answer = remote.run(master, ray_api_command(cluster, path, method), timeout=30)
    return parse_ray_api(answer, master.name, path)


def alive_ray_workers_in(nodes_answer: Any) -> list[dict]:
    """From /api/v0/nodes' answer: the nodes other than the head that are ALIVE, with resources_total."""
    nodes = nodes_answer["data"]["result"]["result"]
    return [node for node in nodes if node.get("state") == "ALIVE" and not node.get("is_head_node")]


RAY_NODES_PATH = "/api/v0/nodes?limit=1000"


def ray_alive_workers(cluster: Cluster) -> list[dict]:
    """The Ray nodes other than the head that are ALIVE, with their resources_total."""
    return alive_ray_workers_in(ray_api(cluster, RAY_NODES_PATH))


def wait_for_ray(cluster: Cluster, expected: int, timeout_s: float, *, head_restarted: bool = False) -> int:
    """Alive Ray worker nodes once `expected` have joined, or after `timeout_s` (raylets rejoin for a while
    after a restart); stops early when the head does not answer, unless it was just restarted
    (`head_restarted`: its dashboard answers some seconds after its unit is active)."""

    def alive_workers() -> int | None:
        try:
            return len(ray_alive_workers(cluster))
        except DtlabError:
            return None

    alive = wait_until(alive_workers, timeout_s=timeout_s, every_s=2,
                       until=lambda count: (count is None and not head_restarted) or (count or 0) >= expected)
    return alive or 0


def stop_ray_jobs(cluster: Cluster, call: Callable[..., Any] = ray_api) -> list[str]:
    """Stop every Ray job still pending or running (Jobs API); the submission ids stopped.
    `call` makes the API calls: ray_api, over SSH on the master."""
    unfinished = [job for job in call(cluster, "/api/jobs/")
                  if job.get("status") in ("PENDING", "RUNNING") and job.get("submission_id")]
    for job in unfinished:
        call(cluster, f"/api/jobs/{job['submission_id']}/stop", method="POST")
    return [job["submission_id"] for job in unfinished]


# --- Slurm: asked with its own clients on the master (slurm-client, the slurm role) ---

# sinfo's short node states (%t). Ready: takes a new exclusive job at once. Usable: up, perhaps busy.
# Held: out of service until `scontrol update state=resume` (cluster.reset does it).
SLURM_READY_STATES = ("idle",)
SLURM_USABLE_STATES = ("idle", "alloc", "mix", "comp")
SLURM_HELD_STATES = ("drain", "drng", "down", "fail", "failg")


def slurm_base_state(state: str) -> str:
    """The state without sinfo's flags (down* = not responding, idle~ = powered off, ...)."""
    return state.rstrip("*~#!%$@^-")


def parse_slurm_nodes(sinfo_output: str) -> dict[str, str]:
    """{node: short state} from `sinfo -h -N -o '%N %t'`; a state ends in * when slurmd does not answer."""
    states: dict[str, str] = {}
    for line in sinfo_output.splitlines():
        fields = line.split()
        if len(fields) == 2:
            states[fields[0]] = fields[1]
    return states


def slurm_node_states(cluster: Cluster) -> dict[str, str]:
    """Each node of dtlab's partition with its short state, as slurmctld sees it; DtlabError when sinfo
    cannot ask it (slurmctld down, munge refused)."""
    master = cluster.require_master("Slurm")
    partition = shlex.quote(str(cluster.require("slurm_partition")))
    answer = remote.run(master, f"sinfo -h -N -p {partition} -o '%N %t'", timeout=30)
    if not answer.ok:
        why = (answer.stderr or answer.stdout).strip().splitlines()
        raise DtlabError(f"host {master.name}: sinfo: {why[-1] if why else f'exit {answer.exit_code}'}")
    return parse_slurm_nodes(answer.stdout)


def wait_for_slurm(cluster: Cluster, nodes: tuple[Node, ...], timeout_s: float) -> dict[str, str]:
    """The nodes' Slurm states once all are ready for a job, or after `timeout_s` (slurmd registers again
    for a few seconds after a restart, and a node completes its last job); {} when sinfo fails."""

    def states() -> dict[str, str]:
        try:
            return slurm_node_states(cluster)
        except DtlabError:
            return {}

    def ready(answer: dict[str, str]) -> bool:
        return not answer or all(answer.get(node.name) in SLURM_READY_STATES for node in nodes)

    return wait_until(states, until=ready, timeout_s=timeout_s, every_s=1) or {}
