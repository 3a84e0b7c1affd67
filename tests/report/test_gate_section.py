"""The report's "Health gate" section: the gate file bench.all wrote before the reported profile's matrix."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from report_helpers import record

from dtlab import doctor, paths
from dtlab.cell import Cell
from dtlab.cluster import CheckRow
from dtlab.inventory import Cluster
from dtlab.report import build_report, generate_report
from dtlab.results import ResultStore

LAB_LIMITS = doctor.Thresholds(
    max_clock_skew_s=1.0,
    min_free_disk_gb=2.0,
    max_allreduce_latency_ms=50.0,
    min_allreduce_bandwidth_mb_s=10.0,
)


@pytest.fixture
def store(tmp_path) -> ResultStore:
    store = ResultStore(tmp_path / "lab")
    for gpus in (1, 2):
        record(store, Cell("ddp", gpus, 2, 0, "smoke"), time_total_s=20.0, final_accuracy=0.9, device="cpu")
    return store


def write_gate(store: ResultStore, profile: str = "smoke", *, skipped: bool = False) -> doctor.GateFile:
    """What bench.all writes before a matrix, through dtlab.doctor's own code."""
    cluster = Cluster("lab-test", Path("inventory/lab-test.yml"), ())
    pair = doctor.PairResult(
        ("node1", "node2"),
        (
            {"bytes": 8, "seconds": 0.0004, "algbw_bytes_per_s": 20000.0},
            {"bytes": 16 << 20, "seconds": 0.05, "algbw_bytes_per_s": (16 << 20) / 0.05},
        ),
    )
    rows = [
        CheckRow("ssh", "node1", True, "root@10.213.77.11"),
        CheckRow("clock skew", "node1", True, "+0.12 s", value=0.12),
        CheckRow("clock skew", "node2", True, "-0.31 s", value=-0.31),
        CheckRow("free disk", "node1", True, "57.1 GiB free", value=57.1),
        CheckRow("free disk", "node2", True, "12.5 GiB free", value=12.5),
        CheckRow("dtlab units", "node1", True, "0 running", required=False),
        *doctor.allreduce_rows([pair], LAB_LIMITS),
    ]
    diagnosis = (
        None
        if skipped
        else doctor.Diagnosis(cluster, rows, [pair], LAB_LIMITS, "gloo", "2026-11-25T07:00:00+00:00", 8.25)
    )
    time.sleep(0.001)  # gate files are named by the microsecond
    return doctor.GateFile.write(
        store.root / paths.GATE_DIRNAME,
        diagnosis,
        {"profile": profile, "source": "experiments/matrix.yml", "cells": ["ddp-g1-e2-s0", "ddp-g2-e2-s0"]},
    )


def test_the_gate_before_the_matrix_is_its_own_section_with_the_all_reduce_table(store, tmp_path):
    gate = write_gate(store)
    section = build_report(store).gate
    assert section.source == f"gate/{gate.path.name}"
    assert section.summary == (
        "Passed before the smoke matrix (2 cells), 2026-11-25T07:00:00+00:00: 6 checks "
        "of lab-test in 8.25 s: cluster.check's rows and the all-reduce below."
    )
    assert section.table.number == "B.6" and "(gloo)" in section.table.title
    assert [[value.text for value in row] for row in section.table.rows] == [
        ["node1↔node2", "0.40", "50.00", "336", "10", "ok"]
    ]
    assert section.notes == [
        "Clock offsets against the controller: at most -0.31 s (limit ±1 s).",
        "Free disk under the runs folder: at least 12.5 GiB per node (need 2).",
    ]
    files = generate_report(store, tmp_path / "out")
    markdown = files.markdown.read_text()
    assert "## Health gate" in markdown and "| node1↔node2 | 0.40 | 50.00 | 336 | 10 | ok |" in markdown
    assert markdown.index("## Health gate") < markdown.index("## Study tables")
    csv = (tmp_path / "out" / "tables" / "table-b.6-gate-allreduce.csv").read_text().splitlines()
    assert csv[0] == "Pair,Latency (ms),Limit (ms),Bandwidth (MB/s),Need (MB/s),Verdict"
    assert csv[1].startswith("node1↔node2,0.4,50.0,335.54432,")  # unrounded, as every report CSV
    assert 'id="health-gate"' in files.html.read_text()


def test_each_node_drained_during_the_matrix_is_named_with_why(store):
    gate = write_gate(store)
    cluster = Cluster("lab-test", Path("inventory/lab-test.yml"), ())
    down = [CheckRow("ssh", "node2", False, "host node2 (10.213.77.12): ssh failed: refused")]
    recheck = doctor.Diagnosis(
        cluster, down, [], LAB_LIMITS, "gloo", "2026-11-25T07:01:00+00:00", 1.0, scope="node2"
    )
    gate.add_recheck(recheck, "ddp-g2-e2-s0", drained=True)
    passed = doctor.Diagnosis(
        cluster, [], [], LAB_LIMITS, "gloo", "2026-11-25T07:02:00+00:00", 1.0, scope="node1"
    )
    gate.add_recheck(passed, "ddp-g1-e2-s0", drained=False)
    notes = build_report(store).gate.notes
    assert notes[-2:] == [
        "node2 re-checked after ddp-g2-e2-s0 failed there: drained for the rest of the matrix: "
        "node2: ssh: host node2 (10.213.77.12): ssh failed: refused.",
        "node1 re-checked after ddp-g1-e2-s0 failed there: passed again and stayed in the matrix.",
    ]


def test_the_section_is_the_reported_profiles_newest_gate_or_says_it_was_skipped(store):
    write_gate(store)
    newest_smoke = write_gate(store, skipped=True)
    write_gate(store, profile="faults")  # newer, but it preceded another profile's matrix
    section = build_report(store).gate
    assert section.source.endswith(newest_smoke.path.name) and section.table is None
    assert section.summary.startswith("Skipped (--skip-gate) before the smoke matrix (2 cells)")


def test_a_store_without_a_gate_has_no_section_and_a_broken_gate_file_never_stops_the_report(store, tmp_path):
    assert build_report(store).gate is None
    assert "## Health gate" not in generate_report(store, tmp_path / "out").markdown.read_text()
    broken = store.root / paths.GATE_DIRNAME / "gate-29991231T000000000000Z.json"
    broken.parent.mkdir()
    broken.write_text("{not json")
    section = build_report(store).gate
    assert section.table is None and section.summary.startswith(
        f"The gate file gate/{broken.name} cannot be read"
    )
