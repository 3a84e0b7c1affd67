"""cluster.doctor and bench.all's health gate without the lab: the verdicts, the thresholds, the JSON, the
one-line refusals, which cells a drained node stops, and the all-reduce probe itself on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from harness_helpers import CPU_CLUSTER_3, CPU_SITE_VARS, invoke, write_inventory

from dtlab import doctor, paths, remote
from dtlab.bench import Bench, BenchOptions
from dtlab.cell import Cell
from dtlab.cluster import CheckRow
from dtlab.commands import matrix_summary
from dtlab.errors import DtlabError
from dtlab.outcome import CellOutcome
from dtlab.platforms import load_cluster

LIMITS = doctor.Thresholds(
    max_clock_skew_s=1.0,
    min_free_disk_gb=2.0,
    max_allreduce_latency_ms=2.0,
    min_allreduce_bandwidth_mb_s=60.0,
)






def _measured(pair=("n1", "n2"), latency_s=0.0004, seconds_16mib=0.05) -> doctor.PairResult:
    sizes = doctor.MESSAGE_SIZES
    return doctor.PairResult(
        pair,
        (
            {"bytes": sizes[0], "seconds": latency_s, "algbw_bytes_per_s": sizes[0] / latency_s},
            {"bytes": sizes[-1], "seconds": seconds_16mib, "algbw_bytes_per_s": sizes[-1] / seconds_16mib},
        ),
    )


# --- the round robin ---------------------------------------------------------------------------------


@pytest.mark.parametrize("count", range(0, 8))
def test_pair_rounds_meet_every_pair_once_and_no_node_twice_in_a_round(count):
    names = [f"w{i}" for i in range(count)]
    rounds = doctor.pair_rounds(names)
    pairs = [pair for round_ in rounds for pair in round_]
    assert sorted(pairs) == sorted((a, b) for i, a in enumerate(names) for b in names[i + 1 :])
    assert all(len({node for pair in round_ for node in pair}) == 2 * len(round_) for round_ in rounds)
    # As few rounds as a round robin needs: n - 1 for an even count, n for an odd one (one sits out).
    assert len(rounds) == (count - 1 if count % 2 == 0 else count) if count > 1 else rounds == []


# --- thresholds ------------------------------------------------------------------------------------


def test_thresholds_come_from_group_vars_and_a_site_overrides_them(cpu_cluster, tmp_path):
    assert doctor.Thresholds.of(cpu_cluster) == LIMITS  # group_vars/all.yml: the reference cluster's
    site = CPU_SITE_VARS + "dtlab_min_allreduce_bandwidth_mb_s: 500\ndtlab_max_clock_skew_s: 0.25\n"
    faster = load_cluster(write_inventory(tmp_path / "site", CPU_CLUSTER_3, group_vars={"all": site}))
    assert doctor.Thresholds.of(faster).min_allreduce_bandwidth_mb_s == 500
    assert doctor.Thresholds.of(faster).max_clock_skew_s == 0.25


def test_the_lab_judges_a_broken_link_not_a_slow_one():
    import yaml

    lab = yaml.safe_load(paths.LAB_VARS_FILE.read_text())
    reference = yaml.safe_load((paths.INVENTORY_DIR / "group_vars" / "all.yml").read_text())
    assert lab["dtlab_max_allreduce_latency_ms"] > reference["dtlab_max_allreduce_latency_ms"]
    assert lab["dtlab_min_allreduce_bandwidth_mb_s"] < reference["dtlab_min_allreduce_bandwidth_mb_s"]


@pytest.mark.parametrize("value", ["fast", "-1", "true"])
def test_a_threshold_that_is_not_a_number_is_one_line_naming_it(tmp_path, value):
    site = CPU_SITE_VARS + f"dtlab_max_allreduce_latency_ms: {value}\n"
    cluster = load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": site}))
    with pytest.raises(
        DtlabError, match=r"dtlab_max_allreduce_latency_ms .* is not a threshold; use a number"
    ):
        doctor.Thresholds.of(cluster)


def test_cluster_doctor_with_a_bad_threshold_exits_2_before_any_node_and_json_says_error(tmp_path):
    site = CPU_SITE_VARS + "dtlab_min_free_disk_gb: plenty\n"
    inventory = write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": site})
    started = time.monotonic()
    answer = invoke("cluster.doctor", "-i", str(inventory), "--json")
    assert answer.returncode == 2, answer.stderr
    [line] = answer.stderr.strip().splitlines()
    assert (
        line.startswith("error: inventory ") and "dtlab_min_free_disk_gb 'plenty' is not a threshold" in line
    )
    assert json.loads(answer.stdout) == {"format": doctor.GATE_FORMAT, "status": "error", "error": line[7:]}
    assert time.monotonic() - started < 30


# --- verdicts ------------------------------------------------------------------------------------------


def test_a_pair_passes_within_both_limits_and_fails_past_either():
    ok, slow, narrow = (
        _measured(latency_s=0.0004),
        _measured(latency_s=0.0031),
        _measured(seconds_16mib=0.5),
    )
    rows = doctor.allreduce_rows([ok, slow, narrow], LIMITS)
    assert [row.ok for row in rows] == [True, False, False]
    assert rows[0].node == "n1↔n2" and rows[0].check == "all-reduce"
    assert rows[0].detail == "latency 0.40 ms (limit 2), bandwidth 336 MB/s (need 60)"
    assert "latency 3.10 ms (over 2)" in rows[1].detail
    assert "bandwidth 34 MB/s (under 60)" in rows[2].detail
    [error] = doctor.allreduce_rows(
        [doctor.PairResult(("n1", "n2"), error="n2: no result within 45 s")], LIMITS
    )
    assert not error.ok and error.required and error.detail == "not measured: n2: no result within 45 s"


def _answer(node, stdout="", exit_code=0, stderr=""):
    return remote.CommandResult(node, exit_code, stdout, stderr)


def test_a_pair_is_rank_0s_measurement_or_the_first_sides_reason():
    measured = {"rank": 0, "by_size": [{"bytes": 8, "seconds": 0.001, "algbw_bytes_per_s": 8000.0}]}
    other = {"rank": 1, "by_size": [{"bytes": 8, "seconds": 0.009, "algbw_bytes_per_s": 888.0}]}
    pair = ("n1", "n2")
    result = doctor.pair_result(
        pair, _answer("n1", "noise\n" + json.dumps(measured)), _answer("n2", json.dumps(other))
    )
    assert result.error is None and result.latency_ms == pytest.approx(1.0)
    failed = doctor.pair_result(
        pair,
        _answer("n1", json.dumps(measured)),
        _answer("n2", json.dumps({"rank": 1, "error": "DistNetworkError: timed out"}), 3),
    )
    assert failed.error == "n2: DistNetworkError: timed out"
    timed_out = doctor.pair_result(pair, _answer("n1", "", 124), _answer("n2", json.dumps(other)))
    assert timed_out.error == f"n1: no result within {doctor.PROBE_DEADLINE_S} s"
    unreachable = doctor.pair_result(pair, remote.RemoteError("host n1 (1.2.3.4): ssh failed"), _answer("n2"))
    assert unreachable.error == "host n1 (1.2.3.4): ssh failed"
    crashed = doctor.pair_result(
        pair, _answer("n1", "", 1, "Traceback\nImportError: no torch"), _answer("n2")
    )
    assert crashed.error == "n1: exit 1: ImportError: no torch"


def test_the_probe_runs_from_the_trainer_venv_as_the_trainer_user_with_the_units_interface(cpu_cluster):
    first, second = cpu_cluster.workers
    command = doctor.probe_command(cpu_cluster, second, 1, first)
    assert command.startswith("set -a; . /etc/dtlab/veth9.env; set +a; cd /opt/dtlab/src && ")
    assert "runuser -u dtlab -- timeout -k 5 45 env PYTHONPATH=/opt/dtlab/src OMP_NUM_THREADS=1 " in command
    assert (
        f"/opt/dtlab/venv/bin/python -m trainer.allreduce_probe --rank 1 --world-size 2 --master-addr "
        f"{first.address} --master-port 29510 --device cpu "
    ) in command
    assert "CUDA_VISIBLE_DEVICES" not in command and doctor.backend(cpu_cluster) == "gloo"


def test_on_a_gpu_inventory_the_probe_uses_nccl_on_the_nodes_first_gpu(gpu_cluster):
    """The GPU path, named and guarded: nothing here runs NCCL, so the command is what is checked."""
    first, second = gpu_cluster.workers[:2]
    command = doctor.probe_command(gpu_cluster, second, 1, first)
    assert f"CUDA_VISIBLE_DEVICES={second.gpu_indices[0]} " in command and "--device cuda" in command
    assert doctor.backend(gpu_cluster) == "nccl"
    assert [w.name for w in doctor.training_workers(gpu_cluster)] == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert len(doctor.pair_rounds(["gpu1", "gpu2", "gpu3", "gpu4"])) == 3  # 6 pairs, 2 at once


# --- the JSON and the refusal ---------------------------------------------------------------------------


def _diagnosis(cluster, rows, pairs=()) -> doctor.Diagnosis:
    return doctor.Diagnosis(
        cluster, list(rows), list(pairs), LIMITS, "gloo", "2026-11-25T06:00:00+00:00", 1.5
    )


def test_the_json_has_a_verdict_per_check_and_one_line_per_failure(cpu_cluster):
    rows = [
        CheckRow("ssh", "n1", True, "root@127.0.20.11"),
        CheckRow("clock skew", "n1", False, "+3.00 s (limit ±1 s, round trip 0.01 s)", value=3.0),
        CheckRow("dtlab units", "n1", True, "0 running", required=False),
        CheckRow("gpu usable", "n2", False, "no GPU", required=False),
        *doctor.allreduce_rows([_measured()], LIMITS),
    ]
    document = json.loads(json.dumps(_diagnosis(cpu_cluster, rows, [_measured()]).as_json()))
    assert document["format"] == doctor.GATE_FORMAT and document["status"] == "failed"
    assert document["cluster"] == "three" and document["scope"] == "cluster"
    assert [check["verdict"] for check in document["checks"]] == ["pass", "fail", "note", "note", "pass"]
    assert document["checks"][1]["value"] == 3.0 and "value" not in document["checks"][0]
    assert document["failures"] == ["n1: clock skew: +3.00 s (limit ±1 s, round trip 0.01 s)"]
    assert document["thresholds"] == {
        "dtlab_max_clock_skew_s": 1.0,
        "dtlab_min_free_disk_gb": 2.0,
        "dtlab_max_allreduce_latency_ms": 2.0,
        "dtlab_min_allreduce_bandwidth_mb_s": 60.0,
    }
    [pair] = document["allreduce"]["pairs"]
    assert pair["nodes"] == ["n1", "n2"] and pair["latency_ms"] == pytest.approx(0.4)
    assert document["allreduce"]["backend"] == "gloo"
    assert document["allreduce"]["message_bytes"] == list(doctor.MESSAGE_SIZES)
    healthy = _diagnosis(cpu_cluster, [rows[0], rows[2]])
    assert healthy.healthy and healthy.as_json()["status"] == "healthy" and healthy.failures == []


def test_the_refusal_is_one_line_saying_nothing_started_then_one_line_per_failure(cpu_cluster):
    rows = [CheckRow("ssh", n, False, f"host {n}: ssh failed") for n in ("n0", "n1")]
    lines = str(doctor.GateRefused(_diagnosis(cpu_cluster, rows))).splitlines()
    assert (
        lines[0].startswith(
            "health gate: 2 check(s) failed on three: the matrix did not start, nothing "
            "was reserved or written"
        )
        and "--skip-gate" in lines[0]
    )
    assert lines[1:] == [
        "health gate: n0: ssh: host n0: ssh failed",
        "health gate: n1: ssh: host n1: ssh failed",
    ]
    assert doctor.GateRefused.exit_code == 1


def test_cluster_doctor_on_silent_nodes_exits_1_with_json_naming_each(loopback_inventory):
    started = time.monotonic()
    answer = invoke("cluster.doctor", "-i", str(loopback_inventory), "--json")
    assert answer.returncode == 1, answer.stderr
    document = json.loads(answer.stdout)
    assert document["status"] == "failed" and len(document["failures"]) == 3
    assert all(
        line.startswith(f"n{i}: ssh: host n{i} (127.0.66.1{i}): ssh failed")
        for i, line in enumerate(document["failures"])
    )
    # No pair to measure: each worker's note says why, and no pair row fails twice for one cause.
    notes = [c for c in document["checks"] if c["check"] == "all-reduce"]
    assert [(c["node"], c["verdict"]) for c in notes] == [("n1", "note"), ("n2", "note")]
    assert document["allreduce"]["pairs"] == []
    summary = answer.stderr.strip()
    judged = [check for check in document["checks"] if check["verdict"] != "note"]
    assert summary.startswith(f"error: cluster.doctor: 3 of {len(judged)} check(s) failed in ")
    assert summary.endswith(" s on three") and len(summary.splitlines()) == 1
    assert time.monotonic() - started < 60


def test_bench_all_on_silent_nodes_refuses_with_a_line_per_failure_and_writes_nothing(
    loopback_inventory, tmp_path
):
    results = tmp_path / "r"
    answer = invoke("bench.all", "-i", str(loopback_inventory), env={"DTLAB_RESULTS_DIR": str(results)})
    assert answer.returncode == 1, answer.stdout + answer.stderr
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("error: health gate: 3 check(s) failed on three")
    assert [line.split(": ")[2] for line in lines[1:]] == ["n0", "n1", "n2"]
    assert "Traceback" not in answer.stdout + answer.stderr
    assert not results.exists()  # no store, no attempt, no gate file


# --- drained nodes -------------------------------------------------------------------------------------


def test_a_drained_node_stops_exactly_the_cells_that_run_on_or_prepare_it(cpu_cluster):
    bench = Bench(cpu_cluster, BenchOptions(profile="smoke"))
    cells = {cell.key: cell for cell in bench.load_matrix().cells}
    assert bench.drained_nodes_of(cells["ddp-g2-e2-s0"], 600) == []  # nothing drained yet
    bench.drained = {"n2": "ssh: host n2: ssh failed"}
    needs = {key: bench.drained_nodes_of(cell, 600) for key, cell in cells.items()}
    assert needs["ddp-g1-e2-s0"] == []  # torchrun on n1 alone
    assert needs["ddp-g2-e2-s0"] == ["n2"] and needs["slurm-g2-e2-s0"] == ["n2"]
    # Spark, Ray, Slurm and a Determined master choose their workers, or prepare every one: a drained
    # worker stops them whatever their size.
    assert {key for key, nodes in needs.items() if nodes == ["n2"]} == set(cells) - {"ddp-g1-e2-s0"}


def test_the_end_summary_names_each_drained_node_and_the_cells_skipped_for_it():
    def cell(seed, gpus):
        return Cell("ddp", gpus=gpus, epochs=1, seed=seed, profile="p", trainer_config={})

    outcomes = [
        CellOutcome(cell(1, 1), "ok"),
        CellOutcome(cell(1, 2), "failed"),
        CellOutcome(cell(0, 1), "skipped"),
        CellOutcome(cell(2, 2), "skipped", skipped_because="node2 drained (ssh: refused)"),
    ]
    lines = matrix_summary("bench.all", "p", outcomes, {"node2": "ssh: refused"})
    assert lines == [
        "bench.all p: 1 ran ok, 1 already recorded, 1 failed, 1 skipped (node2 drained)",
        "drained: node2 (ssh: refused); skipped: ddp-g2-e1-s2",
    ]
    assert matrix_summary("bench.all", "p", outcomes[:3], {}) == [
        "bench.all p: 1 ran ok, 1 already recorded, 1 failed"
    ]


# --- the probe itself, on this machine's loopback (real torch, real gloo) ---------------------------------


def _probe(rank, port, *flags):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer.allreduce_probe",
            "--rank",
            str(rank),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--sizes",
            "8,4096,1048576",
            "--iterations",
            "3",
            *flags,
        ],
        cwd=paths.REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
    )


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_the_probe_measures_each_size_between_two_ranks_and_checks_the_sum():
    port = _free_port()
    ranks = [_probe(rank, port) for rank in (0, 1)]
    outputs = [process.communicate(timeout=120)[0] for process in ranks]
    assert [process.returncode for process in ranks] == [0, 0], outputs
    reports = [json.loads(output.strip().splitlines()[-1]) for output in outputs]
    assert [r["rank"] for r in reports] == [0, 1] and {r["backend"] for r in reports} == {"gloo"}
    sizes = [entry["bytes"] for entry in reports[0]["by_size"]]
    assert sizes == [8, 4096, 1048576]
    for entry in reports[0]["by_size"]:
        assert 0 < entry["min_seconds"] <= entry["seconds"] < 10
        assert entry["algbw_bytes_per_s"] == pytest.approx(entry["bytes"] / entry["seconds"])


@pytest.mark.slow
def test_a_probe_whose_peer_never_comes_says_why_in_one_json_line_and_exits_3():
    alone = _probe(1, _free_port(), "--timeout", "1")
    output, _ = alone.communicate(timeout=120)
    assert alone.returncode == 3
    report = json.loads(output.strip().splitlines()[-1])
    assert report["rank"] == 1 and report["error"].startswith("DistNetworkError: ")


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--sizes", "6"], "multiple of 4"), (["--rank", "2"], "--rank must be below --world-size")],
)
def test_bad_probe_flags_exit_2_before_torch_is_loaded(flags, message):
    argv = ["--rank", "0", "--master-addr", "127.0.0.1", "--master-port", "1", *flags]
    answer = subprocess.run(
        [sys.executable, "-m", "trainer.allreduce_probe", *argv],
        cwd=paths.REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert answer.returncode == 2 and message in answer.stderr
