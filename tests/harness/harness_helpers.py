"""Helpers for the harness tests: temporary inventories, written like a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from dtlab import paths, platforms

INVOKE = str(Path(sys.executable).parent / "invoke")


def invoke(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`invoke ARGS` from the repository root as a user types it; the environment plus `env`."""
    return subprocess.run(
        [INVOKE, *args],
        cwd=paths.REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def write_inventory(
    directory: Path,
    hosts_yaml: str,
    group_vars: dict[str, str] | None = None,
    host_vars: dict[str, str] | None = None,
    copy_all: bool = True,
) -> Path:
    """An inventory laid out like the repository's; returns <directory>/inventory/hosts.yml.

    Beside hosts.yml: group_vars/all/ (the repo's all.yml, then a site file) and host_vars/; and
    <directory>/constraints.txt, where group_vars/all.yml's spark_version reads the pyspark pin
    (inventory_dir/../constraints.txt). Like Ansible, variables in group_vars files beat `vars:` inside
    the inventory file, so site overrides of group_vars/all.yml go to group_vars={"all": ...}
    (group_vars/all/site.yml).
    """
    inventory_dir = directory / "inventory"
    (inventory_dir / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (inventory_dir / "host_vars").mkdir(exist_ok=True)
    if copy_all:
        all_vars = (paths.INVENTORY_DIR / "group_vars" / "all.yml").read_text()
        (inventory_dir / "group_vars" / "all" / "00-dtlab.yml").write_text(all_vars)
        (directory / "constraints.txt").write_text(paths.CONSTRAINTS_FILE.read_text())
    for name, text in (group_vars or {}).items():
        target = inventory_dir / "group_vars" / ("all/site.yml" if name == "all" else f"{name}.yml")
        target.write_text(textwrap.dedent(text))
    for name, text in (host_vars or {}).items():
        (inventory_dir / "host_vars" / f"{name}.yml").write_text(textwrap.dedent(text))
    inventory = inventory_dir / "hosts.yml"
    inventory.write_text(textwrap.dedent(hosts_yaml))
    return inventory


GPU_CLUSTER_4X2 = """\
    all:
      vars: {ansible_user: ubuntu}
      children:
        master:
          hosts:
            head: {ansible_host: 127.0.10.1}
        workers:
          hosts:
            gpu1: {ansible_host: 127.0.10.11, gpu_indices: [0, 1]}
            gpu2: {ansible_host: 127.0.10.12, gpu_indices: [0, 1]}
            gpu3: {ansible_host: 127.0.10.13, gpu_indices: [0, 1]}
            gpu4: {ansible_host: 127.0.10.14, gpu_indices: [0, 1]}
"""

CPU_SITE_VARS = "dtlab_device: cpu\ndtlab_socket_env_file: /etc/dtlab/veth9.env\ndtlab_cluster_name: three\n"
CPU_CLUSTER_3 = """\
    all:
      vars: {ansible_user: root}
      children:
        master:
          hosts:
            n0: {ansible_host: 127.0.20.10}
        workers:
          hosts:
            n1: {ansible_host: 127.0.20.11}
            n2: {ansible_host: 127.0.20.12}
"""


def build_launch(cluster, cell, attempt: int, timeout_s: int):
    """The Launch bench would run for this attempt of the cell: its platform's build."""
    return platforms.get(cell.framework).build(cluster, cell, attempt, timeout_s)
