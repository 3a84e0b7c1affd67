"""Which nodes and GPUs a cell gets, and what each launcher starts there: from the inventory alone."""

import pytest
from harness_helpers import CPU_CLUSTER_3, CPU_SITE_VARS, build_launch, write_inventory

from dtlab import launch, matrix
from dtlab.cell import Cell
from dtlab.errors import DtlabError
from dtlab.platforms import load_cluster


def cell(framework="ddp", gpus=1, epochs=2, seed=0):
    smoke_options = matrix.load("smoke").cells[0].trainer_config
    return Cell(framework, gpus, epochs, seed, profile="smoke", trainer_config=smoke_options)


def test_four_nodes_with_two_gpus_each_from_the_inventory_alone(gpu_cluster):
    assert gpu_cluster.max_gpus == 8
    eight = launch.place(gpu_cluster, cell(gpus=8))
    assert [(s.node.name, s.nproc, s.gpu_indices) for s in eight.slots] == [
        ("gpu1", 2, (0, 1)),
        ("gpu2", 2, (0, 1)),
        ("gpu3", 2, (0, 1)),
        ("gpu4", 2, (0, 1)),
    ]
    three = launch.place(gpu_cluster, cell(gpus=3))
    assert [(s.node.name, s.nproc, s.gpu_indices) for s in three.slots] == [
        ("gpu1", 2, (0, 1)),
        ("gpu2", 1, (0,)),
    ]
    assert three.world_size == 3 and three.device == "cuda"


def test_ddp_runs_torchrun_on_each_selected_worker_with_rendezvous_on_the_first(gpu_cluster):
    planned = build_launch(gpu_cluster, cell(gpus=3), attempt=1, timeout_s=600)
    assert [node.name for node, _ in planned.jobs] == ["gpu1", "gpu2"]
    for rank, (node, spec) in enumerate(planned.jobs):
        argv = spec.argv
        assert argv[:3] == ["/opt/dtlab/venv/bin/python", "-m", "trainer.launchers.agent"]
        assert "--nnodes=2" in argv and f"--node_rank={rank}" in argv
        assert "--master_addr=127.0.10.11" in argv and "--master_port=29500" in argv
        assert argv[-2:] == ["--config", planned.paths.config_path]
        assert argv[argv.index("-m", 3) + 1] == "trainer.launchers.torchrun"
        assert spec.unit == f"dtlab-ddp-g3-e2-s0-{node.name}" and spec.runtime_max_s == 600
        assert spec.environment_files == ("/etc/dtlab/socket.env",) and spec.user == "dtlab"
        assert "NCCL_SOCKET_IFNAME" not in spec.env  # each node's own, from that file
    assert "--nproc_per_node=2" in planned.jobs[0][1].argv and "--nproc_per_node=1" in planned.jobs[1][1].argv
    assert planned.jobs[0][1].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert planned.jobs[1][1].env["CUDA_VISIBLE_DEVICES"] == "0"
    assert planned.result_node.name == "gpu1"
    assert planned.trainer_config["device"] == "cuda" and planned.label == "ddp (torchrun)"


def test_after_an_elastic_loss_the_result_is_looked_for_on_each_survivor_rank_0_may_move_to(gpu_cluster):
    planned = build_launch(gpu_cluster, cell(gpus=6), attempt=1, timeout_s=600)
    assert [node.name for node, _ in planned.jobs] == ["gpu1", "gpu2", "gpu3"]
    assert [node.name for node in planned.result_nodes()] == ["gpu1"]  # no loss: rank 0's first node
    assert [node.name for node in planned.result_nodes("gpu2")] == ["gpu1", "gpu3"]
    assert [node.name for node in planned.result_nodes("gpu1")] == ["gpu2", "gpu3"]


