"""`ansible-playbook site.yml` from Python (ansible-runner), for the harness, `invoke` and tests.

    from dtlab import provision
    result = provision.converge()                      # the ansible.cfg inventory
    result = provision.converge(path, check=True, diff=True)
    result.ok, result.changed_hosts, result.seconds, result.summary()
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ansible_runner

from dtlab import paths
from dtlab.inventory import default_inventory_path, load_cluster

STAT_KEYS = ("ok", "changed", "failures", "dark", "skipped")


@dataclass(frozen=True)
class ConvergeResult:
    """One run of site.yml: per-host counts from the play recap, the full output and the wall time."""

    rc: int
    status: str
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    output: str = ""
    seconds: float = 0.0

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
        return f"{self.status} (rc {self.rc}) in {self.seconds:.0f} s; {per_host or 'no hosts'}"


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

    The inventory is checked first (dtlab.inventory.load_cluster, as site.yml's first play does): a bad
    one raises DtlabError before anything is written. `progress` gets a line per play, task and task
    outcome as they happen (invoke demo prints them); without it the run is silent.
    """
    inventory_path = Path(inventory) if inventory else default_inventory_path()
    load_cluster(inventory_path)  # a bad inventory is one DtlabError line, before .dtlab/runner is written
    cmdline = " ".join([*(["--check"] if check else []), *(["--diff"] if diff else [])])
    artifacts = paths.STATE_DIR / "runner"
    artifacts.mkdir(parents=True, exist_ok=True)
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
            event_handler=Progress(progress) if progress else None,
            envvars={"ANSIBLE_CONFIG": str(paths.ANSIBLE_CFG), "ANSIBLE_NOCOLOR": "1",
                     "ANSIBLE_FORCE_COLOR": "0", "PATH": _path_with_this_venv()},
        )
        output = runner.stdout.read() if runner.stdout else ""
        stats = runner.stats or {}
    return ConvergeResult(
        rc=int(runner.rc if runner.rc is not None else -1),
        status=str(runner.status),
        stats={key: dict(stats.get(key, {})) for key in STAT_KEYS},
        output=output,
        seconds=time.monotonic() - started,
    )


def _path_with_this_venv() -> str:
    """PATH with this Python's bin directory first, so the project venv's ansible-playbook runs."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
