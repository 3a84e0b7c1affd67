"""Ray: the Ray launcher runs on the master as the driver, against the Ray cluster the ray role runs.

Ray Train's TorchTrainer places the N training workers on the workers' raylets (the head offers no
slots), so Ray, not dtlab, picks which workers; the launcher copies rank 0's result to the driver's
output_dir, so the result is fetched from the master, as for Spark.
"""

from __future__ import annotations

from dtlab.cell import Cell
from dtlab.inventory import Cluster
from dtlab.launch.common import CellPaths, Launch, driver_on_master, place, trainer_env

LABEL = "ray (Ray Train, TorchTrainer)"
TRAINER_MODULE = "trainer.launchers.ray"


def auth_env(cluster: Cluster) -> dict[str, str]:
    """What a Ray client needs to be let in: token mode and the token file's path (never the token)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": cluster.ray_auth_token_file}


def build(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    placement = place(cluster, cell)  # checks the inventory offers N slots; Ray picks the workers
    paths = CellPaths(cluster, cell, attempt)
    argv = [
        cluster.python,
        "-m",
        TRAINER_MODULE,
        "--config",
        paths.config_path,
        "--num-workers",
        str(cell.gpus),
        "--address",
        cluster.ray_head_address,
        "--max-failures",
        str(int(cluster.require("ray_max_failures"))),
    ]
    # The driver forwards the trainer's environment to its workers; each worker keeps its own node's
    # socket interface (its raylet's unit reads the socket env file).
    # RAY_COLOR_PREFIX=0: Ray's driver prefixes each worker line with "(RayTrainWorker pid=..)", in
    # colour unless told not to; the log is a file, read by people and by the report.
    master = cluster.require_master("ray cells")
    env = {**trainer_env(cluster, master), **auth_env(cluster), "RAY_COLOR_PREFIX": "0"}
    return driver_on_master(cluster, placement, paths, argv, env, timeout_s, LABEL)
