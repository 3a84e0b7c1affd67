"""node_cost_per_hour (issue #55): refused in one line unless a number >= 0, and recorded with each run
for the report's cost per run (Table B.14)."""

import time

import pytest
from harness_helpers import CPU_CLUSTER_3, CPU_SITE_VARS, write_inventory
from result_factory import made_up_result

from dtlab.bench.record import RecordStep
from dtlab.cell import Cell
from dtlab.errors import DtlabError
from dtlab.platforms import load_cluster
from dtlab.results import Provenance, ResultStore


@pytest.mark.parametrize("value", ["'cheap'", "-1", "true"])
def test_a_cost_that_is_not_a_number_is_refused_in_one_line(tmp_path, value):
    path = write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": CPU_SITE_VARS},
                           host_vars={"n1": f"node_cost_per_hour: {value}\n"})
    with pytest.raises(DtlabError, match=r"host n1: node_cost_per_hour must be a number >= 0 \(what an hour "
                                         r"of the node costs\), got "):
        load_cluster(path)


class Recorder(RecordStep):
    """Bench's record step alone, over a real store and a real inventory."""

    def __init__(self, store, cluster):
        self.store, self.cluster, self.marks = store, cluster, {}
        self.display, self.sessions, self.fault_run = None, None, None

    def node_versions(self):
        return {}

    def stop_cell(self, cell):
        raise AssertionError("an ok attempt stops nothing")


def test_each_nodes_rate_is_recorded_with_the_run(tmp_path):
    site = CPU_SITE_VARS + "node_cost_per_hour: 2\n"
    path = write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": site},
                           host_vars={"n0": "node_cost_per_hour: 0.5\n"})
    store = ResultStore(tmp_path / "results")
    cell = Cell("ddp", 2, 1, 0, "smoke")
    result = made_up_result("ddp", 2, 1, 0, time_total_s=10.0, final_accuracy=0.8, device="cpu")
    recorded, failure = Recorder(store, load_cluster(path)).record_attempt(
        cell, 1, None, Provenance(config_hash="0123456789abcdef", git_rev=None, inventory="three"), result,
        None, submitted_at=time.time() - 12, attempt_started=time.monotonic() - 12, phase=lambda _: None)
    assert failure is None
    [run] = store.runs(status="ok")
    assert run.result["node_cost_per_hour"] == {"n0": 0.5, "n1": 2, "n2": 2} == recorded["node_cost_per_hour"]
