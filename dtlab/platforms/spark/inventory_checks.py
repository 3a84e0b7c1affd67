"""Spark's inventory checks: its variables that would fail later, refused as one line when the inventory
is read (Platform.check_inventory_host, through dtlab.platforms.load_cluster): before anything starts."""

from __future__ import annotations

from pathlib import Path

from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.inventory import Node
from dtlab.pins import PINS_FILE, pinned

# How spark cells run (spark_session): each its own application, or a session on a Connect server.
SESSIONS = ("application", "connect")
# Where the pyspark pin lives (Spark's part of constraints.txt: dtlab/pins.py).
SPARK_PINS = (Path(__file__).parent / PINS_FILE).relative_to(paths.REPO_ROOT)


def check_host(where: str, node: Node) -> None:
    """The Spark release a host runs, and how its cells run."""
    check_version(where, node.var("spark_version"))
    session = node.var("spark_session", "application")
    if session not in SESSIONS:
        raise DtlabError(f"{where}: spark_session must be {' or '.join(SESSIONS)}, got {session!r}")


def check_version(where: str, version: object) -> None:
    """A host's spark_version (the Spark it runs) must be the pyspark pin's release: the nodes' driver."""
    if version in (None, ""):
        return  # no Spark facts in this inventory (no group_vars/all.yml); the spark role requires them
    version = str(version).strip()
    pin = pinned("pyspark")
    if pin is None:
        raise DtlabError(f"{SPARK_PINS}: no pyspark==<version> pin; spark_version follows it")
    if version.split(".")[:2] != pin.split(".")[:2]:
        raise DtlabError(
            f"{where}: spark_version {version} does not match pyspark=={pin} in constraints.txt (the nodes'"
            f" Spark driver); remove the spark_version override, or pin pyspark=={version} in {SPARK_PINS}"
        )
