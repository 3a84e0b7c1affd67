"""Spark: the Spark launcher runs on the master as the driver, against the standalone cluster, N processes.

TorchDistributor places the N barrier tasks on the workers; the launcher copies rank 0's result to the
driver's output_dir, so the result is fetched from the master.
"""

from __future__ import annotations

from dtlab.cell import Cell
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster
from dtlab.launch.common import CellPaths, Launch, place, trainer_config, trainer_env, unit
from dtlab.remote import UnitSpec

LABEL = "spark (TorchDistributor, standalone)"
TRAINER_MODULE = "trainer.launchers.spark"


def master_url(cluster: Cluster) -> str:
    if cluster.master is None:
        raise DtlabError(f"inventory {cluster.inventory_path}: spark cells need a master host")
    return f"spark://{cluster.master.address}:{cluster.spark_master_port}"


def build(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    placement = place(cluster, cell)  # checks the inventory offers N slots; Spark picks the workers
    paths = CellPaths(cluster, cell, attempt)
    label = LABEL
    master = cluster.master
    if master is None:
        raise DtlabError(f"inventory {cluster.inventory_path}: spark cells need a host in group master")
    # No socket interface here: each executor inherits its own worker's (the spark role's spark-env.sh).
    executor_env = {
        "PYTHONPATH": cluster.code_dir,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HOME": f"{cluster.data_dir}/huggingface",
    }
    argv = [
        cluster.python,
        "-m",
        TRAINER_MODULE,
        "--config",
        paths.config_path,
        "--num-processes",
        str(cell.gpus),
        "--master",
        master_url(cluster),
    ]
    for key, value in executor_env.items():
        argv += ["--spark-conf", f"spark.executorEnv.{key}={value}"]
    env = trainer_env(cluster, master)
    env["PYSPARK_PYTHON"] = cluster.python
    # SPARK_CONF_DIR's spark-defaults.conf carries spark.authenticate and its secret (never argv).
    for key in ("spark_home", "spark_conf_dir"):
        if cluster.var(key):
            env[key.upper()] = str(cluster.var(key))
    job = UnitSpec(
        unit=unit(cell, master),
        argv=argv,
        log_path=paths.log_path(master),
        user=cluster.user,
        workdir=cluster.code_dir,
        env=env,
        environment_file=cluster.socket_env_file,
        runtime_max_s=timeout_s,
    )
    # Executors may run on any worker: each gets the attempt's dirs so rank 0 can write wherever it lands.
    return Launch(
        cell=cell,
        placement=placement,
        paths=paths,
        jobs=[(master, job)],
        prepare_nodes=(master, *cluster.workers),
        result_node=master,
        trainer_config=trainer_config(cluster, placement, paths, label),
        label=label,
    )
