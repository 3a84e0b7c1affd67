"""The record step of one attempt: rank 0's result.json fetched, and the attempt recorded in the store,
its result with the whole-run clock, or its failure (node, exit code, last log lines)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtlab import faults, remote
from dtlab import launch as launching
from dtlab.cell import Cell
from dtlab.display import Display
from dtlab.errors import DtlabError
from dtlab.inventory import NODE_COST_VARIABLE, Cluster, Node
from dtlab.outcome import AttemptFailure
from dtlab.results import Provenance, ResultStore

LOG_TAIL_LINES = 30


class RecordStep:
    """Bench's record step, mixed into Bench (which sets these attributes, and gives node_versions and
    stop_cell)."""

    store: ResultStore
    cluster: Cluster
    display: Display | None
    sessions: remote.Sessions | None
    fault_run: faults.FaultRun | None
    marks: dict[str, float]

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
            f"no {planned.paths.result_path.rsplit('/', 1)[-1]} at {planned.paths.result_path} on {node} "
            "although every unit exited 0",
            node,
            0,
            log_tail(log_dir, node) if log_dir else [],
        )

    def record_attempt(
        self,
        cell: Cell,
        number_in_run: int,
        planned: launching.Launch | None,
        provenance: Provenance,
        result: dict[str, Any] | None,
        failure: AttemptFailure | None,
        *,
        submitted_at: float,
        attempt_started: float,
        phase: Callable[[str], None],
    ) -> tuple[dict[str, Any] | None, AttemptFailure | None]:
        """The attempt into the store: its result with the whole-run clock; or its failure (a result the
        store rejects is one), after the cell's units are stopped on every node."""
        versions = self.node_versions()
        if result is not None:
            # The whole-run clock, on the controller: submitted -> units -> result recorded (the last
            # mark is taken just before the store writes, which takes milliseconds).
            marks = {"submitted": submitted_at, **self.marks, "recorded": time.time()}
            result["harness_timeline_unix"] = marks
            # The run holds the whole cluster: each node's hourly cost, where the inventory sets one.
            rates = {node.name: node.var(NODE_COST_VARIABLE) for node in self.cluster.nodes}
            if any(rate is not None for rate in rates.values()):
                result["node_cost_per_hour"] = rates
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


def log_tail(log_dir: Path | None, node: str) -> list[str]:
    """The last LOG_TAIL_LINES lines of the node's log in the attempt folder; [] when there is none."""
    if log_dir is None:
        return []
    path = log_dir / f"{node}.log"
    try:
        return path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return []
