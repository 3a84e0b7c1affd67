"""Spark: the Spark launcher runs on the master as the driver, against the standalone cluster, N processes.

TorchDistributor places the N barrier tasks on the workers; the launcher copies rank 0's result to the
driver's output_dir, so the result is fetched from the master. With spark_session: connect (group_vars),
the launcher runs each cell as a session on the master's Spark Connect server (the spark role's unit),
whose driver and executors stay up between cells, instead of as its own application.
"""

from __future__ import annotations

import json
import time
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
    Upstream,
    missing_unit_row,
    register,
    restart_command,
    unit_command,
    units_down,
    why_not,
)
from dtlab.platforms.spark import inventory_checks
from dtlab.roles import role_value
from dtlab.waiting import wait_until
from trainer.config import DATA_PATHS
from trainer.launchers._spark import CONNECT_LABEL, STANDALONE_LABEL

NAME = "spark"
REGISTER_WAIT_S = 60  # workers re-register for a while after a restart (cluster.reset, a node reboot)
TRAINER_MODULE = "trainer.launchers.spark"


def master_port(cluster: Cluster) -> int:
    return int(cluster.require("spark_master_port"))


def master_webui_port(cluster: Cluster) -> int:
    return int(cluster.require("spark_master_webui_port"))


def master_url(cluster: Cluster) -> str:
    return f"spark://{cluster.require_master('Spark').address}:{master_port(cluster)}"


def connect_session(cluster: Cluster) -> bool:
    """Whether spark cells run as sessions on the master's Spark Connect server (spark_session: connect)."""
    return str(cluster.require("spark_session")) == "connect"  # checked when the inventory is read


def connect_url(cluster: Cluster) -> str:
    # "localhost": the server listens on the master's loopback, and pyspark sends its token only there.
    return f"sc://localhost:{cluster.require('spark_connect_port')}"


def executor_env(cluster: Cluster) -> dict[str, str]:
    """The training processes' environment on the executors (the spark role's Connect unit sets the same).
    No socket interface here: each executor inherits its own worker's (the spark role's spark-env.sh)."""
    return {
        "PYTHONPATH": cluster.code_dir,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HOME": f"{cluster.data_dir}/huggingface",
    }


