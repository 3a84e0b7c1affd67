"""What the harness asks every node about its trainer environment, shared by bench, cluster and deploy:
the trainer venv's fingerprint (trainer/env_fingerprint.py). What a platform's services say (Spark's
alive workers, the Ray head's nodes and jobs, Slurm's node states) is asked by its module in
dtlab.platforms."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from dtlab import remote
from dtlab.inventory import Cluster, Node
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
