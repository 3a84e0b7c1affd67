"""Spark: the Spark launcher runs on the master as the driver, against the standalone cluster, N processes.

TorchDistributor places the N barrier tasks on the workers; the launcher copies rank 0's result to the
driver's output_dir, so the result is fetched from the master.
"""

from __future__ import annotations

from dtlab.cell import Cell
from dtlab.inventory import Cluster
from dtlab.launch.common import CellPaths, Launch, driver_on_master, place, trainer_env

LABEL = "spark (TorchDistributor, standalone)"
TRAINER_MODULE = "trainer.launchers.spark"


def master_url(cluster: Cluster) -> str:
    return f"spark://{cluster.require_master('Spark').address}:{cluster.spark_master_port}"


def build(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    placement = place(cluster, cell)  # checks the inventory offers N slots; Spark picks the workers
    paths = CellPaths(cluster, cell, attempt)
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
    env = trainer_env(cluster, cluster.require_master("spark cells"))
    env["PYSPARK_PYTHON"] = cluster.python
    # SPARK_CONF_DIR's spark-defaults.conf carries spark.authenticate and its secret (never argv).
    for key in ("spark_home", "spark_conf_dir"):
        if cluster.var(key):
            env[key.upper()] = str(cluster.var(key))
    return driver_on_master(cluster, placement, paths, argv, env, timeout_s, LABEL)
