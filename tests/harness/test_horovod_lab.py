"""Horovod on the session's test lab, through everything a platform goes through: the horovod role
(`site.yml --tags horovod` with horovod_install true: the wheel built on the controller into the wheelhouse
the nodes mount, or found there, installed into every node's trainer venv), then bench.all's health gate
(the platform's check rows) and a horovod cell beside its ddp twin, then a second converge that changes
nothing. horovodrun starts the ranks over SSH as the service user; they end by their PIDs."""

from __future__ import annotations

import json

import pytest
from test_bench_lab import invoke, running_trainers

from dtlab import provision
from dtlab.results import ResultStore
from tests.provision.test_horovod_build import missing_compiler

# About 4 minutes on 2 cores with the wheel built; a cold wheelhouse adds its build (about 5 min).
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(3600)]

HOROVOD = {"horovod_install": True}


@pytest.fixture
def horovod_inventory(harness_lab):
    """The lab's inventory with horovod_install true as a host var (host vars beat group_vars/all.yml),
    beside it so its group_vars and paths apply; removed afterwards."""
    cluster, _ = harness_lab
    path = cluster.inventory_path.with_name(cluster.inventory_path.stem + "-horovod.yml")
    text = cluster.inventory_path.read_text()
    hosts = [node.name for node in cluster.nodes]
    lab_line = f"      dtlab_lab_name: {cluster.var('dtlab_lab_name')}\n"
    text = text.replace(lab_line, lab_line + "      horovod_install: true\n")
    assert text.count("horovod_install: true") == len(hosts), "every host of the lab inventory got it"
    path.write_text(text)
    yield path
    path.unlink()


def test_the_role_installs_horovod_and_a_horovod_cell_trains_as_its_ddp_twin(
    harness_lab, horovod_inventory
):
    cluster, env = harness_lab
    installed = provision.converge(cluster.inventory_path, tags=["horovod"], extravars=HOROVOD)
    if not installed.ok and missing_compiler(installed.output):
        pytest.skip(missing_compiler(installed.output))
    assert installed.ok, installed.summary() + installed.output[-4000:]
    assert "TASK [horovod : Install the Horovod wheel into the trainer venv]" in installed.output

    done = invoke("bench.all", "-i", str(horovod_inventory), "--profile", "horovod",
                  "--only", "ddp-g2,horovod-g2", "--force", "--no-report", env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "health gate passed" in done.stdout  # its horovod rows: PyTorch and Gloo on every node
    runs = {run.cell_key: run for run in ResultStore.for_cluster(cluster.name).runs(status="ok")}
    horovod, ddp = runs["horovod-g2-e2-s0"].result, runs["ddp-g2-e2-s0"].result
    assert (horovod["framework"], horovod["world_size"], horovod["nodes"]) == ("horovod", 2, 2)
    assert horovod["hostnames"] == [node.name for node in cluster.workers]  # dtlab's placement order
    # Horovod's Gloo ring averages the gradients DDP's all-reduce averages, on two nodes as on one.
    for key in ("train_loss", "val_loss", "val_accuracy"):
        assert [m[key] for m in horovod["epoch_metrics"]] == [m[key] for m in ddp["epoch_metrics"]], key
    log = runs["horovod-g2-e2-s0"].log_dir / f"{cluster.master.name}.log"
    assert "epoch 2/2" in log.read_text(), "horovodrun's output streams into the driver's log"
    assert json.loads((runs["horovod-g2-e2-s0"].run_dir / "result.json").read_text()) == horovod
    assert running_trainers(cluster.nodes) == {}, "no rank outlives its cell"

    again = provision.converge(cluster.inventory_path, tags=["horovod"], extravars=HOROVOD)
    assert again.ok, again.summary()
    assert again.changed_hosts == {}, again.summary()
