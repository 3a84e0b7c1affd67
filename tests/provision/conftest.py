"""Fixtures of the provisioning tests that run the roles on the controller itself (check mode)."""

import os

import pytest

from dtlab import paths


@pytest.fixture
def controller_inventory(tmp_path):
    """The controller as a one-host cluster (master and worker), with the repository's group_vars."""
    inventory_dir = tmp_path / "inventory"
    inventory_dir.mkdir()
    os.symlink(paths.INVENTORY_DIR / "group_vars", inventory_dir / "group_vars")
    (inventory_dir / "hosts.yml").write_text(
        "all:\n  children:\n    master:\n      hosts:\n        controller:\n"
        "          ansible_host: 127.0.0.1\n          ansible_connection: local\n"
        "          ansible_python_interpreter: /usr/bin/python3\n          gpu_indices: [0]\n"
        "    workers:\n      hosts:\n        controller:\n")
    return inventory_dir / "hosts.yml"

