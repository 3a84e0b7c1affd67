"""Ray: the Ray launcher runs on the master as the driver, against the Ray cluster the ray role runs.

Ray Train's TorchTrainer places the N training workers on the workers' raylets (the head offers no
slots), so Ray, not dtlab, picks which workers; the launcher copies rank 0's result to the driver's
output_dir, so the result is fetched from the master, as for Spark. A fault plan's `recovery: elastic`
runs Ray Train's elastic scaling; its lost node loses its raylet (lost_node_service).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

from dtlab import remote
from dtlab.cell import Cell
from dtlab.checks import CheckRow, NodeStates, service_state
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.launch import (
    CellPaths,
    Launch,
    driver_on_master,
    place,
    serve_config,
    serve_url,
    serving,
    trainer_env,
)
from dtlab.platforms.base import (
    DTLAB_RETRY,
    Platform,
    PreflightError,
    ResetSteps,
    Upstream,
    missing_unit_row,
    register,
    restart_command,
    units_down,
    why_not,
)
from dtlab.waiting import wait_until
from trainer.config import DATA_PATHS

NAME = "ray"
JOIN_WAIT_S = 60  # raylets rejoin for a while after a restart (cluster.reset, a node reboot)
LABEL = "ray (Ray Train, TorchTrainer)"
TRAINER_MODULE = "trainer.launchers.ray"
# A search cell (scenario C): the plan's trials as Ray Tune trials, as many at once as the cell has workers.
TUNE_MODULE = "trainer.launchers.ray_tune"
TUNE_LABEL = "ray-tune (Ray Tune, ASHAScheduler)"
# A serve cell (scenario C): Ray Serve's deployment, a replica a worker, a proxy on every node with one.
SERVE_MODULE = "trainer.launchers.ray_serve"
SERVE_LABEL = "ray-serve (Ray Serve, a replica a worker)"


def head_address(cluster: Cluster) -> str:
    """host:port of the Ray head's GCS on the master, where Ray drivers and workers join."""
    return f"{cluster.require_master('Ray').address}:{int(cluster.require('ray_gcs_port'))}"


def dashboard_url(cluster: Cluster) -> str:
    """The Ray dashboard and Jobs API on the master's cluster address (token-authenticated)."""
    return f"http://{cluster.require_master('Ray').address}:{int(cluster.require('ray_dashboard_port'))}"


def auth_token_file(cluster: Cluster) -> str:
    """The token file on every node (0600, dtlab_user's): RAY_AUTH_TOKEN_PATH for Ray's processes."""
    return str(cluster.require("ray_auth_token_file"))


def auth_env(cluster: Cluster) -> dict[str, str]:
    """What a Ray client needs to be let in: token mode and the token file's path (never the token)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": auth_token_file(cluster)}


def build(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    placement = place(cluster, cell)  # checks the inventory offers N slots; Ray picks the workers
    paths = CellPaths(cluster, cell, attempt)
    # The driver forwards the trainer's environment to its workers; each worker keeps its own node's
    # socket interface (its raylet's unit reads the socket env file).
    # RAY_COLOR_PREFIX=0: Ray's driver prefixes each worker line with "(RayTrainWorker pid=..)", in
    # colour unless told not to; the log is a file, read by people and by the report.
    master = cluster.require_master("ray cells")
    env = {**trainer_env(cluster, master), **auth_env(cluster), "RAY_COLOR_PREFIX": "0"}
    common = ["--config", paths.config_path, "--address", head_address(cluster)]
    port = str(cell.task_plan.get("port", ""))  # a serve cell's
    if cell.trained:  # the driver deploys the replicas and serves until bench stops it
        argv = [cluster.python, "-m", SERVE_MODULE, *common, "--host", "0.0.0.0", "--port", port,
                "--replicas", str(cell.gpus)]
        launch = driver_on_master(cluster, placement, paths, argv, env, timeout_s, SERVE_LABEL)
        launch.trainer_config = serve_config(cluster, placement, paths, SERVE_LABEL)
        urls = [serve_url(node, port) for node in placement.nodes]
        launch.serving = serving(cluster, placement, paths, timeout_s, urls, cell.gpus)
        return launch
    if cell.search:  # Tune's trials, one worker each, at most the cell's workers at once
        argv = [cluster.python, "-m", TUNE_MODULE, *common, "--search", paths.search_plan_path,
                "--max-concurrent", str(cell.gpus)]
        return driver_on_master(cluster, placement, paths, argv, env, timeout_s, TUNE_LABEL)
    argv = [cluster.python, "-m", TRAINER_MODULE, *common, "--num-workers", str(cell.gpus),
            "--max-failures", str(int(cluster.require("ray_max_failures")))]
    launch = driver_on_master(cluster, placement, paths, argv, env, timeout_s, LABEL)
    if cell.elastic:  # TorchTrainer with 1 to N workers; the survivors resume the checkpoint more wrote
        launch.trainer_config["elastic"] = True
    return launch


# --- Ray: the head's dashboard API, asked on the master with the token file there --------------------

# Runs on the master with the venv's Python: reads the token file (never printed), calls one endpoint
# of the dashboard and prints its JSON `data` (or the HTTP error as {"error": ...}).
_RAY_API_CALL = """
import json, sys, urllib.error, urllib.request
url, token_file, method = sys.argv[1:4]
token = open(token_file).read().strip()
request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None,
                                 headers={"Authorization": "Bearer " + token})
