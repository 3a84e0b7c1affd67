"""bench.run (one cell) and bench.all (the matrix): preflight, launch, follow, fetch, record, retry.

Before a matrix's first cell the health gate (dtlab.doctor) judges the whole cluster: a failed gate
stops the matrix before anything is reserved or written. After a cell fails on a node, the gate
re-checks that node; a node that fails is drained, and the matrix's later cells that need it skipped.

One attempt of one cell:
  1. the store reserves an attempt folder (live logs are streamed straight into it);
  2. preflight: every node the cell needs answers over SSH and has the trainer env; the services it
     needs are up (Spark master, Ray head with enough alive workers);
  3. the launcher's units start on all their nodes at once; the first one to fail stops the others,
     and the unit watch stops them when a node falls silent or a unit ends under an open log stream;
  4. rank 0's result.json is fetched and recorded; or the failure (node, exit code, last log lines).
A failed attempt is cleaned up on every node and retried (default once) from the trainer's checkpoint,
once every node answers again (bounded wait). Ctrl-C stops the cell's units on every node; recorded
results are never touched. What the user sees is dtlab.display; the command bodies, dtlab.commands.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtlab import doctor, faults, paths, platforms, probes, remote
from dtlab import launch as launching
from dtlab import matrix as matrix_module
from dtlab.cell import Cell, config_hash
from dtlab.display import Display
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.outcome import AttemptFailure, CellOutcome
from dtlab.platforms import PreflightError
from dtlab.results import Provenance, ResultStore
from dtlab.waiting import wait_until

LOG_TAIL_LINES = 30
# Fabric waits this much longer than the unit's own RuntimeMaxSec, so systemd ends a stuck run first.
TIMEOUT_MARGIN_S = 30
# While a cell runs, UnitWatch asks every node for its unit's state this often, each probe on a fresh
# connection that gives up after PROBE_TIMEOUT_S. A node silent for SILENT_AFTER_S is down or cut off,
# so a fault is noticed within SILENT_AFTER_S + WATCH_EVERY_S + PROBE_TIMEOUT_S = 50 s.
WATCH_EVERY_S = 10
PROBE_TIMEOUT_S = 10
SILENT_AFTER_S = 30
# A unit that has ended while its log stream stays open for this long is treated as ended.
STREAM_GRACE_S = 15
# Before a retry, wait at most this long for every node to answer (a restarting node boots).
NODES_BACK_WAIT_S = 180
STOP_WAIT_S = 60
# The line that names what went wrong: an exception with its message, not torchrun's wrapper.
EXCEPTION_LINE = re.compile(r"\b(?!ChildFailedError)\w*(Error|Exception)\b: \S|\berror: \S")


@dataclass
class BenchOptions:
    profile: str | None = None
    only: str | None = None
    force: bool = False
    retries: int = 1
    timeout_s: int | None = None  # None: the profile's timeout_s
    verbose: bool = False  # stream every log line, not only epochs and errors
    matrix_path: Path | None = None
    report: bool = True
    # No health gate before the matrix, and no re-check of a node a cell failed on (so no drains).
    skip_gate: bool = False


class UnitWatch:
    """Watches a running cell from outside its log streams: every WATCH_EVERY_S, each node's unit
    state, from one daemon thread per node over its own SSH connection (reopened after an error).

    A stream can outlive its unit (a killed follower shell) or hang on a silent network; the watch
    sees both within a minute: `fault(streaming)` names the first such node. The threads are daemons:
    a probe stuck on a dead link never holds the harness up.
    """

    def __init__(
        self,
        jobs: list[tuple[Node, str]],
        say: Callable[[str], None],
        sessions: remote.Sessions | None = None,
    ):
        self.jobs = jobs
        self.say = say
        self.sessions = sessions
        now = time.monotonic()
        self.last_answer = {node.name: now for node, _ in jobs}
        self.ended_since: dict[str, float] = {}
        self.seen_running: set[str] = set()
        self.states: dict[str, str] = {}
        self._stop = threading.Event()
        self._silent_said: set[str] = set()
        self._threads = [
            threading.Thread(target=self._watch, args=job, name=f"dtlab-watch-{job[0].name}", daemon=True)
            for job in jobs
        ]

    def start(self) -> UnitWatch:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self, node: Node, unit: str) -> None:
        # The cell's shared connection first; after an error, probes of its own, so a probe never
        # closes the connection the unit's log stream runs on.
        own = None
        while not self._stop.wait(WATCH_EVERY_S):
            try:
                if self.sessions is not None and own is None:
                    shared = self.sessions.connection(node)
                    state = remote.unit_state(node, unit, timeout=PROBE_TIMEOUT_S, connection=shared)
                else:
                    own = own or remote.connect(node, timeout=PROBE_TIMEOUT_S)
                    state = remote.unit_state(node, unit, timeout=PROBE_TIMEOUT_S, connection=own)
            except DtlabError:
                if own is not None:
                    own.close()
                own = remote.connect(node, timeout=PROBE_TIMEOUT_S)  # not opened yet: opens on use
                continue
            now = time.monotonic()
            self.last_answer[node.name] = now
            self.states[node.name] = state
            if state in (*remote.RUNNING_OR_STARTING, "deactivating"):  # a cell's unit runs while it stops
                self.seen_running.add(node.name)
            elif node.name in self.seen_running:  # before its start a unit reads inactive too
                self.ended_since.setdefault(node.name, now)
        if own is not None:
            own.close()

    def fault(self, streaming: set[str]) -> AttemptFailure | None:
        """The first node that is silent, or whose unit ended while its stream (in `streaming`) is open."""
        now = time.monotonic()
        for node, _unit in self.jobs:
            silent = now - self.last_answer[node.name]
            if silent >= SILENT_AFTER_S:
                reason = (f"{node.name} has not answered for {silent:.0f} s (node down or network "
                          "partition); the cell is stopped, not timed")
                if node.name not in self._silent_said:
                    self._silent_said.add(node.name)
                    self.say(f"[yellow]{reason}[/]")
                return AttemptFailure(reason, node.name)
            ended = self.ended_since.get(node.name)
            if node.name in streaming and ended is not None and now - ended >= STREAM_GRACE_S:
                reason = (f"the unit on {node.name} ended ({self.states.get(node.name)}) "
                          f"{now - ended:.0f} s ago but its log stream stayed open")
                self.say(f"[yellow]{reason}[/]")
                return AttemptFailure(reason, node.name)
        return None


def git_revision() -> str | None:
    try:
        rev = subprocess.run(
            ["git", "-C", str(paths.REPO_ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(paths.REPO_ROOT), "status", "--porcelain", "--", "trainer"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return f"{rev}-dirty" if rev and dirty else (rev or None)


class Bench:
    def __init__(
        self,
        cluster: Cluster,
        options: BenchOptions,
        store: ResultStore | None = None,
        display: Display | None = None,
    ):
        self.cluster = cluster
        self.options = options
        self.store = store or ResultStore.for_cluster(cluster.name)
        self.display = display
        self.git_rev = git_revision()
        self._node_versions: dict[str, Any] | None = None
        self.phases: dict[str, float] = {}
        self.marks: dict[str, float] = {}
        # The running attempt's SSH connections, one per node (see remote.Sessions); None between attempts.
        self.sessions: remote.Sessions | None = None
        # A faulted cell's run (dtlab.faults): armed in each attempt until its fault has fired.
        self.fault_run: faults.FaultRun | None = None
        # The health gate's file beside the results (None before the matrix passed it), and the nodes
        # drained for the rest of this matrix: name -> the failed check that drained it.
        self.gate: doctor.GateFile | None = None
        self.drained: dict[str, str] = {}

    # --- the matrix ----------------------------------------------------------------

    def load_matrix(self) -> matrix_module.Matrix:
        loaded = matrix_module.load(
            self.options.profile,
            self.options.matrix_path,
            max_gpus=self.cluster.max_gpus,
            device=self.cluster.device,
        )
        selected = loaded.select(self.options.only)
        if self.options.retries < 0:
            raise DtlabError(f"--retries {self.options.retries}: must be >= 0")
        if self.options.timeout_s is not None and self.options.timeout_s <= 0:
            raise DtlabError(f"--timeout {self.options.timeout_s}: must be a positive number of seconds")
        return selected

    def check_cells(self, selected: matrix_module.Matrix) -> None:
        """What the controller alone decides about the cells: each cell's platform can run its strategy
        (Platform.strategy_refusal), and each fault plan's node is one its cell runs on."""
        for cell in selected.cells:
            refusal = platforms.get(cell.framework).strategy_refusal(cell.strategy)
            if refusal is not None:
                where = f"{selected.source}: profiles.{selected.profile}"
                raise DtlabError(f"{where}: cell {cell.key}: {refusal}")
        for cell in selected.cells:
            if cell.fault:
                faults.target(self.cluster, cell, launching.place(self.cluster, cell).nodes)

    def check_before_start(self, selected: matrix_module.Matrix) -> None:
        """What can stop the whole matrix, checked before any cell starts or any attempt is reserved:
        a strategy a cell's platform cannot run, a fault plan's node the cell does not run on, a results
        store that cannot take runs, and local model or dataset paths the workers lack."""
        self.check_cells(selected)
        self.store.check(writable=True)
        from trainer.config import GENERATED_DATASET, GENERATED_MODEL_PREFIX, is_local_path

        wanted: dict[str, str] = {}  # path -> the option naming it
        for cell in selected.cells:
            for key in ("model", "dataset"):
                source = str(cell.trainer_config.get(key) or "")
                generated = source == GENERATED_DATASET or source.startswith(GENERATED_MODEL_PREFIX)
                if source and not generated and is_local_path(source):
                    wanted.setdefault(source, key)
        if not wanted:
            return
        check = "; ".join(f"test -e {shlex.quote(p)} || echo missing={shlex.quote(p)}" for p in wanted)
        missing: dict[str, list[str]] = defaultdict(list)
        for name, answer in remote.run_all(self.cluster.workers, check, timeout=30).items():
            if isinstance(answer, BaseException):
                raise PreflightError(f"preflight: {answer}", name)
            for line in answer.stdout.splitlines():
                if line.startswith("missing="):
                    missing[line.removeprefix("missing=")].append(name)
        for path, nodes in missing.items():
            raise DtlabError(
                f"{selected.source}: profiles.{selected.profile}.trainer.{wanted[path]}: local path {path} "
                f"does not exist on {', '.join(sorted(nodes))}; stage it on every worker or give a hub id"
            )

    def timeout_for(self, selected: matrix_module.Matrix) -> int:
        return int(self.options.timeout_s or selected.timeout_s)

    def run_matrix(self, selected: matrix_module.Matrix) -> list[CellOutcome]:
        """The health gate, then every selected cell in the matrix's stable order; recorded ones skipped
        unless --force, and those that need a node drained during the matrix."""
        self.check_cells(selected)  # a strategy refused or a fault plan's node wrong: before the gate
        self.store.check(writable=True)  # this machine's own problem first: one line before any node is asked
        passed = None if self.options.skip_gate else self.run_gate()  # refused: nothing written yet
        self.check_before_start(selected)
        self.gate = doctor.GateFile.write(self.store.root / paths.GATE_DIRNAME, passed,
                                          {"profile": selected.profile, "source": str(selected.source),
                                           "cells": [cell.key for cell in selected.cells]})
        display = self.display or Display(len(selected), self.options.verbose)
        self.display = display
        outcomes: list[CellOutcome] = []
        display.pending = list(selected.cells)
        display.note(
            f"matrix {selected.profile}: {len(selected)} cells on {self.cluster.name} "
            f"({self.cluster.device}, {len(self.cluster.workers)} workers); results in {self.store.root}"
        )
        with display:
            for cell in selected.cells:
                drained = self.drained_nodes_of(cell, self.timeout_for(selected))
                if not self.options.force and self.store.is_done(cell, config_hash(cell)):
                    display.pending.remove(cell)
                    outcome = CellOutcome(cell, "skipped")
                    display.note(f"[dim]· {cell.key}: recorded (same config hash), skipped[/]")
                elif drained:
                    display.pending.remove(cell)
                    why = f"{drained[0]} drained ({self.drained[drained[0]]})"
                    outcome = CellOutcome(cell, "skipped", skipped_because=why)
                    display.note(f"[yellow]· {cell.key}: skipped: {why}[/]")
                else:
                    outcome = self.run_cell(cell, self.timeout_for(selected))
                display.finish_cell(outcome)
                outcomes.append(outcome)
                if outcome.status == "failed":
                    self.recheck_after(outcome)
        return outcomes

    # --- the health gate (dtlab.doctor) ------------------------------------------------

    def run_gate(self) -> doctor.Diagnosis:
        """The whole cluster, before the first cell: GateRefused (one line per failure) if it fails."""
        say = self.display.note if self.display else print
        say(f"health gate: checking {self.cluster.name} (services, clocks, disks, GPUs, all-reduce between "
            "workers; --skip-gate skips it)")
        diagnosis = doctor.diagnose(self.cluster)
        if not diagnosis.healthy:
            raise doctor.GateRefused(diagnosis)
        say(f"health gate passed: {diagnosis.summary()}")
        return diagnosis

    def recheck_after(self, outcome: CellOutcome) -> None:
        """A cell failed on a node: that node's checks and all-reduce again; drained if they fail."""
        node = outcome.failure.node if outcome.failure else None
        if (self.options.skip_gate or node is None or node in self.drained
                or node not in {n.name for n in self.cluster.nodes}):
            return
        say = self.display.note if self.display else print
        say(f"health gate: {outcome.cell.key} failed on {node}; checking {node} again")
        diagnosis = doctor.diagnose_node(self.cluster, node, self.drained)
        if diagnosis.healthy:
            say(f"health gate: {node} passes ({diagnosis.summary()}); it stays in the matrix")
        else:
            first = diagnosis.failed_rows[0]
            more = len(diagnosis.failed_rows) - 1
            self.drained[node] = f"{first.check}: {first.detail}" + (f"; and {more} more" if more else "")
            say(f"[yellow]health gate: {node} drained for the rest of this matrix, its cells skipped: "
                f"{'; '.join(diagnosis.failures)}[/]")
        if self.gate is not None:
            self.gate.add_recheck(diagnosis, outcome.cell.key, drained=not diagnosis.healthy)

    def drained_nodes_of(self, cell: Cell, timeout_s: int) -> list[str]:
        """The drained nodes this cell would run on or prepare (its launch's nodes)."""
        if not self.drained:
            return []
        try:
            planned = platforms.get(cell.framework).build(self.cluster, cell, 1, timeout_s)
        except DtlabError:  # run_cell says what is wrong with the cell
            return []
        return [node.name for node in planned.all_nodes if node.name in self.drained]

    # --- one cell --------------------------------------------------------------------

    def node_versions(self) -> dict[str, Any]:
        if self._node_versions is None:
            self._node_versions = probes.node_versions(self.cluster)
        return self._node_versions

    def run_cell(self, cell: Cell, timeout_s: int) -> CellOutcome:
        """Up to 1 + retries attempts; a retry resumes from the trainer's checkpoint."""
        started = time.monotonic()
        failure: AttemptFailure | None = None
        attempts = 0
        recovery = platforms.get(cell.framework).recovery(self.cluster)
        self.fault_run = faults.FaultRun(self.cluster, cell, recovery) if cell.fault else None
        for attempts in range(1, self.options.retries + 2):
            if attempts > 1:
                self.wait_for_nodes()
            result, failure = self.run_attempt(cell, attempts, timeout_s, fresh=attempts == 1)
            if result is not None:
                return CellOutcome(
                    cell,
                    "ok",
                    attempts,
                    time.monotonic() - started,
                    result=result,
                    phases=dict(self.phases),
                    marks=dict(self.marks),
                )
            if failure is not None and not failure.retryable:
                break
        return CellOutcome(
            cell, "failed", attempts, time.monotonic() - started, failure=failure, phases=dict(self.phases)
        )

    def wait_for_nodes(self) -> None:
        """Before a retry: wait (at most NODES_BACK_WAIT_S) until every node answers SSH again."""
        said = False

        def silent_nodes() -> list[str]:
            nonlocal said
            answers = remote.run_all(self.cluster.nodes, "true", timeout=PROBE_TIMEOUT_S)
            silent = sorted(name for name, answer in answers.items() if isinstance(answer, BaseException))
            if silent and not said and self.display:
                self.display.note(
                    f"waiting up to {NODES_BACK_WAIT_S} s for {', '.join(silent)} to answer before the retry"
                )
                said = True
            return silent

        silent = wait_until(silent_nodes, until=lambda silent: not silent, timeout_s=NODES_BACK_WAIT_S,
                            every_s=5)
        if silent and self.display:
            self.display.note(f"[yellow]{', '.join(silent)} still silent: retrying anyway[/]")

    def run_attempt(
        self, cell: Cell, number_in_run: int, timeout_s: int, *, fresh: bool
    ) -> tuple[dict[str, Any] | None, AttemptFailure | None]:
        """One attempt over one SSH connection per node, closed when the attempt ends."""
        self.sessions = remote.Sessions()
        try:
            return self._run_attempt(cell, number_in_run, timeout_s, fresh=fresh)
        finally:
            if self.fault_run is not None:
                self.fault_run.disarm()
            self.sessions.close()
            self.sessions = None

    def _run_attempt(
        self, cell: Cell, number_in_run: int, timeout_s: int, *, fresh: bool
    ) -> tuple[dict[str, Any] | None, AttemptFailure | None]:
        attempt_started = time.monotonic()
        submitted_at = time.time()  # the whole-run clock starts when the harness takes up the attempt
        self.marks = {}
        attempt = self.store.reserve_attempt(cell)
        if self.display:
            self.display.start_cell(cell, number_in_run)
        provenance = Provenance(config_hash(cell), self.git_rev, self.cluster.name, log_dir=attempt.log_dir,
                                attempt=attempt.number)
        planned: launching.Launch | None = None
        self.phases = {}
        mark = time.monotonic()

        def phase(name: str) -> None:
            nonlocal mark
            now = time.monotonic()
            self.phases[name] = now - mark
            mark = now

        try:
            planned = platforms.get(cell.framework).build(self.cluster, cell, attempt.number, timeout_s)
            self.preflight(planned)
            phase("preflight")
            self.prepare(planned, fresh=fresh)
            phase("prepare")
            if self.fault_run is not None:
                say = self.display.note if self.display else print
                # Rank 0 runs on a worker: dtlab's first placed one, or any (Spark and Ray choose).
                workers = tuple(node for node in planned.prepare_nodes if node in self.cluster.workers)
                self.fault_run.arm(planned.placement.nodes, workers, planned.paths.output_dir,
                                   attempt.number, say, self.sessions)
            result, failure = self.execute(planned, attempt.log_dir, timeout_s)
            phase("run_and_fetch")
            if self.fault_run is not None:
                self.fault_run.disarm()
        except KeyboardInterrupt:
            self.stop_cell(cell)
            raise
        except DtlabError as error:  # preflight and setup problems: reported before the trainer starts
            result, failure = (
                None,
                AttemptFailure(
                    str(error), getattr(error, "node", None), retryable=not isinstance(error, PreflightError)
                ),
            )
        versions = self.node_versions()
        if result is not None:
            # The whole-run clock, on the controller: submitted -> units -> result recorded (the last
            # mark is taken just before the store writes, which takes milliseconds).
            marks = {"submitted": submitted_at, **self.marks, "recorded": time.time()}
            result["harness_timeline_unix"] = marks
            try:
                self.store.record_ok(cell, result, dataclasses.replace(
                    provenance,
                    node_versions=versions,
                    harness_time_s=time.monotonic() - attempt_started,
                    fault_record=self.fault_run and self.fault_run.finish(number_in_run, result),
                ))
                phase("record")
                return result, None
            except DtlabError as error:  # a result that does not match the schema or the cell
                failure = AttemptFailure(
                    f"result rejected: {error}", planned.result_node.name if planned else None
                )
        assert failure is not None
        if self.display:
            self.display.attempt_failed()
        fault_record = None
        if self.fault_run is not None and self.fault_run.record is not None:
            self.fault_run.noticed_failure()
            fault_record = self.fault_run.finish(number_in_run, None)
        self.stop_cell(cell)
        self.store.record_failure(
            cell,
            dataclasses.replace(provenance, node_versions=versions, fault_record=fault_record,
                                harness_time_s=time.monotonic() - attempt_started),
            reason=failure.reason,
            node=failure.node,
            exit_code=failure.exit_code,
            log_tail=failure.log_tail,
        )
        return None, failure

    def preflight(self, planned: launching.Launch) -> None:
        """Each node the cell needs answers and has the trainer env; needed services are up."""
        cluster = self.cluster
        shared = cluster.shared_checkpoint_dir
        shared_check = "" if not shared else (
            f"test -d {shlex.quote(shared)} || {{ echo '{shared} (dtlab_shared_checkpoint_dir) is missing: "
            "mount it on every node, or set it to \"\" to keep checkpoints on each node'; exit 3; }; ")
        check = (
            f"test -x {cluster.python} || {{ echo 'no trainer venv at {cluster.venv_dir}'; exit 3; }}; "
            f"test -f {cluster.code_dir}/trainer/core.py || "
            f"{{ echo 'no trainer code in {cluster.code_dir} (run invoke trainer.deploy)'; exit 3; }}; "
            "command -v systemd-run >/dev/null || { echo 'no systemd-run'; exit 3; }; "
            # The units read gloo's and NCCL's interface from it; without it they would not start.
            f"test -s {shlex.quote(cluster.socket_env_file)} || {{ echo 'no {cluster.socket_env_file} (the "
            "interface for gloo and NCCL): run ansible-playbook site.yml'; exit 3; }; "
            + shared_check
            # Another cell still running here would share the node and skew both measurements.
            + "echo running=$(systemctl list-units --plain --no-legend --state=active,activating "
            + " ".join(shlex.quote(p + ".service") for p in remote.CELL_UNIT_PATTERNS)
            + " | awk '{print $1}' | tr '\\n' ' ')"
        )
        own_prefix = remote.unit_name(planned.cell.key, "")
        answers = remote.run_all(planned.all_nodes, check, timeout=30, sessions=self.sessions)
        for name, answer in answers.items():
            if isinstance(answer, BaseException):
                raise PreflightError(f"preflight: {answer}", name)
            if not answer.ok:
                raise PreflightError(
                    f"preflight: host {name}: {(answer.stdout or answer.stderr).strip()}", name
                )
            running = answer.stdout.rpartition("running=")[2].split()
            others = [unit for unit in running if not unit.startswith(own_prefix)]
            if others:
                raise PreflightError(
                    f"preflight: host {name}: another cell is still running ({others[0]}); wait for it or "
                    "run `invoke cluster.reset`",
                    name,
                )
        try:  # the platform's own readiness (its workers alive, its queue idle, its image usable)
            platforms.get(planned.cell.framework).preflight(cluster, planned, self.sessions)
        except PreflightError:
            raise
        except DtlabError as error:
            raise PreflightError(f"preflight: {error}", getattr(error, "node", None)) from None

    def prepare(self, planned: launching.Launch, *, fresh: bool) -> None:
        # A unit of this very cell left by a controller that died would block the unit name: stop it.
        stale = shlex.quote(remote.unit_name(planned.cell.key, "*") + ".service")
        command = (
            f"systemctl stop {stale} 2>/dev/null; systemctl reset-failed {stale} 2>/dev/null; "
            + launching.prepare_command(planned, self.cluster.user, fresh=fresh)
        )
        answers = remote.run_all(planned.prepare_nodes, command, timeout=60, sessions=self.sessions)
        shared = launching.shared_checkpoint_command(planned, self.cluster.user, fresh=fresh)
        if shared is not None:  # after the stale units are stopped everywhere
            first = planned.placement.nodes[0]
            answers[first.name] = remote.run(first, shared, timeout=60, sessions=self.sessions)
        for name, answer in answers.items():
            if isinstance(answer, BaseException):
                raise DtlabError(f"host {name}: cannot prepare the cell: {answer}")
            if not answer.ok:
                raise DtlabError(
                    f"host {name}: cannot prepare the cell: {(answer.stderr or answer.stdout).strip()}"
                )

    def execute(
        self, planned: launching.Launch, log_dir: Path, timeout_s: int
    ) -> tuple[dict[str, Any] | None, AttemptFailure | None]:
        """Start every unit at once, follow them; the first failure stops the rest."""
        if planned.external is not None:
            return self._execute_external(planned)
        sink = self.display.line if self.display else None
        say = self.display.note if self.display else print
        started = time.monotonic()
        self.marks = {"units_started": time.time()}
        pool = ThreadPoolExecutor(max_workers=len(planned.jobs), thread_name_prefix="dtlab-unit")
        sessions = self.sessions or remote.Sessions()
        # Each stream is a channel of its node's connection; a stream that hangs is ended by closing it.
        futures: dict[Future, Node] = {
            pool.submit(
                remote.run_unit,
                node,
                spec,
                timeout=timeout_s + TIMEOUT_MARGIN_S,
                sink=sink,
                log_file=log_dir / f"{node.name}.log",
                sessions=sessions,
            ): node
            for node, spec in planned.jobs
        }
        watch = UnitWatch([(node, spec.unit) for node, spec in planned.jobs], say, sessions).start()
        failure: AttemptFailure | None = None
        stopped_at: float | None = None
        try:
            remaining = set(futures)
            while remaining:
                finished, remaining = wait(remaining, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in finished:
                    node = futures[future]
                    failure = failure or self._job_failure(
                        node, future, log_dir, time.monotonic() - started, timeout_s
                    )
                if failure is None and remaining:
                    failure = watch.fault({futures[f].name for f in remaining})
                if failure is not None and self.fault_run is not None:
                    self.fault_run.noticed_failure()  # the harness knows from this moment
                if failure is not None and remaining and stopped_at is None:
                    # The others would wait in a collective until the timeout: stop them now.
                    self.stop_cell(planned.cell, quiet=True)
                    stopped_at = time.monotonic()
                if stopped_at is not None and remaining and time.monotonic() - stopped_at > STOP_WAIT_S:
                    # Streams still open after the stop (a node cut off): close them, stop waiting.
                    for future in remaining:
                        sessions.drop(futures[future].name)
                    say(f"[yellow]closed the log streams of {', '.join(futures[f].name for f in remaining)}"
                        " after the cell was stopped[/]")
                    break
        except KeyboardInterrupt:
            if self.display:
                self.display.mute()
            self.stop_cell(planned.cell)
            sessions.close()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            watch.stop()
        pool.shutdown(wait=stopped_at is None or not remaining)
        self.marks["units_ended"] = time.time()
        self.collect_platform_files(planned, log_dir)
        if failure is not None:
            return None, failure
        return self.fetch_result(planned, log_dir)

    def collect_platform_files(self, planned: launching.Launch, log_dir: Path) -> None:
        """What the platform wrote on the nodes beyond the units' logs: logs into the attempt folder,
        its wall-clock marks into the attempt's clock. Best effort: a missing file is left out."""
        for node, remote_path in planned.node_logs:
            text = remote.fetch_text(node, remote_path, sessions=self.sessions)
            if text is not None:
                (log_dir / f"{node.name}.log").write_text(text)
        if planned.platform_marks is not None:
            node, remote_path = planned.platform_marks
            try:
                marks = json.loads(remote.fetch_text(node, remote_path, sessions=self.sessions) or "{}")
            except json.JSONDecodeError:
                marks = {}
            self.marks.update({key: value for key, value in marks.items()
                               if isinstance(value, float) and key not in self.marks})

    def _job_failure(
        self, node: Node, future: Future, log_dir: Path, elapsed: float, timeout_s: int
    ) -> AttemptFailure | None:
        try:
            answer = future.result()
        except Exception as error:
            return AttemptFailure(str(error), node.name, None, _log_tail(log_dir, node.name))
        if answer.ok:
            return None
        tail = _log_tail(log_dir, node.name)
        if elapsed >= timeout_s:
            reason = f"timed out after {timeout_s} s on {node.name}"
        else:
            reason = f"exit {answer.exit_code} on {node.name}"
            last_error = next((line for line in reversed(tail) if EXCEPTION_LINE.search(line)), None)
            if last_error:
                reason += f": {last_error.strip()[:200]}"
        return AttemptFailure(reason, node.name, answer.exit_code, tail)

    def _execute_external(
        self, planned: launching.Launch
    ) -> tuple[dict[str, Any] | None, AttemptFailure | None]:
        try:
            master_view = planned.external.run()
        except KeyboardInterrupt:
            planned.external.cancel()
            raise
        except Exception as error:
            return None, AttemptFailure(
                f"determined: {error}", self.cluster.master.name if self.cluster.master else None
            )
        result, failure = self.fetch_result(planned, None, search=planned.prepare_nodes)
        if result is not None:
            result["determined_master"] = master_view
        return result, failure

    def fetch_result(
        self, planned: launching.Launch, log_dir: Path | None, search: tuple[Node, ...] | None = None
    ) -> tuple[dict[str, Any] | None, AttemptFailure | None]:
        for node in search or (planned.result_node,):
            text = remote.fetch_text(node, planned.paths.result_path, sessions=self.sessions)
            if text:
                try:
                    return json.loads(text), None
                except json.JSONDecodeError as error:
                    return None, AttemptFailure(
                        f"{planned.paths.result_path} on {node.name} is not JSON: {error}", node.name
                    )
        node = planned.result_node.name
        return None, AttemptFailure(
            f"no result.json at {planned.paths.result_path} on {node} although every unit exited 0",
            node,
            0,
            _log_tail(log_dir, node) if log_dir else [],
        )

    def stop_cell(self, cell: Cell, quiet: bool = False) -> None:
        """Stop this cell's units (and containers) on every node; bounded."""
        pattern = remote.unit_name(cell.key, "*")
        answers = remote.fan_out(
            self.cluster.nodes,
            lambda node: remote.stop_units(node, pattern, timeout=STOP_WAIT_S, sessions=self.sessions),
        )
        platforms.get(cell.framework).stop(self.cluster, cell, self.sessions, STOP_WAIT_S)
        if self.cluster.trainer_runtime == "docker":
            remote.run_all(
                self.cluster.workers,
                f"docker rm -f $(docker ps -aq --filter name=^{pattern.rstrip('*')}) 2>/dev/null; true",
                timeout=STOP_WAIT_S,
            )
        if not quiet and self.display:
            unreachable = [name for name, answer in answers.items() if isinstance(answer, BaseException)]
            if unreachable:
                self.display.note(f"[yellow]could not reach {', '.join(unreachable)} to stop {cell.key}[/]")


def _log_tail(log_dir: Path | None, node: str) -> list[str]:
    if log_dir is None:
        return []
    path = log_dir / f"{node}.log"
    try:
        return path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return []
