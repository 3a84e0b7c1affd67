"""The horovod cell's driver: what the master's unit runs (no Horovod needed to check its shape)."""

import shlex
import subprocess

from harness_helpers import build_launch
from test_placement import cell


def test_the_driver_runs_horovodrun_over_the_placed_workers_in_order(cpu_cluster):
    planned = build_launch(cpu_cluster, cell("horovod", gpus=2), attempt=1, timeout_s=60)
    [(node, spec)] = planned.jobs
    assert node == cpu_cluster.master and planned.result_node == cpu_cluster.workers[0]  # rank 0's node
    script = spec.argv[-1]
    subprocess.run(["sh", "-n", "-c", script], check=True, timeout=10)  # well-formed shell
    argv = shlex.split(script.replace('"$GLOO_SOCKET_IFNAME"', "eth9"))
    assert argv[:3] == ["exec", f"{cpu_cluster.venv_dir}/bin/horovodrun", "--gloo"]
    options = dict(zip(argv[3::2], argv[4::2], strict=False))  # each option with its value
    hosts = ",".join(f"{w.address}:1" for w in cpu_cluster.workers)
    assert {k: options[k] for k in ("-np", "-H", "--start-timeout", "--network-interfaces")} == {
        "-np": "2", "-H": hosts, "--start-timeout": "60", "--network-interfaces": "eth9"}
    rank = argv[argv.index("-c") + 1]
    assert rank.startswith(f"set -a; . {cpu_cluster.socket_env_file}; set +a; ")
    assert rank.endswith(f"-m trainer.launchers.horovod --config {planned.paths.config_path}")


def test_stopping_a_cell_ends_the_ranks_of_every_attempt_and_leaves_other_processes(tmp_path):
    import sys

    from harness_helpers import CPU_CLUSTER_3, CPU_SITE_VARS, write_inventory

    from dtlab.platforms import horovod, load_cluster
    from trainer import progress

    # The controller's venv as the nodes' one: the kill checks /proc/PID/exe against it.
    site = CPU_SITE_VARS + f"dtlab_venv_dir: {sys.prefix}\n"
    cluster = load_cluster(write_inventory(tmp_path / "inv", CPU_CLUSTER_3, group_vars={"all": site}))
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    bystander = subprocess.Popen(["sleep", "60"])  # listed, but not the venv's Python: left alone
    try:
        for attempt, process in enumerate([*ranks, bystander], start=1):
            ranks_dir = tmp_path / "cell" / f"attempt-{attempt}" / "out" / progress.RANKS_DIR
            ranks_dir.mkdir(parents=True)
            (ranks_dir / "0.pid").write_text(f"{process.pid}\n")
        command = horovod.stop_ranks_command(cluster, shlex.quote(str(tmp_path / "cell")))
        subprocess.run(["bash", "-c", command], check=True, timeout=30)
        assert [rank.wait(timeout=10) for rank in ranks] == [-9, -9] and bystander.poll() is None
        subprocess.run(["bash", "-c", command], check=True, timeout=30)  # nothing left: still exit 0
    finally:
        for process in [*ranks, bystander]:
            process.kill()
            process.wait()
