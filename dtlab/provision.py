"""`ansible-playbook site.yml` from Python (ansible-runner), for the harness, `invoke` and tests.

    from dtlab import provision
    result = provision.converge()                      # the ansible.cfg inventory
    result = provision.converge(path, check=True, diff=True)
    result.ok, result.changed_hosts, result.seconds, result.summary()
    result.roles["spark"].seconds, result.record      # per-role time; the file it was recorded in

A successful whole-site run (site.yml, no --check, no tags, no limit) records its seconds per role, from
ansible-runner's events, to results/<cluster>/provision/<UTC time>.json; the report's Table B.10 reads
them (dtlab.report.comparison).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import ansible_runner
import yaml

from dtlab import paths, pins
from dtlab.errors import DtlabError
from dtlab.files import atomic_write_text
from dtlab.inventory import Cluster, default_inventory_path
from dtlab.platforms import load_cluster

STAT_KEYS = ("ok", "changed", "failures", "dark", "skipped")
PROVISION_FORMAT = 1  # the record's JSON layout, read by dtlab.report.comparison
# dtlab's own converges run over Mitogen (plugins/strategy/mitogen_linear.py): 0.58x stock's time on a
# re-converge (benchmarks/README.md, Provisioning). ansible.cfg keeps Ansible's own `linear` for a plain
# ansible-playbook, which would print ansible-core's deprecation warning for a third-party strategy; here
# Ansible's output is not shown (dtlab prints its own lines). ANSIBLE_STRATEGY, when set, wins.
CONVERGE_STRATEGY = "mitogen_linear"
# Tasks of no role: site.yml's validation and secrets plays, and each play's fact gathering.
OUTSIDE_ROLES = "(outside roles)"
TASK_STARTS = ("playbook_on_task_start", "playbook_on_handler_task_start")
# One event per host and task with Ansible's own `duration` (a loop's items come before it, not counted).
HOST_RESULTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")


@dataclass
class RoleTime:
    """One role in one run: wall seconds (its tasks' starts to the next task's start, so a task's time
    on all hosts at once counts once), its tasks, the host results that changed something, per host the
    seconds Ansible reports for that host's results, and of its seconds those of the roles it brought in
    (imported, included or depended on: systemd_units under spark, ...)."""

    seconds: float = 0.0
    tasks: int = 0
    changed: int = 0
    hosts: dict[str, float] = field(default_factory=dict)
    imported: dict[str, float] = field(default_factory=dict)


IMPORT_PLAYBOOK = ("import_playbook", "ansible.builtin.import_playbook")


def playbook_plays(playbook: Path) -> list[tuple[str | None, list[str]]]:
    """(name, roles) of every play of `playbook` and of the playbooks it imports, in order; nothing for
    a file that cannot be read (ansible-playbook itself says what is wrong with it)."""
    found: list[tuple[str | None, list[str]]] = []

    def read(path: Path, depth: int = 0) -> None:
        try:
            plays = yaml.safe_load(path.read_text()) or []
        except (OSError, yaml.YAMLError):
            return
        for play in plays if isinstance(plays, list) and depth < 5 else []:
            if not isinstance(play, dict):
                continue
            imported = next((play[key] for key in IMPORT_PLAYBOOK if key in play), None)
            if isinstance(imported, str):
                read(path.parent / imported, depth + 1)
                continue
            roles = [r.get("role", r.get("name")) if isinstance(r, dict) else r
                     for r in play.get("roles") or []]
            name = play.get("name")
            found.append((name if isinstance(name, str) else None, [r for r in roles if isinstance(r, str)]))

    read(playbook)
    return found


def play_roles(playbook: Path) -> dict[str, str]:
    """{play name: its role} for every play of `playbook` (playbook_plays) that runs exactly one role:
    each task of such a play (its fact gathering, and the roles its role imports or depends on) counts
    for that role. A name two plays share is left out (it would be ambiguous)."""
    owners: dict[str, str | None] = {}
    for name, roles in playbook_plays(playbook):
        if name is not None and len(roles) == 1:
            owners[name] = roles[0] if owners.get(name, roles[0]) == roles[0] else None
    return {name: role for name, role in owners.items() if role}


class RoleTimer:
    """ansible-runner's events -> RoleTime per role. A task counts for its play's role where the play runs
    one (`owners`, play name -> role: play_roles), else for its own role (or OUTSIDE_ROLES). Each event's
    `created` time (UTC, when Ansible emitted it) is used; `clock` only where an event has none."""

    def __init__(self, owners: dict[str, str] | None = None, clock: Callable[[], float] = time.time):
        self.owners = owners or {}
        self.clock = clock
        self.roles: dict[str, RoleTime] = {}
        self._open: tuple[str, str | None, float] | None = None  # the running task's role, import, start

    def _when(self, event: dict) -> float:
        try:
            return datetime.fromisoformat(event["created"]).timestamp()
        except (KeyError, TypeError, ValueError):
            return self.clock()

    def _counted(self, data: dict) -> tuple[str, str | None]:
        """(the role the task counts for, the role it runs in where that is another: an import)."""
        own = data.get("role") or None
        owner = self.owners.get(data.get("play") or "")
        if owner is None:
            return own or OUTSIDE_ROLES, None
        return owner, own if own not in (None, owner) else None

    def _close(self, when: float) -> None:
        if self._open is not None:
            name, imported, started = self._open
            seconds = max(0.0, when - started)
            role = self.roles[name]
            role.seconds += seconds
            if imported:
                role.imported[imported] = role.imported.get(imported, 0.0) + seconds
        self._open = None

    def __call__(self, event: dict) -> bool:
        kind, data = event.get("event", ""), event.get("event_data") or {}
        if kind in TASK_STARTS:
            when = self._when(event)
            self._close(when)
            name, imported = self._counted(data)
            self.roles.setdefault(name, RoleTime()).tasks += 1
            self._open = (name, imported, when)
        elif kind in ("playbook_on_play_start", "playbook_on_stats"):
            self._close(self._when(event))
        elif kind in HOST_RESULTS:
            role = self.roles.setdefault(self._counted(data)[0], RoleTime())
            host = str(data.get("host", "?"))
            role.hosts[host] = role.hosts.get(host, 0.0) + float(data.get("duration") or 0.0)
            if kind == "runner_on_ok" and (data.get("res") or {}).get("changed"):
                role.changed += 1
        return True


@dataclass(frozen=True)
class ConvergeResult:
    """One run of site.yml: per-host counts from the play recap, the full output and the wall time."""

    rc: int
    status: str
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    output: str = ""
    seconds: float = 0.0
    roles: dict[str, RoleTime] = field(default_factory=dict)  # from the events (RoleTimer)
    record: Path | None = None  # results/<cluster>/provision/<time>.json, where this run was recorded

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.status == "successful"

    @property
    def hosts(self) -> list[str]:
        return sorted({host for counts in self.stats.values() for host in counts})

    def count(self, key: str, host: str) -> int:
        return int(self.stats.get(key, {}).get(host, 0))

    @property
    def changed_hosts(self) -> dict[str, int]:
        """Hosts with changed > 0 (empty after an idempotent run)."""
        return {host: n for host, n in self.stats.get("changed", {}).items() if n}

    def summary(self) -> str:
        per_host = ", ".join(f"{host}: " + " ".join(f"{key}={self.count(key, host)}" for key in STAT_KEYS)
                             for host in self.hosts)
        recorded = f"; seconds per role in {self.record}" if self.record else ""
        return f"{self.status} (rc {self.rc}) in {self.seconds:.0f} s; {per_host or 'no hosts'}{recorded}"


class Progress:
    """ansible-runner's events as lines while the playbook runs: each play and task as it starts, then
    the task's hosts by outcome when it ends, with the elapsed time ("[  42s] ...")."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.started = time.monotonic()
        self.task: str | None = None
        self.hosts: dict[str, list[str]] = {}

    def _line(self, text: str) -> None:
        self.say(f"[{time.monotonic() - self.started:4.0f}s] {text}")

    def _end_task(self) -> None:
        if self.task is not None and self.hosts:
            self._line("       " + "; ".join(f"{outcome}: {' '.join(sorted(hosts))}"
                                             for outcome, hosts in sorted(self.hosts.items())))
        self.task, self.hosts = None, {}

    def __call__(self, event: dict) -> bool:
        kind, data = event.get("event", ""), event.get("event_data", {})
        if kind == "playbook_on_play_start":
            self._end_task()
            self._line(f"PLAY {data.get('play', '')}")
        elif kind == "playbook_on_task_start":
            self._end_task()
            self.task = data.get("task", "")
            self._line(f"  TASK {self.task}")
        elif kind.startswith("runner_on_") and kind != "runner_on_start":
            outcome = {"runner_on_ok": "changed" if data.get("res", {}).get("changed") else "ok",
                       "runner_on_failed": "ignored" if data.get("ignore_errors") else "FAILED",
                       "runner_on_unreachable": "UNREACHABLE",
                       "runner_on_skipped": "skipped"}.get(kind, kind.removeprefix("runner_on_"))
            self.hosts.setdefault(outcome, []).append(data.get("host", "?"))
        elif kind == "playbook_on_stats":
            self._end_task()
        return True  # keep the event in the runner's artifacts too


