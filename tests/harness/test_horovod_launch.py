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
