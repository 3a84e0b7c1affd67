"""Determined: with a master, an experiment created from the rendered config through the Python SDK;
without one (the lab: no Determined binaries), the Core API entry run off-cluster under torchrun.

Off-cluster cells are labelled "determined (Core API, off-cluster)", never as a Determined cluster run.
Every trial runs in determined_trial_image; check_trial_image asks each agent whether that image's
python3 can install the pins (cluster.check's rows, and the preflight of each cell on a master).
"""

from __future__ import annotations

import base64
import copy
import json
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from dtlab import paths as dtlab_paths
from dtlab import remote
from dtlab.cell import Cell
from dtlab.checks import CheckRow, NodeStates, service_state
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.launch import CellPaths, Launch, place, trainer_config
from dtlab.platforms import ddp
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
)
from dtlab.platforms.determined import master as detmaster
from dtlab.roles import role_value
from dtlab.waiting import wait_until

if TYPE_CHECKING:
    from dtlab.platforms.determined.config import TrialImageVerdict

NAME = "determined"
OFF_CLUSTER_LABEL = "determined (Core API, off-cluster)"
CLUSTER_LABEL = "determined (Core API, cluster)"
TRAINER_MODULE = "trainer.launchers.determined"
# A search cell without a master (the lab): a stand-in for Determined's searcher, dtlab's ASHA sweep under
# torchrun; the adaptive_asha experiment a master would run is still rendered and validated against
# Determined's schema, and recorded with the search.
SEARCH_STAND_IN_LABEL = "determined searcher stand-in: dtlab's ASHA sweep under torchrun (no master)"
EXPERIMENTS_DIR = dtlab_paths.EXPERIMENTS_DIR / "determined"
POLL_S = 10
FINAL_STATES = ("COMPLETED", "CANCELED", "ERROR", "DELETED")  # words in the state's name
# Node paths go to the entrypoint as flags; a trial checkpoints into the master's checkpoint storage.
NOT_HYPERPARAMETERS = ("output_dir", "checkpoint_dir", "cache_dir")
TRIAL_IMAGE_PROBE_TIMEOUT_S = 300  # a first `docker run` of a large image (copying its layers) included


def has_master(cluster: Cluster) -> bool:
    """True where the Determined binaries are installed; the lab skips them (no download here)."""
    return bool(cluster.require("determined_install_binaries")) and cluster.master is not None


def postgresql_port(cluster: Cluster) -> int:
    return int(cluster.require("postgresql_port"))


