"""The Platform interface: everything dtlab knows about one training platform, in one package per platform.

bench, cluster, doctor, faults' caller and report iterate over the registry (dtlab.platforms) and never
name a platform. A platform package (dtlab/platforms/<name>/) defines one subclass of Platform and one
instance, registered as it is imported: `PLATFORM = register(MyPlatform())`. The contract test
(tests/harness/test_platform_contract.py) checks every registered platform has every part.

What a platform owns:
- who it is: `name` (the trainer's framework name), `label`, `colour`, `description`;
- what a user adopts: `launcher_files` (the lines a user writes), `roles` (what site.yml installs for it),
  `variable_prefixes` (its group_vars names: ports, services), `service_variables` (its systemd units);
- one cell's life: `strategy_refusal` (a parallelism strategy it cannot run, and why: bench refuses
  such a cell before the matrix starts), `data_paths` / `data_path_refusal` (its own ETL, if any),
  `search_refusal` (scenario C's search cells: whether its launcher runs a search plan's trials),
  `build` (the Launch bench runs), `preflight` (is the platform
  ready for this cell?), `stop` (what stopping its units leaves behind);
- the cluster: `probe_lines` (its part of cluster.check's one probe script per node), `check_rows`,
  `gpu_rows`, `reset` (its step of cluster.reset) and `wait_ready` (after the reset);
- faults: `recovery` (what recovers a lost worker, as dtlab configures it);
- upstream: `upstream_health`, an `Upstream` (is it maintained, its last release, where that was read: a
  fact checked by hand on the date it gives, which the report's verdict and Table B.10 read);
- the inventory: `check_inventory_host` and `check_inventory` (its variables that would fail later, refused
  as one line when the inventory is read: dtlab.platforms.load_cluster), `port_ranges` (ports it takes from
  a range, kept free of the other services' ports);
- the controller: `start_controller_build` (a build its roles run on the controller, started early);
- an offline cluster: `offline_wheels` / `build_offline_wheels` (wheels its roles build, built for the
  bundle) and `offline_releases` (files its roles download), which dtlab.bundle puts in the bundle.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dtlab import remote
from dtlab.cell import Cell
from dtlab.checks import CheckRow, NodeStates
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.launch import Launch
from trainer.config import DEFAULT_DATA_PATH

DTLAB_RETRY = "dtlab retry from the newest checkpoint"
Run = Callable[[list[str], str, float], subprocess.CompletedProcess]  # an offline build's steps
Say = Callable[[str], None]
NO_GPU_CPU_INVENTORY = "no GPU (cpu inventory)"


@dataclass(frozen=True)
class Upstream:
    """What a platform states of its upstream: what it is, whether releases and fixes still come, the newest
    release known (with its date where recorded), where that was read, and when it was checked (by hand:
    edit it when upstream changes)."""

    project: str
    maintained: bool
    last_release: str
    source: str
    checked: str  # YYYY-MM-DD


UPSTREAM_KEYS = tuple(field.name for field in dataclasses.fields(Upstream))


class PreflightError(DtlabError):
    """A cell that cannot start: the platform (or the node) is not ready; `node` names where."""

    def __init__(self, message: str, node: str | None = None):
        super().__init__(message)
        self.node = node


@dataclass(frozen=True)
class ResetSteps:
    """What cluster.reset hands each platform's step: `run(nodes, command, what, timeout_s)` runs a
    command on those of `nodes` that still answer and reports failures itself; `reachable(nodes)` filters
    out the nodes an earlier step found unreachable; `say` prints one line of the reset's log."""

    cluster: Cluster
    say: Callable[[str], None]
    run: Callable[[Sequence[Node], str, str, int], None]
    reachable: Callable[[Sequence[Node]], list[Node]]

    @property
    def masters(self) -> list[Node]:
        return self.reachable([self.cluster.master] if self.cluster.master is not None else [])