def converge(inventory: str | Path | None = None, *, check: bool = False, diff: bool = False,
             tags: list[str] | tuple[str, ...] = (), limit: str | None = None,
             extravars: dict | None = None, playbook: str = "site.yml",
             progress: Callable[[str], None] | None = None) -> ConvergeResult:
    """Run a playbook from the repository root (so ansible.cfg applies) and return its recap.

    The inventory is checked first (dtlab.platforms.load_cluster, as site.yml's first play does): a bad
    one raises DtlabError before anything is written. `progress` gets a line per play, task and task
    outcome as they happen (invoke demo prints them); without it the run is silent. A successful
    whole-site run is recorded (record_provision); check mode, tags, a limit or another playbook never.
    """
    inventory_path = Path(inventory) if inventory else default_inventory_path()
    cluster = load_cluster(inventory_path)  # a bad inventory: one DtlabError line, before anything is written
    cmdline = " ".join([*(["--check"] if check else []), *(["--diff"] if diff else [])])
    artifacts = paths.STATE_DIR / "runner"
    artifacts.mkdir(parents=True, exist_ok=True)
    timer = RoleTimer(play_roles(paths.REPO_ROOT / playbook))
    show = Progress(progress) if progress else None

    def on_event(event: dict) -> bool:
        timer(event)
        if show:
            show(event)
        return True  # keep the event in the runner's artifacts too

    started_at = datetime.now(UTC)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=artifacts, prefix="site-") as private_dir:
        runner = ansible_runner.run(
            private_data_dir=private_dir,
            project_dir=str(paths.REPO_ROOT),
            playbook=str(paths.REPO_ROOT / playbook),
            inventory=str(inventory_path.resolve()),
            cmdline=cmdline or None,
            tags=",".join(tags) or None,
            limit=limit,
            extravars=extravars or {},
            quiet=True,
            event_handler=on_event,
            envvars={"ANSIBLE_CONFIG": str(paths.ANSIBLE_CFG), "ANSIBLE_NOCOLOR": "1",
                     "ANSIBLE_FORCE_COLOR": "0", "PATH": _path_with_this_venv(),
                     "ANSIBLE_STRATEGY": os.environ.get("ANSIBLE_STRATEGY", CONVERGE_STRATEGY)},
        )
        output = runner.stdout.read() if runner.stdout else ""
        stats = runner.stats or {}
    result = ConvergeResult(
        rc=int(runner.rc if runner.rc is not None else -1),
        status=str(runner.status),
        stats={key: dict(stats.get(key, {})) for key in STAT_KEYS},
        output=output,
        seconds=time.monotonic() - started,
        roles=timer.roles,
    )
    if result.ok and whole_site_run(playbook, check=check, tags=tags, limit=limit):
        directory = paths.results_dir_for(cluster.name) / paths.PROVISION_DIRNAME
        path = record_provision(result, cluster.name, inventory_path, started_at, directory)
        result = replace(result, record=path)
    return result