try:
    with urllib.request.urlopen(request, timeout=10) as answer:
        body = json.load(answer)
except urllib.error.HTTPError as error:
    body = {"error": f"HTTP {error.code} {error.reason}"}
except (OSError, ValueError) as error:
    body = {"error": str(error)}
print(json.dumps(body))
"""


def api_command(cluster: Cluster, path: str, method: str = "GET") -> str:
    """The shell command, run on the master, that calls one dashboard endpoint with the token file."""
    return " ".join(shlex.quote(part) for part in (
        cluster.python, "-c", _RAY_API_CALL, dashboard_url(cluster) + path, auth_token_file(cluster),
        method))


def parse_api(answer: remote.CommandResult, where: str, path: str) -> Any:
    """The endpoint's JSON, or DtlabError naming the host and what went wrong."""
    try:
        body = json.loads(answer.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DtlabError(f"host {where}: Ray dashboard gave no answer: "
                         f"{(answer.stderr or answer.stdout).strip()[-200:]}") from None
    if isinstance(body, dict) and "error" in body:
        raise DtlabError(f"host {where}: Ray dashboard {path}: {body['error']}")
    return body


def api(cluster: Cluster, path: str, method: str = "GET") -> Any:
    """One call to the Ray dashboard's REST API on the master; DtlabError when it does not answer."""
    master = cluster.require_master("Ray")
    answer = remote.run(master, api_command(cluster, path, method), timeout=30)
    return parse_api(answer, master.name, path)


def alive_workers_in(nodes_answer: Any) -> list[dict]:
    """From /api/v0/nodes' answer: the nodes other than the head that are ALIVE, with resources_total."""
    nodes = nodes_answer["data"]["result"]["result"]
    return [node for node in nodes if node.get("state") == "ALIVE" and not node.get("is_head_node")]


NODES_PATH = "/api/v0/nodes?limit=1000"


def alive_workers(cluster: Cluster, call: Callable[..., Any] = api) -> list[dict]:
    """The Ray nodes other than the head that are ALIVE, with their resources_total. `call` makes the
    API call: ray_api, over SSH on the master."""
    return alive_workers_in(call(cluster, NODES_PATH))


def wait_for_workers(cluster: Cluster, expected: int, timeout_s: float, *,
                     head_restarted: bool = False, call: Callable[..., Any] = api) -> int:
    """Alive Ray worker nodes once `expected` have joined, or after `timeout_s` (raylets rejoin for a while
    after a restart); stops early when the head does not answer, unless it was just restarted
    (`head_restarted`: its dashboard answers some seconds after its unit is active)."""

    def joined() -> int | None:
        try:
            return len(alive_workers(cluster, call))
        except DtlabError:
            return None

    alive = wait_until(joined, timeout_s=timeout_s, every_s=2,
                       until=lambda count: (count is None and not head_restarted) or (count or 0) >= expected)
    return alive or 0


def stop_jobs(cluster: Cluster, call: Callable[..., Any] = api) -> list[str]:
    """Stop every Ray job still pending or running (Jobs API); the submission ids stopped.
    `call` makes the API calls: ray_api, over SSH on the master."""
    unfinished = [job for job in call(cluster, "/api/jobs/")
                  if job.get("status") in ("PENDING", "RUNNING") and job.get("submission_id")]
    for job in unfinished:
        call(cluster, f"/api/jobs/{job['submission_id']}/stop", method="POST")
    return [job["submission_id"] for job in unfinished]


class Ray(Platform):
    name = NAME
    label = "Ray Train"
    upstream_health = Upstream(  # checked by hand on the date given
        project="Ray (Ray Train)",
        maintained=True,
        last_release="ray 2.60.0 is the release dtlab pins (constraints.txt); release date not recorded here",
        source="https://github.com/ray-project/ray/releases",
        checked="2026-11-29",
    )
    colour = "#9467bd"
    description = "Ray Train's TorchTrainer, the driver on the master, workers on the workers' raylets"
    launcher_files = ("trainer/launchers/ray.py",)
    # Ray Train's TorchTrainer, and the Ray cluster the ray role runs: "default" brings the dashboard and Jobs
    # API, which cluster.check and the token-auth tests talk to; "serve" brings Ray Serve and FastAPI with
    # uvicorn, which the plain serving baseline (trainer.launchers.serve) runs on too.
    python_client = ("ray[default,train,serve]>=2.60,<2.61",)
    node_imports = ("ray.train.torch",)
    data_paths = DATA_PATHS  # the DataLoader's, and its own ETL (trainer/platform_data.py)
    etl_label = "Ray Data: read_parquet, map_batches, the object store"
    server = "Ray Serve, a replica a worker (trainer/launchers/ray_serve.py)"
    roles = ("ray",)
    variable_prefixes = ("ray_",)
    port_ranges = (("ray_min_worker_port", "ray_max_worker_port"),)
    service_variables = ("ray_head_service", "ray_worker_service")
    check_names = ("ray head", "ray worker")
    reset_title = "Ray: stop its jobs, restart the head, then the workers (they rejoin the new head)"

    def build(self, cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
        return build(cluster, cell, attempt, timeout_s)

    def search_refusal(self, cluster: Cluster, early_stopping: str) -> str | None:
        return None  # Tune's ASHAScheduler, or its FIFOScheduler for no early stopping

    def preflight(self, cluster: Cluster, planned: Launch, sessions: remote.Sessions | None) -> None:
        needed = len(planned.placement.slots)  # the workers placement would use; Ray picks which
        head = cluster.master.name if cluster.master else None
        down = units_down(cluster.workers, self.units(cluster)["ray_worker_service"], sessions)
        # Raylets rejoin for a while after a restart; one whose unit is stopped never does.
        can_join = len(cluster.workers) - len(down) >= needed
        alive = wait_for_workers(cluster, needed, JOIN_WAIT_S if can_join else 0)
        if alive < needed:
            try:  # one more look, to say why: a head that does not answer raises with its reason
                alive = len(alive_workers(cluster))
            except DtlabError as error:
                raise PreflightError(f"preflight: {error}; run `invoke cluster.reset`", head) from None
            raise PreflightError(f"preflight: Ray head {head} has {alive} alive worker nodes, the cell needs "
                                 f"{needed}{why_not(down)}; run `invoke cluster.reset`", head)

    def check_rows(self, cluster: Cluster, states: NodeStates) -> list[CheckRow]:
        """The Ray head (its unit, and which worker nodes it sees alive with what they offer) and each
        worker's raylet unit."""
        master = cluster.master
        if master is None or master.name not in states:
            return []
        units = self.units(cluster)
        head_unit, worker_unit = units["ray_head_service"], units["ray_worker_service"]
        state = service_state(states, master.name, head_unit)
        if not state:
            return [missing_unit_row("ray head", master, head_unit)]
        try:
            alive = alive_workers(cluster)
        except DtlabError as error:
            return [CheckRow("ray head", master.name, False, f"{head_unit} {state}; {error}")]
        resource = "GPU" if cluster.device == "cuda" else "CPU"
        offered = sum(node.get("resources_total", {}).get(resource, 0) for node in alive)
        rows = [CheckRow("ray head", master.name, state == "active" and len(alive) == len(cluster.workers),
                         f"{head_unit} {state}; {len(alive)}/{len(cluster.workers)} worker nodes alive; "
                         f"{resource}s offered: {offered:g}")]
        for worker in cluster.workers:
            state = service_state(states, worker.name, worker_unit)
            rows.append(CheckRow("ray worker", worker.name, state == "active",
                                 f"{worker_unit} {state or 'not installed'}"))
        return rows

    def reset(self, steps: ResetSteps) -> list[CheckRow]:
        if steps.masters:
            try:
                stopped = stop_jobs(steps.cluster)
                steps.say(f"  stopped {len(stopped)} Ray job(s)" if stopped else "  no Ray job running")
            except DtlabError as error:
                steps.say(f"  [yellow]could not list Ray jobs ({error}); the restart ends them[/]")
        units = self.units(steps.cluster)
        steps.run(steps.masters, restart_command(units["ray_head_service"]), "restart ray head", 120)
        steps.run(steps.cluster.workers, restart_command(units["ray_worker_service"]),
                  "restart ray workers", 120)
        return []

    def wait_ready(self, cluster: Cluster, workers: list[Node], timeout_s: float) -> None:
        wait_for_workers(cluster, len(workers), timeout_s, head_restarted=True)

    def recovery(self, cluster: Cluster) -> str:
        failures = cluster.require("ray_max_failures")
        return f"Ray Train FailureConfig(max_failures={failures}), then {DTLAB_RETRY}"

    def elastic_refusal(self, cluster: Cluster) -> str | None:
        return None  # Ray Train's elastic ScalingConfig (Ray 2.60's Train v2, the default)

    def elastic_recovery(self, cluster: Cluster) -> str:
        failures = cluster.require("ray_max_failures")
        return (f"Ray Train's elastic scaling (ScalingConfig(num_workers=(1, N)), FailureConfig(max_failures="
                f"{failures})): the group starts again on the workers still alive and resumes the checkpoint")

    def lost_node_service(self, cluster: Cluster) -> str:
        return self.units(cluster)["ray_worker_service"]  # the ranks are its raylet's actors


PLATFORM = register(Ray())
