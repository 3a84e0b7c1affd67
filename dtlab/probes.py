"""What the harness asks the nodes about their services, shared by bench, cluster and deploy:
the trainer venv's versions, and the Spark master's alive workers."""

from __future__ import annotations

import json
import shlex
from typing import Any

from dtlab import remote
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.waiting import wait_until

# The trainer's packages whose versions must match on every node (the full freeze is hashed too).
KEY_PACKAGES = ("torch", "transformers", "tokenizers", "datasets", "pyspark", "determined", "numpy")

VERSIONS_PROBE = (
    "import hashlib, importlib.metadata as m, json, platform;"
    "dists = sorted({f'{d.metadata[\"Name\"].lower()}=={d.version}' for d in m.distributions()});"
    "pkgs = {d.split('==')[0]: d.split('==')[1] for d in dists};"
    f"print(json.dumps({{'python': platform.python_version(), **{{k: pkgs.get(k) for k in {KEY_PACKAGES!r}}},"
    "'freeze_sha': hashlib.sha256('\\n'.join(dists).encode()).hexdigest()[:16]}))"
)


def node_versions(cluster: Cluster, nodes: tuple[Node, ...] | None = None) -> dict[str, Any]:
    """Per node: python and key package versions of the trainer venv, plus a hash of its full freeze."""
    command = f"{shlex.quote(cluster.python)} -c {shlex.quote(VERSIONS_PROBE)}"
    versions: dict[str, Any] = {}
    for name, answer in remote.run_all(nodes or cluster.nodes, command, timeout=60).items():
        if isinstance(answer, BaseException):
            versions[name] = {"error": str(answer)}
        elif not answer.ok:
            versions[name] = {
                "error": (answer.stderr or answer.stdout).strip()[-200:] or f"exit {answer.exit_code}"
            }
        else:
            try:
                versions[name] = json.loads(answer.stdout.strip().splitlines()[-1])
            except (json.JSONDecodeError, IndexError):
                versions[name] = {"error": f"unreadable: {answer.stdout.strip()[:100]}"}
    return versions


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
