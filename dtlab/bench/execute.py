"""The execution step of one attempt: the launcher's units started on all their nodes at once and
followed (the first failure stops the others; the unit watch stops them when a node falls silent), or
the platform's external job (Determined); the platform's own files collected; a cell's units stopped."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from dtlab import faults, platforms, remote
from dtlab import launch as launching
from dtlab.bench.record import log_tail
from dtlab.bench.watch import UnitWatch
from dtlab.cell import Cell
from dtlab.display import Display
from dtlab.inventory import Cluster, Node
from dtlab.outcome import AttemptFailure

# Fabric waits this much longer than the unit's own RuntimeMaxSec, so systemd ends a stuck run first.
TIMEOUT_MARGIN_S = 30
STOP_WAIT_S = 60
# The line that names what went wrong: an exception with its message, not torchrun's wrapper.
EXCEPTION_LINE = re.compile(r"\b(?!ChildFailedError)\w*(Error|Exception)\b: \S|\berror: \S")


class ExecuteStep:
    """Bench's execution step, mixed into Bench (which sets these attributes, and whose record step
    gives fetch_result)."""

    cluster: Cluster
    display: Display | None
    sessions: remote.Sessions | None
    fault_run: faults.FaultRun | None
    marks: dict[str, float]

    def execute(
        self, planned: launching.Launch, log_dir: Path, timeout_s: int
    ) -> tuple[dict[str, Any] | None, AttemptFailure | None]:
        """Start every unit at once, follow them; the first failure stops the rest."""
        if planned.external is not None:
            return self._execute_external(planned)
        if planned.serving is not None:  # dtlab/bench/serve.py
            return self.execute_serving(planned, log_dir, timeout_s)
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
                    if self.fault_run is not None and node.name == self.fault_run.lost_node():
                        say(f"{node.name}: its part of the cell ended with the fault; the others go on")
                        continue  # an elastic plan's lost node: the survivors' units carry the run
                    failure = failure or self._job_failure(
                        node, future, log_dir, time.monotonic() - started, timeout_s
                    )
                if failure is None and remaining:
                    lost = self.fault_run.lost_node() if self.fault_run is not None else None
                    failure = watch.fault({futures[f].name for f in remaining} - {lost})
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
        lost = self.fault_run.lost_node() if self.fault_run is not None else None
        result, failure = self.fetch_result(planned, log_dir, search=planned.result_nodes(lost))
        return ({**result, **planned.result_extra} if result is not None else None), failure

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
            return AttemptFailure(str(error), node.name, None, log_tail(log_dir, node.name))
        if answer.ok:
            return None
        tail = log_tail(log_dir, node.name)
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
            master = self.cluster.master.name if self.cluster.master else None
            return None, AttemptFailure(f"{planned.cell.framework}: {error}", master)
        result, failure = self.fetch_result(planned, None, search=planned.prepare_nodes)
        if result is not None:
            result[planned.external.result_key] = master_view
        return result, failure

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