def test_cpu_inventory_means_one_single_thread_worker_per_gpu(cpu_cluster):
    planned = build_launch(cpu_cluster, cell(gpus=2), attempt=3, timeout_s=60)
    assert [(s.node.name, s.nproc, s.gpu_indices) for s in planned.placement.slots] == [
        ("n1", 1, ()),
        ("n2", 1, ()),
    ]
    config = planned.trainer_config
    assert (
        config["device"] == "cpu" and config["threads"] == 1 and config["epochs"] == 2 and config["seed"] == 0
    )
    assert config["framework_label"] == "ddp (torchrun)"
    assert config["output_dir"] == "/var/lib/dtlab/runs/ddp-g2-e2-s0/attempt-3/out"
    assert config["checkpoint_dir"] == "/var/lib/dtlab/runs/ddp-g2-e2-s0/checkpoints"  # shared by retries
    assert all(
        spec.environment_files == ("/etc/dtlab/veth9.env",) and spec.env["OMP_NUM_THREADS"] == "1"
        for _, spec in planned.jobs
    )
    assert "CUDA_VISIBLE_DEVICES" not in planned.jobs[0][1].env


def test_more_gpus_than_the_inventory_offers_fails_before_anything_starts(cpu_cluster):
    with pytest.raises(DtlabError, match="needs 3 workers but inventory hosts.yml offers 2"):
        launch.place(cpu_cluster, cell(gpus=3))


def test_spark_runs_the_launcher_on_the_master_with_n_processes(cpu_cluster):
    planned = build_launch(cpu_cluster, cell("spark", gpus=2), attempt=1, timeout_s=60)
    [(node, spec)] = planned.jobs
    assert node.name == "n0" and planned.result_node.name == "n0"
    argv = spec.argv
    assert argv[1:3] == ["-m", "trainer.launchers.spark"]
    assert argv[argv.index("--num-processes") + 1] == "2"
    assert argv[argv.index("--master") + 1] == "spark://127.0.20.10:7077"
    assert "spark.executorEnv.PYTHONPATH=/opt/dtlab/src" in argv
    # Executors inherit their own worker's interface (spark-env.sh), never one node's for all of them.
    assert not any("SOCKET_IFNAME" in arg for arg in argv)
    assert spec.env["PYSPARK_PYTHON"] == "/opt/dtlab/venv/bin/python"
    assert {n.name for n in planned.prepare_nodes} == {"n0", "n1", "n2"}  # rank 0 may land on any worker
    assert planned.label == "spark (TorchDistributor, standalone)"


def test_spark_with_a_connect_server_runs_its_cells_as_sessions_with_the_token_from_a_file(tmp_path):
    inventory = write_inventory(tmp_path, CPU_CLUSTER_3,
                                group_vars={"all": CPU_SITE_VARS + "spark_session: connect\n"})
    cluster = load_cluster(inventory)
    planned = build_launch(cluster, cell("spark", gpus=2), attempt=1, timeout_s=60)
    [(node, spec)] = planned.jobs
    assert node.name == "n0" and planned.result_node.name == "n0"
    argv = spec.argv
    assert argv[argv.index("--remote") + 1] == "sc://localhost:15002"  # the master's loopback
    assert argv[argv.index("--num-processes") + 1] == "2"
    # The server's conf is the session's (its unit sets the executors' env); --spark-conf would be refused.
    assert "--master" not in argv and "--spark-conf" not in argv
    assert spec.environment_files == (cluster.socket_env_file, "/etc/spark/connect.env")
    assert "SPARK_CONNECT_AUTHENTICATE_TOKEN" not in spec.env
    assert planned.label == "spark (TorchDistributor, Spark Connect)"


