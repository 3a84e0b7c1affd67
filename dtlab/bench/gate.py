"""The health gate's part in a matrix (dtlab.doctor): the whole cluster before the first cell, a node
again after a cell failed on it (drained for the rest of the matrix if it fails), and which drained
nodes a cell would need."""

from __future__ import annotations

from dtlab import doctor, platforms
from dtlab.bench.options import BenchOptions
from dtlab.cell import Cell
from dtlab.display import Display
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster
from dtlab.outcome import CellOutcome


class HealthGate:
    """Bench's health-gate step, mixed into Bench (which sets these attributes in its __init__)."""

    cluster: Cluster
    options: BenchOptions
    display: Display | None
    gate: doctor.GateFile | None
    drained: dict[str, str]

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
