"""invoke cluster.idle without a cluster: each unit's memory and CPU from a node's two samples (systemd's
accounts, else its processes'), the node's probe itself on this machine's /proc, the platform of each
unit, the refusals before any node is measured. On real nodes: tests/harness/test_idle_lab.py."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from harness_helpers import invoke

from dtlab import idle, paths
from dtlab.cluster import SERVICE_VARIABLES
from dtlab.errors import DtlabError
from dtlab.paths import INVENTORY_DIR
from dtlab.platforms import load_cluster

MiB = 2**20
UNITS = {
    "dtlab-spark-master.service": ("spark_master_service", "spark"),
    "postgresql.service": ("postgresql_service", "determined"),
    "slurmd.service": ("slurm_slurmd_service", "slurm"),
    "determined-master.service": ("determined_master_service", "determined"),
}
NOT_SET = "[not set]"


def shown(load="loaded", active="active", memory=NOT_SET, cpu=NOT_SET, processes=None):
    """One unit in a sample, as dtlab/data/idle_probe.py prints it: systemd's view and its processes'
    [CPU ticks, PSS kB]."""
    return {"LoadState": load, "ActiveState": active, "MemoryCurrent": str(memory), "CPUUsageNSec": str(cpu),
            "processes": processes or {}}


def answer(accounted=True, cells=(), umbrella="active"):
    """A node's answer, 10 s between the samples: Spark's master (1 s of CPU), PostgreSQL (an umbrella
    over its cluster's instance, 0.1 s), slurmd installed but stopped, Determined's master not installed.
    `accounted`: systemd keeps MemoryCurrent and CPUUsageNSec; else only the processes' figures.
    `umbrella`: postgresql.service's own state (the lab starts the instance by itself: inactive)."""

    def sample(at, spark_ns, instance_ns, spark_ticks, instance_ticks):
        def unit(memory, cpu_ns, processes):
            return shown(memory=memory if accounted else NOT_SET, cpu=cpu_ns if accounted else NOT_SET,
                         processes=processes)

        return {"monotonic_ns": at, "units": {
            "dtlab-spark-master.service": unit(300 * MiB, spark_ns, {"101": [spark_ticks, 290 * 1024]}),
            "postgresql.service": shown(active=umbrella, memory=0 if accounted else NOT_SET,
                                        cpu=0 if accounted else NOT_SET),
            "slurmd.service": shown(active="inactive"),
            "determined-master.service": shown(load="not-found", active="inactive"),
            "postgresql@15-main.service": unit(20 * MiB, instance_ns, {"201": [instance_ticks, 18 * 1024],
                                                                        "202": [5, 2 * 1024]}),
        }}

    return {"cells": list(cells), "clock_ticks_per_s": 100,
            "members": {"postgresql.service": ["postgresql@15-main.service"]},
            "samples": [sample(5_000_000_000, 10**9, 5 * 10**7, 100, 5),
                        sample(15_000_000_000, 2 * 10**9, 15 * 10**7, 200, 15)]}


def test_each_installed_unit_gets_memory_and_cpu_from_systemds_accounts():
    found = {u.unit: u for u in idle.node_idle("node0", answer(), UNITS)}
    assert "determined-master.service" not in found, "not installed on this node: left out"
    spark = found["dtlab-spark-master.service"]
    assert (spark.platform, spark.state, spark.memory_bytes, spark.source) == ("spark", "active", 300 * MiB,
                                                                               "systemd")
    assert spark.cpu_pct == pytest.approx(10.0)  # 1 s of CPU over 10 s of the node's clock
    postgres = found["postgresql.service"]
    assert postgres.members == ("postgresql@15-main.service",)
    assert postgres.running == ("postgresql.service", "postgresql@15-main.service")
    assert postgres.memory_bytes == 20 * MiB and postgres.cpu_pct == pytest.approx(1.0), "the server counts"
    slurmd = found["slurmd.service"]
    assert (slurmd.state, slurmd.memory_bytes, slurmd.cpu_pct, slurmd.running) == ("inactive", None, None, ())


def test_an_inactive_umbrella_counts_its_running_member():
    found = {u.unit: u for u in idle.node_idle("node0", answer(umbrella="inactive"), UNITS)}
    postgres = found["postgresql.service"]
    assert postgres.state == "inactive" and postgres.running == ("postgresql@15-main.service",)
    assert postgres.memory_bytes == 20 * MiB and postgres.cpu_pct == pytest.approx(1.0)


def test_without_systemds_accounts_the_units_processes_are_measured():
    found = {u.unit: u for u in idle.node_idle("node0", answer(accounted=False), UNITS)}
    spark, postgres = found["dtlab-spark-master.service"], found["postgresql.service"]
    assert spark.source == postgres.source == "processes"
    assert spark.memory_bytes == 290 * MiB and spark.cpu_pct == pytest.approx(10.0)  # 100 ticks of 100/s
    # Two processes of the instance: PSS added up, CPU only of those alive at both samples (201 and 202).
    assert postgres.memory_bytes == 20 * MiB and postgres.cpu_pct == pytest.approx(1.0)
    assert idle._counter(str(idle.UNSET)) is None and idle._counter(NOT_SET) is None
    assert idle._counter("0") == 0


def test_a_short_answer_is_refused():
    with pytest.raises(DtlabError, match="node0: 0 samples came back, expected 2"):
        idle.node_idle("node0", {"cells": []}, UNITS)


# --- the node's side, for real, on this machine: its /proc and a cgroup of its own --------------------

# Stand-in for systemctl (no systemd runs on this machine): `show` answers for the unit busy.service,
# whose ControlGroup is a real cgroup this test makes; `list-units` names $STANDIN_CELL if set.
STANDIN_SYSTEMCTL = """#!/bin/sh
case "$1" in
show) shift; while [ "$1" != "--" ]; do shift; done; shift; first=1
      for unit in "$@"; do
        [ $first = 1 ] || echo; first=0
        if [ "$unit" = busy.service ]; then
          printf 'LoadState=loaded\nActiveState=active\nMemoryCurrent=[not set]\nCPUUsageNSec=[not set]\n'
          printf 'ControlGroup=/%s\nConsistsOf=\n' "$STANDIN_CGROUP"
        else printf 'LoadState=not-found\nActiveState=inactive\n'; fi
      done ;;
list-units) [ -n "$STANDIN_CELL" ] && echo "$STANDIN_CELL loaded active running a cell" ;;
esac
exit 0
"""
CGROUP_V2 = next((root for root in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
                  if (root / "cgroup.procs").exists() and (root / "cgroup.subtree_control").exists()), None)


@pytest.fixture
def busy_cgroup(tmp_path):
    """A cgroup of this machine with one process in it that spins on a core until killed."""
    if os.geteuid() != 0 or CGROUP_V2 is None:
        pytest.skip("needs root and a cgroup-v2 hierarchy to make a cgroup")
    name = f"dtlab-idle-test-{os.getpid()}"
    cgroup = CGROUP_V2 / name
    cgroup.mkdir()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (cgroup / "cgroup.procs").write_text(f"{spinner.pid}\n")
        standin = tmp_path / "bin"
        standin.mkdir()
        (standin / "systemctl").write_text(STANDIN_SYSTEMCTL)
        (standin / "systemctl").chmod(0o755)
        yield spinner.pid, {**os.environ, "PATH": f"{standin}:{os.environ['PATH']}", "STANDIN_CGROUP": name}
    finally:
        spinner.kill()
        spinner.wait(timeout=10)
        cgroup.rmdir()


def run_probe(env, interval_s=2.0):
    command = idle.probe_command(["busy.service", "slurmd.service"], interval_s)
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cpu_ticks(pid):
    return sum(int(f) for f in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:15])