@dataclass(frozen=True)
class Release:
    """A file a platform's roles download at converge time (a release tarball, a package), which an offline
    bundle must hold (dtlab.bundle): its roles then read it from <dtlab_bundle_dir>/<platform name>/<file>."""

    name: str  # e.g. "spark", "determined-master"
    version: str
    url: str
    checksum_url: str | None = None  # a published sha512 (Apache's .sha512), checked before it is kept

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


class Platform:
    """One training platform. Subclasses set the class attributes and implement the abstract methods."""

    name: ClassVar[str]
    label: ClassVar[str]  # how reports name it ("Apache Spark")
    colour: ClassVar[str]  # its bars and lines in the report's figures
    description: ClassVar[str]  # one line: what runs the trainer
    launcher_files: ClassVar[tuple[str, ...]]  # what a user writes to run the core on it (repo paths)
    roles: ClassVar[tuple[str, ...]]  # the roles site.yml runs for it, beyond the shared ones
    variable_prefixes: ClassVar[tuple[str, ...]]  # its group_vars names, by prefix (ports, services)
    port_ranges: ClassVar[tuple[tuple[str, str], ...]] = ()  # (first, last) variables: one listening entry
    service_variables: ClassVar[tuple[str, ...]] = ()  # its systemd units, by group_vars name
    check_names: ClassVar[tuple[str, ...]]  # the rows check_rows and gpu_rows can return
    reset_title: ClassVar[str]  # its step's line in cluster.reset's log
    upstream_health: ClassVar[Upstream]  # its upstream's health, stated with its source
    # Run labels (their start) that mark a stand-in, not the platform itself: the report says so.
    stand_in_labels: ClassVar[tuple[str, ...]] = ()
    # Its Python client as pip requirements with compatible ranges (constraints.txt pins each version): in
    # the controller's venv (scripts/setup.sh) and every node's (the trainer role, the offline bundle).
    # Literal tuples: dtlab.pins reads both without importing the package, whose imports need them.
    python_client: ClassVar[tuple[str, ...]] = ()
    # The modules its launcher imports on a node, compiled to bytecode once at install (the trainer role).
    node_imports: ClassVar[tuple[str, ...]] = ()

    # TrainConfig.data_path values its launcher trains on: every launcher reads through the trainer's
    # DataLoader; a platform with an ETL of its own (trainer/platform_data.py) adds "platform".
    data_paths: ClassVar[tuple[str, ...]] = (DEFAULT_DATA_PATH,)
    etl_label: ClassVar[str] = ""  # what its own ETL is, as the report's Table B.13 names it
    # What serves its checkpoints in a serve cell (scenario C). Empty: no server of its own, so its users
    # deploy with a plain server, the baseline's way, and the report's serving criterion judges it by that.
    server: ClassVar[str] = ""

    # --- one cell ---

    def data_path_refusal(self, data_path: str) -> str | None:
        """Why this platform's launcher cannot take its tokens from `data_path`, or None when it can."""
        if data_path in self.data_paths:
            return None
        return (f"data_path {data_path}: {self.label}'s launcher has no ETL of its own "
                f"(trainer/platform_data.py names those that have); use {', '.join(self.data_paths)}")

    def search_refusal(self, cluster: Cluster, early_stopping: str) -> str | None:
        """Why it cannot run a search cell (a search plan's trials, trainer/search.py) with this early
        stopping (trainer.search.EARLY_STOPPING) here, or None when its build runs one. bench asks before
        any cell starts."""
        return (f"search: dtlab runs no search on {self.label} (Ray Tune on ray, the sweep on ddp, "
                "Determined's searcher on determined)")

    def serve_refusal(self, cluster: Cluster) -> str | None:
        """Why it cannot serve a serve cell's checkpoint here (dtlab/matrix/tasks.py), or None when its build
        starts servers for one (it names its `server`). bench asks before any cell starts."""
        if self.server:
            return None
        from dtlab import platforms  # the registry, which imports this module first

        servers = "; ".join(f"{platform.server.split(' (')[0]} on {platform.name}"
                            for platform in platforms.ALL if platform.server)
        return f"serve: dtlab serves no checkpoint on {self.label} ({servers})"

    def strategy_refusal(self, strategy: str) -> str | None:
        """Why this platform cannot run the trainer's parallelism strategy `strategy` (one of
        trainer.strategies.NAMES), or None when it can. Every strategy runs under a launcher that leaves
        the gradients to the training core; one whose own optimizer averages them (Horovod) refuses the
        strategies that share gradients or state themselves. Torch-free: bench asks before any cell starts
        (tests/harness/test_platform_contract.py checks the answers against the trainer's own)."""
        return None

    def build(self, cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
        """What bench runs for this attempt of this cell."""
        raise NotImplementedError

    def preflight(self, cluster: Cluster, planned: Launch, sessions: remote.Sessions | None) -> None:
        """Raise PreflightError when the platform cannot take the cell now (bounded waits allowed)."""

    def stop(self, cluster: Cluster, cell: Cell, sessions: remote.Sessions | None, timeout_s: int) -> None:
        """What stopping the cell's units on every node leaves running (jobs, containers): stop it."""

    # --- the cluster ---

    def units(self, cluster: Cluster) -> dict[str, str]:
        """{group_vars name: systemd unit} of its services, as the inventory names them."""
        return {variable: str(cluster.require(variable)) for variable in self.service_variables}

    def probe_lines(self, cluster: Cluster, node: Node) -> list[str]:
        """Shell lines for cluster.check's one probe script on `node`, each printing `<name>.<key>=<value>`
        (the states of `units` are probed for every platform already)."""
        return []

    def check_rows(self, cluster: Cluster, states: NodeStates) -> list[CheckRow]:
        """Its rows of cluster.check: are its services up and ready for cells?"""
        raise NotImplementedError

    def gpu_rows(self, cluster: Cluster, workers: list[Node]) -> list[CheckRow]:
        """Does it offer each of `workers`' GPUs to its cells? (On a cpu inventory: a note per worker.)"""
        return []

    def reset(self, steps: ResetSteps) -> list[CheckRow]:
        """Its step of cluster.reset: end what it runs, restart its services; rows for what failed."""
        raise NotImplementedError

    def wait_ready(self, cluster: Cluster, workers: list[Node], timeout_s: float) -> None:
        """After the reset: wait (bounded) until its services take cells again."""

    # --- the inventory ---

    def check_inventory_host(self, where: str, node: Node) -> None:
        """Raise DtlabError, one line starting with `where`, for a variable of its own on this host that would
        fail later (in its role, or a cell): run on every host as the inventory is read, before anything
        starts (every `invoke` command, and site.yml through plugins/; dtlab.platforms.load_cluster)."""

    def check_inventory(self, where: str, cluster: Cluster) -> None:
        """The same across hosts, once every host is read (one value per worker, say)."""

    # --- an offline cluster ---

    def offline_wheels(self, cluster: Cluster) -> list[str]:
        """The wheels its roles build rather than fetch, by package name: an offline bundle must hold them."""
        return []

    def build_offline_wheels(self, cluster: Cluster, wheels: Path, torch: str, run: Run, say: Say) -> None:
        """Build offline_wheels into `wheels` on this controller (the nodes' Python), against the bundle's
        `torch` requirement; `run(argv, what, timeout_s)` runs a step and makes its failure one line."""

    def start_controller_build(self, cluster: Cluster, log: Path) -> subprocess.Popen | None:
        """Start a build that its roles would otherwise run on the controller during the converge, as a
        process of its own logging to `log`, so it overlaps the lab's image and the converge's first roles
        (the role's own step then waits for it, or finds its output); None when there is nothing to build."""
        return None

    def offline_releases(self, cluster: Cluster) -> list[Release]:
        """What its roles would download on this inventory beyond apt and pip packages (bundled anyway)."""
        return []

    # --- faults ---

    def recovery(self, cluster: Cluster) -> str:
        """How it recovers from a lost worker, as dtlab configures it (docs/faults.md)."""
        raise NotImplementedError

    def elastic_refusal(self, cluster: Cluster) -> str | None:
        """Why a fault plan's `recovery: elastic` cannot run on it here (one line), or None when it can:
        then elastic_recovery says how it goes on without the lost worker. bench asks before any cell."""
        return (f"recovery elastic: dtlab runs no elastic mode of {self.label} yet (docs/faults.md); "
                "use recovery restart")

    def elastic_recovery(self, cluster: Cluster) -> str:
        """How it goes on with fewer workers after losing one, as dtlab configures it (recovery: elastic)."""
        raise NotImplementedError

    def lost_node_service(self, cluster: Cluster) -> str:
        """Its own service on a worker that runs its ranks without a unit of the cell (Ray's raylet): an
        elastic plan's lost node loses it with the ranks, held stopped until the cell ends; "" where the
        ranks run in the cell's units or a launcher's SSH sessions."""
        return ""

    # --- upstream ---

    def upstream(self) -> dict[str, Any]:
        """Its upstream health (UPSTREAM_KEYS) as the report reads it."""
        return dataclasses.asdict(self.upstream_health)


_REGISTERED: dict[str, Platform] = {}


def register(platform: Platform) -> Platform:
    """Register a platform, as its package does on import (`PLATFORM = register(MyPlatform())`); the
    registry (dtlab.platforms) orders the registered ones by name. Its name is its package's folder."""
    package = type(platform).__module__.split(".")
    if package[:2] != ["dtlab", "platforms"] or len(package) < 3 or package[2] != platform.name:
        raise ImportError(f"{type(platform).__module__}: registers a platform named {platform.name!r}; a "
                          f"platform registers from its own package, dtlab.platforms.{platform.name}")
    _REGISTERED[platform.name] = platform
    return platform


def registered() -> dict[str, Platform]:
    """Every platform registered so far, by name, in the order their packages were imported."""
    return dict(_REGISTERED)


def unit_command(unit: str, verb: str) -> str:
    """`systemctl <verb>` <unit>.service where it is installed (not installed: nothing, exit 0)."""
    service = shlex.quote(unit + ".service")
    return (
        f'[ -z "$(systemctl list-unit-files --plain --no-legend {service})" ] || systemctl {verb} {service}'
    )


def restart_command(unit: str) -> str:
    """Restart <unit>.service where it is installed (not installed: nothing, exit 0)."""
    return unit_command(unit, "restart")


def missing_unit_row(check: str, node: Node, unit: str) -> CheckRow:
    return CheckRow(check, node.name, False, f"no {unit} unit; run ansible-playbook site.yml")


UNIT_STATE_TIMEOUT_S = 30


def units_down(nodes: Sequence[Node], unit: str, sessions: remote.Sessions | None) -> list[str]:
    """'<node>: <unit> <state>' for each node whose unit is neither running nor starting, or that does not
    answer: a worker daemon that will not (re)join its head by itself, so a preflight need not wait for it."""
    down = []
    for node in nodes:
        try:
            connection = sessions.connection(node) if sessions else None
            state = remote.unit_state(node, unit, timeout=UNIT_STATE_TIMEOUT_S, connection=connection)
        except DtlabError as error:  # remote's lines begin "host <node>"; the node is named once
            message = str(error)
            down.append(message.removeprefix("host ") if message.startswith(f"host {node.name}")
                        else f"{node.name}: {message}")
            continue
        if state not in remote.RUNNING_OR_STARTING:
            down.append(f"{node.name}: {unit} {state}")
    return down


def why_not(down: list[str]) -> str:
    """units_down's answer as a preflight line's parenthesis ("" when every unit runs)."""
    return f" ({'; '.join(down)})" if down else ""