def build(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    placement = place(cluster, cell)  # checks the inventory offers N slots; Spark picks the workers
    paths = CellPaths(cluster, cell, attempt)
    argv = [cluster.python, "-m", TRAINER_MODULE, "--config", paths.config_path,
            "--num-processes", str(cell.gpus)]
    env = trainer_env(cluster, cluster.require_master("spark cells"))
    if connect_session(cluster):  # the server's conf is the session's: its unit sets the executors' env
        argv += ["--remote", connect_url(cluster)]
        token_file = (str(cluster.require("spark_connect_env_file")),)  # its token, never argv
        return driver_on_master(cluster, placement, paths, argv, env, timeout_s, CONNECT_LABEL,
                                environment_files=token_file)
    argv += ["--master", master_url(cluster)]
    for key, value in executor_env(cluster).items():
        argv += ["--spark-conf", f"spark.executorEnv.{key}={value}"]
    env["PYSPARK_PYTHON"] = cluster.python
    # SPARK_CONF_DIR's spark-defaults.conf carries spark.authenticate and its secret (never argv).
    for key in ("spark_home", "spark_conf_dir"):
        if cluster.var(key):
            env[key.upper()] = str(cluster.var(key))
    return driver_on_master(cluster, placement, paths, argv, env, timeout_s, STANDALONE_LABEL)


# --- what the master says: its JSON endpoint, asked on the master itself ------------------------------

def master_state(cluster: Cluster) -> dict[str, Any]:
    """The Spark master's JSON endpoint (workers, active applications), asked on the master itself ({} if
    it does not answer)."""
    master = cluster.master
    if master is None:
        return {}
    url = f"http://{master.address}:{master_webui_port(cluster)}/json/"
    probe = (
        f'{cluster.python} -c "import json,urllib.request;'
        f"s=json.load(urllib.request.urlopen('{url}', timeout=5));"
        "print(json.dumps({k: s.get(k, []) for k in ('workers', 'activeapps')}))\""
    )
    answer = remote.run(master, probe, timeout=30)
    try:
        return json.loads(answer.stdout.strip().splitlines()[-1]) if answer.ok else {}
    except (ValueError, IndexError):
        return {}


def alive_worker_info(cluster: Cluster) -> list[dict]:
    """The alive workers from the Spark master's JSON endpoint ([] if none)."""
    return [worker for worker in master_state(cluster).get("workers", []) if worker.get("state") == "ALIVE"]


def connect_cores(cluster: Cluster, state: dict[str, Any]) -> int:
    """Cores the master has granted the Connect server's application (named as its unit)."""
    name = str(cluster.require("spark_connect_service"))
    return sum(int(app.get("cores", 0)) for app in state.get("activeapps", []) if app.get("name") == name)


def cores_needed(cluster: Cluster, processes: int) -> int:
    return processes * cluster.threads_per_worker


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


def wait_for_connect_cores(cluster: Cluster, needed: int, timeout_s: float) -> int:
    """Cores granted to the Connect server once it holds `needed`, or after `timeout_s`."""

    def granted() -> int | None:
        try:
            return connect_cores(cluster, master_state(cluster))
        except DtlabError:  # the master does not answer: the caller reports what is granted
            return None

    return wait_until(granted, until=lambda n: n is None or n >= needed, timeout_s=timeout_s, every_s=2) or 0


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
    upstream_health = Upstream(  # checked by hand on the date given
        project="Apache Spark (pyspark's TorchDistributor)",
        maintained=True,
        last_release=("pyspark 4.3.0 is the release dtlab pins (constraints.txt); "
                      "release date not recorded here"),
        source="https://spark.apache.org/news/",
        checked="2026-11-29",
    )
    colour = "#d62728"
    description = "TorchDistributor on a standalone Spark cluster: the driver on the master, barrier tasks"
    launcher_files = ("trainer/launchers/spark.py", "trainer/launchers/_spark.py")
    # TorchDistributor needs pandas and pyarrow on the driver and executors; "connect" is the Spark Connect
    # client (grpcio-status, zstandard), for a run on a Connect server's warm executors.
    python_client = ("pyspark[connect]>=4.0,<5", "pandas>=2.0", "pyarrow>=14")
    node_imports = ("pandas", "pyarrow", "pyspark.ml.torch.distributor", "pyspark.sql.connect.session")
    data_paths = DATA_PATHS  # the DataLoader's, and its own ETL (trainer/platform_data.py)
    etl_label = "Spark DataFrame: read Parquet, mapInPandas, Parquet on the shared disk"
    roles = ("spark",)
    variable_prefixes = ("spark_",)
    service_variables = ("spark_master_service", "spark_worker_service", "spark_connect_service")
    check_names = ("spark master", "spark connect", "spark GPUs")
    reset_title = ("Spark: restart the master (ends running applications), then the workers, then the Connect"
                   " server where it runs (under spark_session application: stopped where installed)")

    def check_inventory_host(self, where: str, node: Node) -> None:
        inventory_checks.check_host(where, node)

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
        if connect_session(cluster):
            self._preflight_connect(cluster, cores_needed(cluster, planned.cell.gpus), sessions)

    def _preflight_connect(self, cluster: Cluster, needed: int, sessions: remote.Sessions | None) -> None:
        """The Connect server runs and holds the cell's cores (after a restart, it takes a while to)."""
        master = cluster.require_master("spark cells")
        down = units_down([master], self.units(cluster)["spark_connect_service"], sessions)
        granted = wait_for_connect_cores(cluster, needed, 0 if down else REGISTER_WAIT_S)
        if granted < needed:
            raise PreflightError(f"preflight: the Spark Connect server on {master.name} holds {granted} "
                                 f"cores, the cell needs {needed}{why_not(down)}; run `invoke cluster.reset`",
                                 master.name)

    def check_rows(self, cluster: Cluster, states: NodeStates) -> list[CheckRow]:
        master = cluster.master
        if master is None or master.name not in states:
            return []
        return [self._master_row(cluster, states, master), *self._connect_rows(cluster, states, master)]

    def _master_row(self, cluster: Cluster, states: NodeStates, master: Node) -> CheckRow:
        unit = self.units(cluster)["spark_master_service"]
        state = service_state(states, master.name, unit)
        if not state:
            return missing_unit_row("spark master", master, unit)
        alive, expected = alive_workers(cluster), len(cluster.workers)
        detail = f"{unit} {state}; {alive}/{expected} workers alive"
        if cluster.device == "cuda":
            detail += f"; GPUs offered: {worker_gpus(cluster)}"
        return CheckRow("spark master", master.name, alive == expected and state == "active", detail)

    def _connect_rows(self, cluster: Cluster, states: NodeStates, master: Node) -> list[CheckRow]:
        """With spark_session: connect, the server runs and holds the largest cell's cores. Without it, no
        server runs: one left running holds the workers' cores, and the standalone cells find none."""
        unit = self.units(cluster)["spark_connect_service"]
        state = service_state(states, master.name, unit)
        if not connect_session(cluster):
            if state == "active":
                return [CheckRow("spark connect", master.name, False,
                                 f"{unit} active although spark_session is application: it holds the "
                                 "workers' cores; `invoke cluster.reset` stops it, ansible-playbook site.yml "
                                 "removes it")]
            return []
        if not state:
            return [missing_unit_row("spark connect", master, unit)]
        granted = connect_cores(cluster, master_state(cluster))
        needed = cores_needed(cluster, cluster.max_gpus)
        return [CheckRow("spark connect", master.name, state == "active" and granted >= needed,
                         f"{unit} {state}; {granted} cores granted, the largest cell needs {needed}")]

    def gpu_rows(self, cluster: Cluster, workers: list[Node]) -> list[CheckRow]:
        if cluster.device != "cuda":
            return [CheckRow("spark GPUs", w.name, True, NO_GPU_CPU_INVENTORY, required=False)
                    for w in workers]
        return gpu_rows([w for w in workers if w.uses_gpu], alive_worker_info(cluster))

    def reset(self, steps: ResetSteps) -> list[CheckRow]:
        units = self.units(steps.cluster)
        connect = connect_session(steps.cluster)
        if not connect:  # a server left from spark_session connect holds the workers' cores: stopped first
            steps.run(steps.masters, unit_command(units["spark_connect_service"], "stop"),
                      "stop spark connect", 120)
        steps.run(steps.masters, restart_command(units["spark_master_service"]), "restart spark master", 120)
        steps.run(steps.cluster.workers, restart_command(units["spark_worker_service"]),
                  "restart spark workers", 120)
        if connect:  # its sessions end, its executors restart
            steps.run(steps.masters, restart_command(units["spark_connect_service"]), "restart spark connect",
                      120)
        return []

    def wait_ready(self, cluster: Cluster, workers: list[Node], timeout_s: float) -> None:
        started = time.monotonic()
        wait_for_workers(cluster, len(workers), timeout_s)
        if connect_session(cluster):
            left = max(0.0, timeout_s - (time.monotonic() - started))
            wait_for_connect_cores(cluster, cores_needed(cluster, cluster.max_gpus), left)

    def recovery(self, cluster: Cluster) -> str:
        # A barrier ResultStage (TorchDistributor's collect) is aborted, never retried, by Spark.
        return DTLAB_RETRY


PLATFORM = register(Spark())
