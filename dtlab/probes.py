"""What the harness asks the nodes about their services, shared by bench, cluster and deploy:
the trainer venv's fingerprint (trainer/env_fingerprint.py), and the Spark master's alive workers."""

from __future__ import annotations

import json
import shlex
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