def whole_site_run(playbook: str, *, check: bool, tags, limit: str | None) -> bool:
    """Only a real run of all of site.yml on every node is a provisioning time worth comparing."""
    return (not check and not tags and not limit
            and (paths.REPO_ROOT / playbook).resolve() == paths.SITE_PLAYBOOK.resolve())


def record_provision(result: ConvergeResult, cluster_name: str, inventory: Path, started_at: datetime,
                     directory: Path) -> Path:
    """results/<cluster>/provision/<UTC time>.json: the run's seconds per role (and per host), and whether
    it changed anything (a first converge and an idempotent re-run are told apart by the report)."""
    path = directory / f"{started_at.strftime('%Y%m%dT%H%M%S%fZ')}.json"
    content = {
        "format": PROVISION_FORMAT,
        "cluster": cluster_name,
        "inventory": str(inventory),
        "started_at": started_at.isoformat(timespec="seconds"),
        "seconds": round(result.seconds, 3),
        "changed": bool(result.changed_hosts),
        "changed_per_host": result.changed_hosts,
        "roles": {name: {**asdict(role), "seconds": round(role.seconds, 3),
                         "hosts": {h: round(s, 3) for h, s in sorted(role.hosts.items())},
                         "imported": {r: round(s, 3) for r, s in sorted(role.imported.items())}}
                  for name, role in result.roles.items()},
    }
    try:
        atomic_write_text(path, json.dumps(content, indent=2) + "\n")
    except OSError as error:
        raise DtlabError(f"provision: site.yml converged, but its times cannot be written to {path}: "
                         f"{error.strerror}") from None
    return path


