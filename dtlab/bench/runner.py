"""Bench, the orchestrator: the matrix loaded and checked before start, the health gate, every cell in
the matrix's order, each cell's attempts and retries. Its steps are mixins, one module each: the health
gate (gate), preflight and prepare (prepare), the units and external jobs (execute), the record (record).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections import defaultdict
from typing import Any

from dtlab import doctor, faults, paths, platforms, probes, remote
from dtlab import launch as launching
from dtlab import matrix as matrix_module
from dtlab.bench.execute import ExecuteStep
from dtlab.bench.gate import HealthGate
from dtlab.bench.options import BenchOptions
from dtlab.bench.prepare import PrepareStep
from dtlab.bench.record import RecordStep
from dtlab.bench.serve import ServeStep
from dtlab.bench.watch import PROBE_TIMEOUT_S
from dtlab.cell import DEFAULT_DATA_PATH, Cell, config_hash
from dtlab.display import Display
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.outcome import AttemptFailure, CellOutcome
from dtlab.platforms import PreflightError
from dtlab.results import Provenance, ResultStore
from dtlab.waiting import wait_until
from trainer import strategies

# Before a retry, wait at most this long for every node to answer (a restarting node boots).
NODES_BACK_WAIT_S = 180


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


class Bench(HealthGate, PrepareStep, ExecuteStep, ServeStep, RecordStep):
    """One bench run on a cluster: the matrix, its cells and their attempts, through the steps mixed in."""

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
        # The loaded profile's target_accuracy: each recorded run's MLPerf log states it (dtlab.results).
        self.target_accuracy: float | None = None

    # --- the matrix ----------------------------------------------------------------

    def load_matrix(self) -> matrix_module.Matrix:
        loaded = matrix_module.load(
            self.options.profile,
            self.options.matrix_path,
            max_gpus=self.cluster.max_gpus,
            device=self.cluster.device,
        )
        selected = loaded.select(self.options.only)
        self.target_accuracy = loaded.target_accuracy
        if self.options.retries < 0:
            raise DtlabError(f"--retries {self.options.retries}: must be >= 0")
        if self.options.timeout_s is not None and self.options.timeout_s <= 0:
            raise DtlabError(f"--timeout {self.options.timeout_s}: must be a positive number of seconds")
        return selected

    def check_cells(self, selected: matrix_module.Matrix) -> None:
        """What the controller alone decides about the cells: each cell's platform can run its strategy,
        data path, search and serving (Platform.strategy_refusal, data_path_refusal, search_refusal,
        serve_refusal; a platform's ETL and a served checkpoint need the shared disk), and each fault
        plan's node is one its cell runs on."""
        where = f"{selected.source}: profiles.{selected.profile}"
        for cell in selected.cells:
            platform = platforms.get(cell.framework)
            refusal = platform.strategy_refusal(cell.strategy) or platform.data_path_refusal(cell.data_path) \
                or (platform.search_refusal(self.cluster, cell.search) if cell.search else None) \
                or (platform.serve_refusal(self.cluster) if cell.trained else None)
            shared_disk = self.cluster.shared_checkpoint_dir
            if refusal is None and cell.trained and not shared_disk:
                refusal = ("serve: the servers on every worker read the trained cell's checkpoint from a "
                           "disk every node mounts; set dtlab_shared_checkpoint_dir in the inventory")
            if refusal is None and cell.data_path != DEFAULT_DATA_PATH and not shared_disk:
                refusal = (f"data_path {cell.data_path}: the platform's ETL reads and writes on a disk every "
                           "node mounts; set dtlab_shared_checkpoint_dir in the inventory, or use loader")
            if refusal is not None:
                raise DtlabError(f"{where}: cell {cell.key}: {refusal}")
        for cell in selected.cells:
            if cell.fault:
                placed = launching.place(self.cluster, cell).nodes
                hit = faults.target(self.cluster, cell, placed)
                refusal = self._elastic_refusal(cell, placed, hit) if cell.elastic else None
                if refusal is not None:
                    raise DtlabError(f"{where}: cell {cell.key}: {refusal}")

    def _elastic_refusal(self, cell: Cell, placed: tuple[Node, ...], hit: Node) -> str | None:
        if refusal := platforms.get(cell.framework).elastic_refusal(self.cluster):
            return refusal
        if hit == placed[0]:  # also a 1-worker cell's only worker
            return ("recovery elastic: the fault would take the first worker, where rank 0 and the "
                    "rendezvous run (a 1-worker cell's only one); name another node")
        if cell.strategy != strategies.DEFAULT:  # the trainer's own rule (trainer.config: elastic)
            return f"recovery elastic: tested with strategy {strategies.DEFAULT} alone, not {cell.strategy}"
        return None

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

    # --- one cell --------------------------------------------------------------------

    def node_versions(self) -> dict[str, Any]:
        if self._node_versions is None:
            self._node_versions = probes.node_versions(self.cluster)
        return self._node_versions

    def run_cell(self, cell: Cell, timeout_s: int) -> CellOutcome:
        """Up to 1 + retries attempts; a retry resumes from the trainer's checkpoint."""
        started = time.monotonic()
        platform = platforms.get(cell.framework)
        recovery = (platform.elastic_recovery if cell.elastic else platform.recovery)(self.cluster)
        held = platform.lost_node_service(self.cluster) if cell.elastic else ""
        self.fault_run = faults.FaultRun(self.cluster, cell, recovery, held) if cell.fault else None
        try:
            return self._run_attempts(cell, timeout_s, started)
        finally:
            self.restore_lost_node(platform)

    def restore_lost_node(self, platform: platforms.Platform) -> None:
        """After a faulted cell: the platform service its elastic plan held stopped starts again, and the
        next cell waits (bounded) until the platform takes cells on that node again. One that will not start
        is said, not raised: the cell's outcome stands, and the next cell's preflight names the node."""
        say = self.display.note if self.display else print
        try:
            restored = self.fault_run.restore() if self.fault_run is not None else None
        except DtlabError as error:
            say(f"[yellow]{error}[/]")
            return
        if restored is not None:
            say(f"{restored}: the lost node's {self.fault_run.held_service} started again")
            platform.wait_ready(self.cluster, list(self.cluster.workers), NODES_BACK_WAIT_S)

    def _run_attempts(self, cell: Cell, timeout_s: int, started: float) -> CellOutcome:
        failure: AttemptFailure | None = None
        attempts = 0
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
                                attempt=attempt.number, target_accuracy=self.target_accuracy)
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
                                   attempt.number, say, self.sessions,
                                   unit_nodes=frozenset(node.name for node, _ in planned.jobs))
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
        return self.record_attempt(cell, number_in_run, planned, provenance, result, failure,
                                   submitted_at=submitted_at, attempt_started=attempt_started, phase=phase)
