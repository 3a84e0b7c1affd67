"""Spark: the Spark launcher runs on the master as the driver, against the standalone cluster, N processes.

TorchDistributor places the N barrier tasks on the workers; the launcher copies rank 0's result to the
driver's output_dir, so the result is fetched from the master.
"""

from __future__ import annotations

import json
from typing import Any

from dtlab import remote
from dtlab.cell import Cell
from dtlab.checks import CheckRow, NodeStates, service_state
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.launch import CellPaths, Launch, driver_on_master, place, trainer_env
from dtlab.platforms.base import (
    DTLAB_RETRY,
    NO_GPU_CPU_INVENTORY,
    Platform,
    PreflightError,
    Release,
    ResetSteps,
    missing_unit_row,
    restart_command,
    units_down,
    why_not,
)
from dtlab.roles import role_value
from dtlab.waiting import wait_until

NAME = "spark"
REGISTER_WAIT_S = 60  # workers re-register for a while after a restart (cluster.reset, a node reboot)
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


# --- what the master says: its JSON endpoint, asked on the master itself ------------------------------

def alive_worker_info(cluster: Cluster) -> list[dict]:
    """The alive workers from the Spark master's JSON endpoint, asked on the master itself ([] if none)."""
    master = cluster.master
    if master is None:
        return []
    url = f"http://{master.address}:{cluster.spark_master_webui_port}/json/"
    probe = (
        f'{cluster.python} -c "import json,urllib.request;'
        f"w=json.load(urllib.request.urlopen('{url}', timeout=5)).get('workers', []);"
        "print(json.dumps([x for x in w if x.get('state') == 'ALIVE']))\""
    )
    answer = remote.run(master, probe, timeout=30)
    try:
        return json.loads(answer.stdout.strip().splitlines()[-1]) if answer.ok else []
    except (ValueError, IndexError):
        return []


def alive_workers(cluster: Cluster) -> int:
    return len(alive_worker_info(cluster))


def wait_for_workers(cluster: Cluster, expected: int, timeout_s: float) -> int:
    """Alive Spark workers once `expected` have registered, or after `timeout_s` (workers re-register
    for a while after a restart); stops early when the master does not answer."""

    def count() -> int | None:
        try:
            return alive_workers(cluster)
        except DtlabError:  # the master does not answer: the caller reports what is alive
            return None

    alive = wait_until(count, until=lambda n: n is None or n >= expected, timeout_s=timeout_s, every_s=2)
    return alive or 0


def worker_gpus(cluster: Cluster) -> int:
    """GPUs the Spark master sees on its alive workers (the study's Listings 4.2/4.3 make them visible)."""
    return sum(len((worker.get("resources") or {}).get("gpu", {}).get("addresses", []))
               for worker in alive_worker_info(cluster))


def gpu_rows(workers: list[Node], alive: list[dict[str, Any]]) -> list[CheckRow]:
    """Each GPU worker alive on the Spark master (its /json/ "workers") with one GPU address per GPU."""
    rows = []
    for worker in workers:
        entries = [w for w in alive if w.get("host") == worker.address]
        expected = len(worker.gpu_indices)
        if not entries:
            rows.append(CheckRow("spark GPUs", worker.name, False,
                                 f"no alive Spark worker on {worker.address} at the master"))
            continue
        addresses = (entries[0].get("resources") or {}).get("gpu", {}).get("addresses", [])
        rows.append(CheckRow("spark GPUs", worker.name, len(addresses) == expected,
                             f"gpu amount {len(addresses)} (addresses {','.join(addresses) or 'none'}),"
                             f" expected {expected}"))
    return rows


class Spark(Platform):
    name = NAME
    label = "Apache Spark"
    colour = "#d62728"
    description = "TorchDistributor on a standalone Spark cluster: the driver on the master, barrier tasks"
    launcher_files = ("trainer/launchers/spark.py", "trainer/launchers/_spark.py")
    roles = ("spark",)
    variable_prefixes = ("spark_",)
    service_variables = ("spark_master_service", "spark_worker_service")
    check_names = ("spark master", "spark GPUs")
    reset_title = "Spark: restart the master (ends running applications), then the workers"

    def build(self, cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
        return build(cluster, cell, attempt, timeout_s)

    def offline_releases(self, cluster: Cluster) -> list[Release]:
        """The Apache release tarball and its published sha512, where Spark installs from the tarball."""
        if str(cluster.var("spark_install_method", "tarball")) != "tarball":
            return []
        node = cluster.master or cluster.nodes[0]
        url = role_value(node, "spark", "spark_tarball_url", str(cluster.require("dtlab_node_os")))
        return [Release(NAME, str(cluster.var("spark_version")), url, checksum_url=f"{url}.sha512")]

    def preflight(self, cluster: Cluster, planned: Launch, sessions: remote.Sessions | None) -> None:
        needed = min(planned.cell.gpus, len(cluster.workers))
        down = units_down(cluster.workers, self.units(cluster)["spark_worker_service"], sessions)
        # Workers re-register for a while after a restart; one whose unit is stopped never does.
        can_register = len(cluster.workers) - len(down) >= needed
        alive = wait_for_workers(cluster, needed, REGISTER_WAIT_S if can_register else 0)
        if alive < needed:
            master = cluster.master.name if cluster.master else None
            raise PreflightError(f"preflight: Spark master {master or '?'} has {alive} alive workers, the "
                                 f"cell needs {needed}{why_not(down)}; run `invoke cluster.reset`", master)

    def check_rows(self, cluster: Cluster, states: NodeStates) -> list[CheckRow]:
        master = cluster.master
        if master is None or master.name not in states:
            return []
        unit = self.units(cluster)["spark_master_service"]
        state = service_state(states, master.name, unit)
        if not state:
            return [missing_unit_row("spark master", master, unit)]
        alive, expected = alive_workers(cluster), len(cluster.workers)
        detail = f"{unit} {state}; {alive}/{expected} workers alive"
        if cluster.device == "cuda":
            detail += f"; GPUs offered: {worker_gpus(cluster)}"
        return [CheckRow("spark master", master.name, alive == expected and state == "active", detail)]

    def gpu_rows(self, cluster: Cluster, workers: list[Node]) -> list[CheckRow]:
        if cluster.device != "cuda":
            return [CheckRow("spark GPUs", w.name, True, NO_GPU_CPU_INVENTORY, required=False)
                    for w in workers]
        return gpu_rows([w for w in workers if w.uses_gpu], alive_worker_info(cluster))

    def reset(self, steps: ResetSteps) -> list[CheckRow]:
        units = self.units(steps.cluster)
        steps.run(steps.masters, restart_command(units["spark_master_service"]), "restart spark master", 120)
        steps.run(steps.cluster.workers, restart_command(units["spark_worker_service"]),
                  "restart spark workers", 120)
        return []

    def wait_ready(self, cluster: Cluster, workers: list[Node], timeout_s: float) -> None:
        wait_for_workers(cluster, len(workers), timeout_s)

    def recovery(self, cluster: Cluster) -> str:
        # A barrier ResultStage (TorchDistributor's collect) is aborted, never retried, by Spark.
        return DTLAB_RETRY


PLATFORM = Spark()
