"""Fixtures for the harness tests: temporary inventories and matrices."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from harness_helpers import CPU_CLUSTER_3, CPU_SITE_VARS, GPU_CLUSTER_4X2, write_inventory
from lab_session import EXISTING_LAB_INVENTORY  # a provisioned lab instead of the session's


@pytest.fixture
def gpu_cluster(tmp_path):
    from dtlab.platforms import load_cluster

    return load_cluster(
        write_inventory(tmp_path, GPU_CLUSTER_4X2, group_vars={"all": "dtlab_cluster_name: four\n"})
    )


@pytest.fixture
def cpu_cluster(tmp_path):
    from dtlab.platforms import load_cluster

    return load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": CPU_SITE_VARS}))


@pytest.fixture
def loopback_inventory(tmp_path):
    """Nodes on loopback addresses where nothing listens: every SSH connect is refused at once."""
    return write_inventory(
        tmp_path / "inv", CPU_CLUSTER_3.replace("127.0.20.", "127.0.66."), group_vars={"all": CPU_SITE_VARS}
    )


@pytest.fixture
def matrix_file(tmp_path):
    """Write a matrix.yml with one profile `p` from the given runs/trainer YAML snippet."""

    def write(body: str) -> Path:
        path = tmp_path / "matrix.yml"
        path.write_text("profiles:\n  p:\n" + textwrap.indent(textwrap.dedent(body), "    "))
        return path

    return write


@pytest.fixture(scope="session")
def harness_lab(request, tmp_path_factory):
    """(Cluster, env) of the provisioned session lab with the trainer deployed; results in a temp store."""
    from dtlab import paths
    from dtlab.deploy import deploy
    from dtlab.platforms import load_cluster

    if EXISTING_LAB_INVENTORY:
        inventory = EXISTING_LAB_INVENTORY
    else:
        lab, _ = request.getfixturevalue("provisioned_lab")
        inventory = lab.inventory_path
    results = tmp_path_factory.mktemp("results")
    saved = paths.RESULTS_DIR
    paths.RESULTS_DIR = results  # in-process stores and the invoke subprocesses (env below) agree
    cluster = load_cluster(inventory)
    deploy(cluster, say=lambda line: None)
    yield cluster, {"DTLAB_RESULTS_DIR": str(results)}
    paths.RESULTS_DIR = saved