def test_ray_runs_the_driver_on_the_master_with_n_workers_and_the_token_file_not_the_token(cpu_cluster):
    planned = build_launch(cpu_cluster, cell("ray", gpus=2), attempt=1, timeout_s=60)
    [(node, spec)] = planned.jobs
    assert node.name == "n0" and planned.result_node.name == "n0"
    argv = spec.argv
    assert argv[1:3] == ["-m", "trainer.launchers.ray"]
    assert argv[argv.index("--num-workers") + 1] == "2"
    assert argv[argv.index("--address") + 1] == "127.0.20.10:6379"  # the head's GCS, from group_vars
    assert argv[argv.index("--max-failures") + 1] == "1"
    assert spec.env["RAY_AUTH_MODE"] == "token"
    assert spec.env["RAY_AUTH_TOKEN_PATH"] == "/etc/dtlab/ray/auth_token"
    assert spec.env["RAY_COLOR_PREFIX"] == "0"  # the log is a file: no colour codes in it
    assert not any("RAY_AUTH_TOKEN=" in arg for arg in argv) and "RAY_AUTH_TOKEN" not in spec.env
    # Workers keep their own node's interface (their raylet's unit), never the driver's.
    assert not any("SOCKET_IFNAME" in key for key in spec.env)
    assert {n.name for n in planned.prepare_nodes} == {"n0", "n1", "n2"}  # rank 0 may land on any worker
    assert planned.label == "ray (Ray Train, TorchTrainer)"


def test_ray_refuses_more_workers_than_the_inventory_offers_before_anything_starts(cpu_cluster):
    with pytest.raises(DtlabError, match="needs 3 workers but inventory"):
        build_launch(cpu_cluster, cell("ray", gpus=3), attempt=1, timeout_s=60)


def test_determined_without_a_master_runs_the_core_api_off_cluster_under_torchrun(cpu_cluster, tmp_path):
    no_binaries = write_inventory(
        tmp_path / "lab",
        "all:\n  children:\n    master: {hosts: {m: {ansible_host: 127.0.0.2}}}\n"
        "    workers: {hosts: {w1: {ansible_host: 127.0.0.3}, w2: {ansible_host: 127.0.0.4}}}\n",
        group_vars={"all": "dtlab_device: cpu\ndetermined_install_binaries: false\n"},
    )

    planned = build_launch(load_cluster(no_binaries), cell("determined", gpus=2), attempt=1, timeout_s=60)
    assert planned.external is None and len(planned.jobs) == 2
    argv = planned.jobs[0][1].argv
    assert argv[argv.index("-m", 3) + 1] == "trainer.launchers.determined"
    assert planned.trainer_config["framework"] == "determined"
    assert planned.label == "determined (Core API, off-cluster)"


def test_docker_runtime_wraps_torchrun_as_the_studys_listing_4_1(tmp_path):

    path = write_inventory(
        tmp_path,
        "all:\n  children:\n"
        "    master: {hosts: {m: {ansible_host: 127.0.0.2}}}\n"
        "    workers: {hosts: {w: {ansible_host: 127.0.0.3, gpu_indices: [0]}}}\n",
        group_vars={"all": "dtlab_trainer_runtime: docker\n"},
    )
    [(node, spec)] = build_launch(load_cluster(path), cell(gpus=1), attempt=1, timeout_s=60).jobs
    argv = spec.argv
    assert argv[:3] == ["docker", "run", "--rm"] and "--network=host" in argv
    assert argv[argv.index("--gpus") + 1] == "device=0" and "/opt/dtlab/src:/app:ro" in argv
    assert "--env-file=/etc/dtlab/socket.env" in argv[: argv.index("dtlab-trainer:latest")]  # container env
    assert argv[argv.index("dtlab-trainer:latest") + 1 :][:4] == [
        "python",
        "-m",
        "trainer.launchers.agent",
        "--nnodes=1",
    ]


def test_prepare_command_keeps_checkpoints_on_retry_and_drops_them_on_a_fresh_run(cpu_cluster):
    planned = build_launch(cpu_cluster, cell(gpus=1), attempt=2, timeout_s=60)
    fresh = launch.prepare_command(planned, "dtlab", fresh=True)
    retry = launch.prepare_command(planned, "dtlab", fresh=False)
    assert "rm -rf /var/lib/dtlab/runs/ddp-g1-e2-s0/checkpoints" in fresh
    assert "checkpoints &&" not in retry.split("mkdir")[0]
    assert "epochs: 2" in retry and "chown -R dtlab" in retry