def test_the_node_probe_measures_a_units_processes_from_proc(busy_cgroup):
    pid, env = busy_cgroup
    before = cpu_ticks(pid)
    probe = run_probe(env)
    spun = cpu_ticks(pid) - before  # the spinner's CPU over more than the probe's interval
    units = {"busy.service": ("spark_worker_service", "spark"),
             "slurmd.service": ("slurm_slurmd_service", "slurm")}
    (busy,) = idle.node_idle("here", probe, units)  # slurmd: not installed, left out
    assert busy.source == "processes" and busy.running == ("busy.service",)
    assert busy.memory_bytes > 2 * MiB, "a Python interpreter's PSS"
    interval_s = (probe["samples"][1]["monotonic_ns"] - probe["samples"][0]["monotonic_ns"]) / 1e9
    measured = busy.cpu_pct / 100 * interval_s * probe["clock_ticks_per_s"]
    # Spinning all along: some CPU whatever the machine's load, at most one core, at most what it spun.
    assert 0 < busy.cpu_pct <= 100 + 1 and measured <= spun + 1, (busy.cpu_pct, measured, spun)


def test_the_node_probe_samples_nothing_while_a_cell_runs(busy_cgroup):
    _, env = busy_cgroup
    probe = run_probe({**env, "STANDIN_CELL": "dtlab-ddp-g1-e2-s0-node0.service"}, interval_s=30)
    assert probe == {"cells": ["dtlab-ddp-g1-e2-s0-node0.service"]}, "answered at once, no samples"