def build(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    if cell.search:
        return search_stand_in(cluster, cell, attempt, timeout_s)
    if not has_master(cluster):
        # Determined's DistributedContext needs the chief's address once the job spans nodes.
        chief = place(cluster, cell).slots[0].node
        return ddp.build(
            cluster,
            cell,
            attempt,
            timeout_s,
            module=TRAINER_MODULE,
            label=OFF_CLUSTER_LABEL,
            extra_env={"DET_CHIEF_IP": chief.address},
        )
    placement = place(cluster, cell)
    paths = CellPaths(cluster, cell, attempt)
    label = CLUSTER_LABEL
    config = trainer_config(cluster, placement, paths, label)
    experiment = ClusterExperiment(cluster, cell, render_experiment(cluster, cell, config), timeout_s)
    # No units of our own: the agents run the trial; rank 0 writes result.json on its agent node.
    return Launch(
        cell=cell,
        placement=placement,
        paths=paths,
        jobs=[],
        prepare_nodes=tuple(cluster.workers),
        result_node=placement.slots[0].node,
        trainer_config=config,
        label=label,
        external=experiment,
    )


def search_stand_in(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    """The searcher's stand-in (no master): the sweep with dtlab's ASHA rule, beside the adaptive_asha
    experiment config over the same space and budget that a master would run (validated offline)."""
    from dtlab.platforms.determined import config as detconfig
    from dtlab.search import SearchSpec

    launch = ddp.build(cluster, cell, attempt, timeout_s, module=ddp.SWEEP_MODULE,
                       label=SEARCH_STAND_IN_LABEL)
    searcher = detconfig.searcher_experiment(render_experiment(cluster, cell, launch.trainer_config),
                                             SearchSpec.from_plan(cell.task_plan), f"searcher for {cell.key}")
    searcher = json.loads(json.dumps(searcher))  # plain str: the inventory's templated values are subclasses
    launch.files[f"{launch.paths.attempt_dir}/determined-search.yaml"] = yaml.safe_dump(searcher,
                                                                                        sort_keys=False)
    launch.result_extra["determined_searcher"] = searcher["searcher"]
    return launch


def experiment_template(slots: int) -> Path:
    """experiments/determined/*-<N>slot.yaml: the 1-slot and 2-slot variants the trainer keeps."""
    candidates = sorted(EXPERIMENTS_DIR.glob(f"*-{slots}slot.y*ml"))
    if not candidates:
        raise DtlabError(
            f"{EXPERIMENTS_DIR}: no *-{slots}slot.yaml experiment config; add one for {slots} slots"
        )
    return candidates[0]


def render_experiment(cluster: Cluster, cell: Cell, config: dict[str, Any]) -> dict[str, Any]:
    """The template with this cell's slots, epochs, seed and options; validated offline (detconfig)."""
    from dtlab.platforms.determined import config as detconfig

    rendered = copy.deepcopy(detconfig.load_experiment(experiment_template(cell.gpus)))
    rendered["name"] = f"dtlab-{cell.key}"
    rendered.setdefault("resources", {})["slots_per_trial"] = cell.gpus
    hyperparameters = {k: v for k, v in config.items() if k not in NOT_HYPERPARAMETERS and v is not None}
    rendered["hyperparameters"] = {**(rendered.get("hyperparameters") or {}), **hyperparameters}
    rendered["reproducibility"] = {"experiment_seed": cell.seed}
    # One image for CPU and CUDA slots. force_pull_image false: the agent then runs the image Docker has
    # (the trainer role builds it on every node) and pulls only when it is missing (docs/determined.md).
    environment = rendered.setdefault("environment", {})
    environment.update(image=trial_image(cluster), force_pull_image=False)
    if cell.fault:  # a fault plan measures the master's own recovery: it restarts the trial
        rendered["max_restarts"] = int(cluster.require("determined_fault_max_restarts"))
    rendered["entrypoint"] = (
        f"{rendered['entrypoint'].strip()} --output-dir {config['output_dir']} "
        f"--cache-dir {config['cache_dir']}"
    )
    # The trial's container sees the node's runs dir, so rank 0's result.json lands where bench looks.
    mounts = [m for m in rendered.get("bind_mounts") or [] if m.get("container_path") != cluster.runs_dir]
    rendered["bind_mounts"] = [*mounts, {"host_path": cluster.runs_dir, "container_path": cluster.runs_dir}]
    _add_torch_build(rendered, cluster.var("dtlab_torch_build_dir"))
    return detconfig.validate_experiment(rendered, f"experiment for {cell.key}")


def _add_torch_build(rendered: dict[str, Any], torch_build_dir: str | None) -> None:
    """The trial installs the torch build the trainer role chose (the nodes' venvs have the same one):
    its requirements file on the agent, mounted read-only and named by DTLAB_TORCH_REQUIREMENTS for
    startup-hook.sh."""
    if not torch_build_dir:
        return
    rendered["bind_mounts"].append({"host_path": torch_build_dir, "container_path": torch_build_dir,
                                    "read_only": True})
    setting = f"DTLAB_TORCH_REQUIREMENTS={torch_build_dir}/requirements.txt"
    environment = rendered.setdefault("environment", {})
    variables = environment.get("environment_variables") or []
    if isinstance(variables, dict):  # per slot type: {cpu: [...], cuda: [...]}
        environment["environment_variables"] = {kind: [*values, setting]
                                                for kind, values in variables.items()}
    else:
        environment["environment_variables"] = [*variables, setting]


def trial_image(cluster: Cluster) -> str:
    """The image every trial runs in (inventory: determined_trial_image)."""
    return str(cluster.require("determined_trial_image"))


# --- the trial image on the agents: can its python3 install the pins? (its config module decides) ----
PROBE_DIR = "/dtlab-probe"  # where the probe and the hook's pin files appear inside the image
# How the probe enters the image on an agent: Docker, as Determined's agent runs a trial (root, no
# network: the answer must not depend on an index). {image}, {mounts} and {entry} are shell words; the
# staged files are in the shell variable $staged.
DOCKER_RUN_PROBE = ('docker run --rm --pull never --network none --user 0:0 -v "$staged:{probe_dir}:ro" '
                    "{mounts} --entrypoint /bin/bash {image} -c {entry}")


def trial_image_probe_command(image: str, torch_requirements: str | None,
                              run_probe: str = DOCKER_RUN_PROBE) -> str:
    """The shell command an agent runs: stage the probe files, run the probe in the image, clean up.
    Exits detconfig.PROBE_MISSING_IMAGE_EXIT when the agent's Docker does not have the image."""
    from dtlab.platforms.determined import config as detconfig

    staging = [f"printf %s {base64.b64encode(text.encode()).decode()} | base64 -d > \"$staged\"/{name}"
               for name, text in detconfig.trial_image_probe_files().items()]
    probe = f"{PROBE_DIR}/{detconfig.TRIAL_IMAGE_PROBE.name}"
    entry = ('python3 --version >/dev/null 2>&1 || { echo \'{"python": null}\'; exit 0; }; '
             f"exec python3 {probe} {shlex.quote(torch_requirements or '')}")
    mounts = ""
    if torch_requirements:  # the trial gets the torch build's requirements file the same way
        folder = shlex.quote(torch_requirements.rpartition("/")[0] or "/")
        mounts = f"$(test -f {shlex.quote(torch_requirements)} && echo -v {folder}:{folder}:ro)"
    run = run_probe.format(probe_dir=PROBE_DIR, mounts=mounts, image=shlex.quote(image),
                           entry=shlex.quote(entry))
    return "; ".join([
        f"docker image inspect {shlex.quote(image)} >/dev/null 2>&1 || "
        f"{{ echo 'no image {image} in Docker here' >&2; exit {detconfig.PROBE_MISSING_IMAGE_EXIT}; }}",
        "staged=$(mktemp -d /tmp/dtlab-trial-image.XXXXXX) || exit 1",
        'trap \'rm -rf "$staged"\' EXIT',
        *staging,
        'chmod -R a+rX "$staged"',
        f"timeout {TRIAL_IMAGE_PROBE_TIMEOUT_S - 10} {run}",
    ])


def check_trial_image(cluster: Cluster, nodes: Sequence[Node], image: str | None = None,
                      sessions: remote.Sessions | None = None,
                      run_probe: str = DOCKER_RUN_PROBE) -> list[TrialImageVerdict]:
    """One verdict per node, in the given order: the probe run in the trial image there."""
    from dtlab.platforms.determined import config as detconfig

    image = image or trial_image(cluster)
    build_dir = cluster.var("dtlab_torch_build_dir")
    torch_requirements = f"{build_dir}/requirements.txt" if build_dir else None
    command = trial_image_probe_command(image, torch_requirements, run_probe)

    def probe(node: Node) -> remote.CommandResult:
        return remote.run(node, command, timeout=TRIAL_IMAGE_PROBE_TIMEOUT_S, sessions=sessions)

    answers = remote.fan_out(nodes, probe)
    verdicts = []
    for node in nodes:
        answer = answers[node.name]
        if isinstance(answer, BaseException):
            verdicts.append(detconfig.TrialImageVerdict(node.name, image, False, f"determined: trial image "
                                                        f"{image} on {node.name} not checked: {answer}"))
            continue
        verdicts.append(detconfig.trial_image_verdict(node.name, image, answer.exit_code, answer.stdout,
                                                      answer.stderr))
    return verdicts


@dataclass
class ClusterExperiment:
    """Create, wait for and read one experiment through the master (det SDK), bounded by the cell timeout
    (dtlab.launch's ExternalJob)."""

    result_key: ClassVar[str] = "determined_master"

    cluster: Cluster
    cell: Cell
    config: dict[str, Any]
    timeout_s: int
    experiment_id: int | None = None

    @property
    def master_url(self) -> str:
        return detmaster.master_url(self.cluster)

    def run(self) -> dict[str, Any]:
        from dtlab.platforms.determined import config as detconfig

        det = detmaster.connect(self.cluster)  # admin, with the password the master was given
        with tempfile.TemporaryDirectory(prefix="dtlab-det-context-") as context:
            experiment = det.create_experiment(
                config=self.config, model_dir=str(detconfig.stage_context(context))
            )
        self.experiment_id = experiment.id

        def final_state() -> str | None:
            experiment.reload()  # the SDK caches the state: ask the master
            state = str(experiment.get_state() if hasattr(experiment, "get_state") else experiment.state)
            return state if any(word in state.upper() for word in FINAL_STATES) else None

        state = wait_until(final_state, timeout_s=self.timeout_s, every_s=POLL_S)
        if state is None:
            experiment.kill()
            raise DtlabError(
                f"determined experiment {experiment.id}: not done after {self.timeout_s} s; killed"
            )
        trial = experiment.list_trials()[0]
        validations = [m.metrics for m in trial.iter_metrics("validation")]
        return {
            "experiment_id": experiment.id,
            "state": state,
            "trial_id": trial.id,
            "master_validation_metrics": validations,
        }

    def cancel(self) -> None:
        if self.experiment_id is None:
            return
        detmaster.connect(self.cluster).get_experiment(self.experiment_id).kill()


def slot_rows(workers: list[Node], agents: list[dict[str, Any]]) -> list[CheckRow]:
    """Each GPU worker's agent (determined_agent_id, default its name) registered with one CUDA slot per
    GPU in gpu_indices: an agent whose driver is broken registers with none and only logs a warning."""
    by_id = {str(agent.get("id")): agent for agent in agents}
    rows = []
    for worker in workers:
        agent_id = str(worker.var("determined_agent_id") or worker.name)
        expected = len(worker.gpu_indices)
        agent = by_id.get(agent_id)
        if agent is None:
            known = ", ".join(sorted(by_id)) or "none"
            rows.append(CheckRow("determined slots", worker.name, False,
                                 f"agent {agent_id} is not registered with the master (agents: {known})"))
            continue
        slots = list((agent.get("slots") or {}).values())
        cuda = [s for s in slots
                if (s.get("device") or {}).get("type") == "TYPE_CUDA" and s.get("enabled", True)]
        rows.append(CheckRow("determined slots", worker.name, len(cuda) == expected,
                             f"agent {agent_id}: {len(cuda)} CUDA slot(s) of {len(slots)},"
                             f" expected {expected}"))
    return rows


def cancel_experiments(cluster: Cluster, say) -> list[CheckRow]:
    """Kill every unfinished experiment, as admin with the master's own password. A failed login (wrong or
    missing password, master not answering) is a failed row of reset's table, never a silent skip."""
    assert cluster.master is not None
    try:
        det = detmaster.connect(cluster)
    except DtlabError as error:
        say(f"  [red]{error}[/]")
        return [CheckRow("determined login", cluster.master.name, False,
                         f"{error}; experiments not cancelled")]
    killed = []
    try:
        for experiment in det.list_experiments():
            state = str(getattr(experiment, "state", ""))
            if any(s in state.upper() for s in ("ACTIVE", "PAUSED", "QUEUED", "RUNNING")):
                experiment.kill()
                killed.append(experiment.id)
                say(f"  killed experiment {experiment.id}")
    except Exception as error:  # the SDK raises its own types
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        say(f"  [red]determined: could not cancel experiments: {first_line}[/]")
        return [CheckRow("determined experiments", cluster.master.name, False,
                         f"could not cancel experiments ({first_line}); killed so far: {killed or 'none'}")]
    return [CheckRow("determined login", cluster.master.name, True,
                     f"{detmaster.ADMIN_USER} at {detmaster.master_url(cluster)};"
                     f" {len(killed)} experiment(s) killed")]


class Determined(Platform):
    name = NAME
    label = "Determined AI"
    upstream_health = Upstream(  # checked by hand on the date given
        project="Determined AI (determined-ai/determined)",
        maintained=False,
        last_release="0.38.1, 19 March 2025; no release, fix or security update since, none announced",
        source=("the v0.38.1 tag and its release notes on github.com/determined-ai/determined "
                "(docs/determined.md)"),
        checked="2026-11-29",
    )
    colour = "#2ca02c"
    description = ("an experiment on the Determined master, its trial in determined_trial_image on the "
                   "agents (without a master: the Core API entry off-cluster under torchrun)")
    launcher_files = ("trainer/launchers/determined.py",)
    python_client = ("determined>=0.38,<0.39",)  # the launcher's Core API
    node_imports = ("determined",)
    # The lab's, with no Determined master: the Core API off-cluster, and the searcher's stand-in.
    stand_in_labels = (OFF_CLUSTER_LABEL, SEARCH_STAND_IN_LABEL)
    roles = ("determined_master", "determined_agent", "postgresql")  # docker: shared with ddp's image
    variable_prefixes = ("determined_", "postgresql_")
    service_variables = ("postgresql_service", "determined_master_service", "determined_agent_service")
    check_names = ("postgresql", "determined master", "determined agent", "determined",
                   "determined trial image", "determined slots")
    reset_title = "Determined: cancel experiments, restart master and agents"

    def build(self, cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
        return build(cluster, cell, attempt, timeout_s)

    def search_refusal(self, cluster: Cluster, early_stopping: str) -> str | None:
        if early_stopping != "asha":
            return (f"search: early_stopping {early_stopping}: Determined's searcher here is adaptive_asha; "
                    "ddp's sweep runs the plan without early stopping")
        if has_master(cluster):
            return ("search: on a Determined master bench does not run the searcher yet, only the lab's "
                    "stand-in (no master); run the tune profile's determined cells on the lab")
        return None

    def check_inventory(self, where: str, cluster: Cluster) -> None:
        """One agent_id per worker: two agents of one id take each other's place at the master."""
        agents: dict[str, str] = {}
        for worker in cluster.workers:  # same default as the determined_agent role: the inventory name
            agent_id = str(worker.var("determined_agent_id") or worker.name)
            if agent_id in agents:
                raise DtlabError(f"{where}: determined_agent_id '{agent_id}' is used by {agents[agent_id]} "
                                 f"and {worker.name}; give each worker its own determined_agent_id")
            agents[agent_id] = worker.name

    def offline_releases(self, cluster: Cluster) -> list[Release]:
        """The master's and the agents' release packages, where the inventory installs them."""
        if not bool(cluster.require("determined_install_binaries")):  # as has_master
            return []
        node, node_os = cluster.master or cluster.nodes[0], str(cluster.require("dtlab_node_os"))
        version = str(cluster.var("determined_version"))
        return [Release(f"{NAME}-{component}", version,
                        role_value(node, "determined_common", "determined_common_deb_url", node_os,
                                   extra={"determined_common_component": component}))
                for component in ("master", "agent")]

    def preflight(self, cluster: Cluster, planned: Launch, sessions: remote.Sessions | None) -> None:
        """On a master: every agent's Docker has the trial image and its python3 can install the pins."""
        if planned.external is None:
            return  # off-cluster: ddp's units, checked as ddp's are
        refused = [v for v in check_trial_image(cluster, cluster.workers, sessions=sessions) if not v.ok]
        if refused:
            raise PreflightError(f"preflight: {refused[0].detail}", refused[0].node)

    def check_rows(self, cluster: Cluster, states: NodeStates) -> list[CheckRow]:
        master = cluster.master
        if master is None or master.name not in states:
            return []
        units = self.units(cluster)
        rows = [self._postgresql_row(cluster, master, states, units["postgresql_service"])]
        if not has_master(cluster):
            rows.append(CheckRow("determined", master.name, True,
                                 "binaries not installed here (determined_install_binaries: false): "
                                 "cells run the Core API off-cluster", required=False))
            rows += [CheckRow("determined trial image", w.name, True, "Determined not installed here",
                              required=False) for w in cluster.workers if w.name in states]
            return rows
        master_unit, agent_unit = units["determined_master_service"], units["determined_agent_service"]
        state = service_state(states, master.name, master_unit)
        rows.append(CheckRow("determined master", master.name, state == "active",
                             f"{master_unit} {state or 'not installed'}"))
        for worker in cluster.workers:
            state = service_state(states, worker.name, agent_unit)
            rows.append(CheckRow("determined agent", worker.name, state == "active",
                                 f"{agent_unit} {state or 'not installed'}"))
        # Trials run where an agent is installed: only there is the image's verdict worth a probe.
        agents = [w for w in cluster.workers if service_state(states, w.name, agent_unit)]
        rows += [CheckRow("determined trial image", verdict.node, verdict.ok, verdict.detail)
                 for verdict in check_trial_image(cluster, agents)]
        return rows

    @staticmethod
    def _postgresql_row(cluster: Cluster, master: Node, states: NodeStates, unit: str) -> CheckRow:
        if not service_state(states, master.name, unit):
            return missing_unit_row("postgresql", master, unit)
        ready = remote.run(master, f"pg_isready -q -h 127.0.0.1 -p {postgresql_port(cluster)}", timeout=20)
        return CheckRow("postgresql", master.name, ready.ok,
                        f"accepting connections on {postgresql_port(cluster)}" if ready.ok
                        else f"pg_isready exit {ready.exit_code}")

    def gpu_rows(self, cluster: Cluster, workers: list[Node]) -> list[CheckRow]:
        if cluster.device != "cuda":
            return [CheckRow("determined slots", w.name, True, NO_GPU_CPU_INVENTORY, required=False)
                    for w in workers]
        gpu_workers = [w for w in workers if w.uses_gpu]
        if not has_master(cluster):
            return [CheckRow("determined slots", w.name, True, "Determined not installed here",
                             required=False) for w in gpu_workers]
        try:
            return slot_rows(gpu_workers, detmaster.agents(cluster))
        except DtlabError as error:
            return [CheckRow("determined slots", w.name, False, str(error)) for w in gpu_workers]

    def reset(self, steps: ResetSteps) -> list[CheckRow]:
        cluster = steps.cluster
        if not has_master(cluster):
            steps.say("  not installed on this inventory; nothing to do")
            return []
        if not steps.masters:
            steps.say("  the master does not answer; skipped")
            return []
        rows = cancel_experiments(cluster, steps.say)
        units = self.units(cluster)
        steps.run(steps.masters, restart_command(units["determined_master_service"]),
                  "restart determined master", 120)
        steps.run(cluster.workers, restart_command(units["determined_agent_service"]),
                  "restart determined agents", 120)
        return rows

    def recovery(self, cluster: Cluster) -> str:
        if has_master(cluster):
            return (f"the Determined master's trial restart (max_restarts: "
                    f"{cluster.require('determined_fault_max_restarts')}), then {DTLAB_RETRY}")
        return f"{DTLAB_RETRY}, a stand-in for the Determined master's trial restart"


PLATFORM = register(Determined())
