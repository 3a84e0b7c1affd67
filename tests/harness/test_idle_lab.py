"""invoke cluster.idle on the real lab: every platform's daemons measured with no cell running, the
record the report reads, and the refusal while a cell runs. Needs root; uses the session lab provisioned
by site.yml (tests/conftest.py `provisioned_lab`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtlab.lab.access import run_on_node
from dtlab.paths import IDLE_DIRNAME
from dtlab.platforms import load_cluster
from dtlab.report.comparison import cluster_measures

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(3600)]

INVOKE = str(Path(sys.executable).parent / "invoke")
LAB_PLATFORMS = ("spark", "ray", "slurm", "determined")  # the lab's Determined: PostgreSQL, no master


def idle_probe(lab, results: Path, seconds: str = "3") -> subprocess.CompletedProcess:
    return subprocess.run([INVOKE, "cluster.idle", "-i", str(lab.inventory_path), "--seconds", seconds],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DTLAB_RESULTS_DIR": str(results)})


def test_every_platforms_daemons_are_measured_idle_and_recorded(provisioned_lab, tmp_path):
    lab, _ = provisioned_lab
    cluster = load_cluster(lab.inventory_path)
    answer = idle_probe(lab, tmp_path)
    assert answer.returncode == 0, answer.stdout[-2000:] + answer.stderr[-2000:]
    records = list((tmp_path / cluster.name / IDLE_DIRNAME).glob("*.json"))
    assert len(records) == 1, answer.stdout
    units = json.loads(records[0].read_text())["units"]
    cores = os.cpu_count() or 1
    for platform in LAB_PLATFORMS:
        active = [u for u in units if u["platform"] == platform and u["running"]]
        assert active, f"{platform}: no running unit in {units}"
        for unit in active:  # real figures (systemd's accounts, else the unit's processes), not placeholders
            assert unit["source"] in ("systemd", "processes"), unit
            assert unit["memory_bytes"] is not None and unit["memory_bytes"] > 2**16, unit  # munge: < 1 MiB
            assert unit["cpu_pct"] is not None and 0 <= unit["cpu_pct"] <= 100 * cores, unit
    spark_nodes = {u["node"] for u in units if u["platform"] == "spark" and u["running"]}
    assert spark_nodes == set(lab.node_names), "Spark's master on the master, a worker on each worker"
    postgres = next(u for u in units if u["node"] == cluster.master.name
                    and u["unit"] == f"{cluster.var('postgresql_service')}.service")
    assert any(m.startswith("postgresql@") for m in postgres["running"]), "the server's instance counts"
    # Ray's head (GCS, raylet, dashboard) polls all the time: idle is not zero there.
    assert sum(u["cpu_pct"] for u in units if u["platform"] == "ray" and u["running"]) > 0
    _, used, notes = cluster_measures(tmp_path / cluster.name)
    for platform in LAB_PLATFORMS:
        assert "MiB" in used[platform] and "% CPU" in used[platform], used
    assert used["ddp"] == "no daemon of its own"
    assert any(note.startswith("Idle memory / CPU: 1 probe(s)") for note in notes)


def test_a_running_cell_is_refused_in_one_line(provisioned_lab, tmp_path):
    lab, _ = provisioned_lab
    cell_unit = "dtlab-ddp-g1-e1-s0-node1"  # named as bench names a cell's unit (remote.unit_name)
    started = run_on_node(lab, "node1", f"systemd-run --unit {cell_unit} sleep 300")
    assert started.returncode == 0, started.stderr
    try:
        answer = idle_probe(lab, tmp_path, seconds="1")
    finally:
        run_on_node(lab, "node1", f"systemctl stop {cell_unit}")
    assert answer.returncode == 2, answer.stdout + answer.stderr
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1 and "a cell is running" in lines[0], answer.stderr
    assert f"node1: {cell_unit}.service" in lines[0]
    assert not (tmp_path / load_cluster(lab.inventory_path).name / IDLE_DIRNAME).exists(), "nothing recorded"