def test_every_unit_cluster_check_looks_for_is_probed_under_its_platform():
    cluster = load_cluster(INVENTORY_DIR / "cluster.example.yml", allow_placeholders=True)
    units = idle.platform_units(cluster)
    assert sorted(variable for variable, _ in units.values()) == sorted(SERVICE_VARIABLES)
    assert units["dtlab-spark-master.service"] == ("spark_master_service", "spark")
    assert units["postgresql.service"] == ("postgresql_service", "determined")
    assert {platform for _, platform in units.values()} == {"spark", "determined", "ray", "slurm"}
    command = idle.probe_command(list(units), 2.5)
    config = json.loads(shlex.split(command.split("<<")[0])[2])
    assert config == {"units": list(units), "interval_s": 2.5,
                      "cell_patterns": [f"dtlab-{f}-g*.service" for f in paths.platform_names()]}


def test_the_record_is_written_as_the_report_reads_it(tmp_path):
    units = idle.node_idle("node0", answer(), UNITS)
    found = idle.IdleMeasure("c", "2026-11-25T10:00:00+00:00", 10.0, units)
    path = idle.record_idle(found, tmp_path / "idle")
    assert path.name == "20261125T100000Z.json"
    content = json.loads(path.read_text())
    assert content["format"] == idle.IDLE_FORMAT and content["interval_s"] == 10.0
    postgres = next(u for u in content["units"] if u["unit"] == "postgresql.service")
    assert postgres["memory_bytes"] == 20 * MiB and postgres["source"] == "systemd"


@pytest.mark.parametrize(("seconds", "expected"), [
    ("x", "--seconds 'x': must be a number of seconds"),
    ("0", "--seconds 0: must be > 0 and <= 600"),
    ("nan", "--seconds nan: must be > 0"),
])
def test_a_bad_interval_is_one_line_before_the_inventory_is_read(seconds, expected):
    with pytest.raises(DtlabError, match=re.escape(expected)):
        idle.idle_command("/no/such/inventory.yml", seconds)


def test_invoke_cluster_idle_refuses_a_node_that_does_not_answer_in_one_line(loopback_inventory, tmp_path):
    answer = invoke("cluster.idle", "-i", str(loopback_inventory), "--seconds", "1",
                    env={"DTLAB_RESULTS_DIR": str(tmp_path / "results")})
    assert answer.returncode == 2, answer.stdout + answer.stderr
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cluster.idle: host "), answer.stderr
    assert "every node is measured at once" in lines[0]
    assert not (tmp_path / "results").exists(), "nothing recorded"