def test_with_a_shared_checkpoint_dir_every_node_checkpoints_there_and_one_node_prepares_it(tmp_path):


    site = CPU_SITE_VARS + "dtlab_shared_checkpoint_dir: /mnt/nfs/dtlab\n"
    cluster = load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": site}))
    planned = build_launch(cluster, cell("spark", gpus=2), attempt=1, timeout_s=60)
    assert planned.paths.checkpoint_dir == "/mnt/nfs/dtlab/spark-g2-e2-s0/checkpoints"
    assert planned.trainer_config["checkpoint_dir"] == planned.paths.checkpoint_dir
    each_node = launch.prepare_command(planned, "dtlab", fresh=True)
    # Each node leaves the mount alone (they would race each other's rm and chown); its config names it.
    before_config, _, after_config = each_node.partition("printf")
    assert "/mnt/nfs" not in before_config and "/mnt/nfs" not in after_config.split("&& chown")[1]
    once = launch.shared_checkpoint_command(planned, "dtlab", fresh=True)
    assert once == ("rm -rf /mnt/nfs/dtlab/spark-g2-e2-s0/checkpoints && mkdir -p /mnt/nfs/dtlab/"
                    "spark-g2-e2-s0/checkpoints && chown -R dtlab /mnt/nfs/dtlab/spark-g2-e2-s0")
    assert launch.shared_checkpoint_command(planned, "dtlab", fresh=False).startswith("mkdir -p ")
    ddp = build_launch(cluster, cell("ddp", gpus=2), attempt=1, timeout_s=60)
    assert ddp.paths.checkpoint_dir.startswith("/mnt/nfs/dtlab/")  # every framework alike, for fairness


def test_without_a_shared_checkpoint_dir_nothing_is_prepared_once(cpu_cluster):
    planned = build_launch(cpu_cluster, cell("spark", gpus=2), attempt=1, timeout_s=60)
    assert launch.shared_checkpoint_command(planned, "dtlab", fresh=True) is None
    assert planned.paths.checkpoint_dir == "/var/lib/dtlab/runs/spark-g2-e2-s0/checkpoints"


def test_determined_with_a_master_renders_a_valid_experiment_for_the_cell(gpu_cluster):
    planned = build_launch(
        gpu_cluster, cell("determined", gpus=2, epochs=20, seed=3), attempt=1, timeout_s=60
    )
    assert planned.jobs == [] and planned.external is not None  # the agents run it, not our units
    experiment = planned.external.config
    assert experiment["name"] == "dtlab-determined-g2-e20-s3"
    assert experiment["resources"]["slots_per_trial"] == 2
    hyperparameters = experiment["hyperparameters"]
    assert (hyperparameters["epochs"], hyperparameters["seed"], hyperparameters["device"]) == (20, 3, "cuda")
    assert not {"output_dir", "checkpoint_dir", "cache_dir"} & set(hyperparameters)
    assert experiment["entrypoint"].endswith(
        f"--output-dir {planned.paths.output_dir} --cache-dir {planned.paths.cache_dir}"
    )
    assert {"host_path": "/var/lib/dtlab/runs", "container_path": "/var/lib/dtlab/runs"} in experiment[
        "bind_mounts"
    ]
    # The trial installs the torch build the trainer role chose, from its file on the agent.
    assert {"host_path": "/opt/dtlab/torch-build", "container_path": "/opt/dtlab/torch-build",
            "read_only": True} in experiment["bind_mounts"]
    assert ("DTLAB_TORCH_REQUIREMENTS=/opt/dtlab/torch-build/requirements.txt"
            in experiment["environment"]["environment_variables"])
    assert planned.label == "determined (Core API, cluster)"
    assert planned.external.master_url == "http://127.0.10.1:8080"