def _path_with_this_venv() -> str:
    """PATH with this Python's bin directory first, so the project venv's ansible-playbook runs."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def provision_command(inventory: str | None, *, check: bool = False, diff: bool = False, tags: str = "",
                      limit: str | None = None) -> ConvergeResult:
    """invoke cluster.provision: site.yml with a line per play, task and outcome; a whole successful run
    records its seconds per role (the report's Table B.10). A failed run raises ProvisionFailed (exit 1)."""
    chosen = [tag.strip() for tag in tags.split(",") if tag.strip()]
    result = converge(inventory, check=check, diff=diff, tags=chosen, limit=limit or None, progress=print)
    if not result.ok:
        print(result.output[-3000:], end="")
        raise ProvisionFailed(f"cluster.provision: site.yml did not converge: {result.summary()}")
    print(f"provisioned: {result.summary()}")
    return result


class ProvisionFailed(DtlabError):
    exit_code = 1


# --- the trainer role's wheelhouse, filled early ---------------------------------------------------------

# The lock a fill of the controller's wheelhouse holds; roles/trainer/tasks/wheelhouse.yml waits on it.
WHEELHOUSE_FILL_LOCK = ".dtlab-fill.lock"


def start_wheelhouse_fill(cluster: Cluster, log: Path) -> subprocess.Popen | None:
    """The trainer role's wheelhouse fill (pip wheel of the nodes' packages into the controller's wheelhouse)
    for a wheelhouse cluster (the lab), started by the demo before its converge: its downloads overlap the
    converge's first plays. The role waits on the lock, then its pip reads the wheelhouse first and
    downloads nothing more.
    torch stays the role's: its build follows the nodes' GPUs (a pip dependency may still bring it in)."""
    if cluster.var("trainer_install_source") != "wheelhouse" or cluster.var("dtlab_bundle"):
        return None
    paths.WHEELHOUSE_DIR.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    requirements = log.with_suffix(".requirements.txt")
    requirements.write_text("".join(f"{name}\n" for name in pins.node_packages() if name != "torch"))
    wheelhouse = str(paths.WHEELHOUSE_DIR)
    command = ["flock", f"{wheelhouse}/{WHEELHOUSE_FILL_LOCK}", sys.executable, "-m", "pip", "wheel",
               "--quiet", "--find-links", wheelhouse, "--wheel-dir", wheelhouse, "-r", str(requirements),
               "-c", str(paths.CONSTRAINTS_FILE)]
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
