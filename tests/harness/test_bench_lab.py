"""The harness on the real lab: bench.all over SSH, retries from checkpoints, Ctrl-C, cluster.reset.

Needs root; uses the session lab (tests/conftest.py `lab`) provisioned by `ansible-playbook site.yml`
(fixture `harness_lab` below) and the trainer pushed with `invoke trainer.deploy`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dtlab import paths, platforms, provision, remote
from dtlab.lab import inventory as lab_inventory
from dtlab.report import build_report
from dtlab.report.aggregate import whole_run_phases
from dtlab.results import ResultStore
from dtlab.waiting import wait_until
from trainer.energy import rapl_packages
from trainer.launchers._spark import CONNECT_LABEL, STANDALONE_LABEL

pytestmark = [pytest.mark.lab, pytest.mark.slow]

INVOKE = str(Path(sys.executable).parent / "invoke")
# The repository's smoke profile has every platform of the registry at 1 and 2 workers. The tests run its
# 2-worker cells, where the platforms differ (placement, rendezvous, the all-reduce between nodes): the
# 1-worker cells add six platform start-ups and no path the 2-worker cells do not take. The README's
# command 1 runs all twelve.
SMOKE_ONLY = "g2"
SMOKE_KEYS = {f"{name}-g2-e2-s0" for name in platforms.NAMES}


def invoke(*args, env, timeout=1200):
    return subprocess.run(
        [INVOKE, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )


def cell_units(cluster) -> dict[str, list[str]]:
    return {node.name: remote.running_units(node) for node in cluster.nodes}


# A launcher's process, or Ray's training actors: under Ray the core runs in them, not in a process of
# trainer.launchers (only the driver is one).
TRAINER_PATTERN = "trainer[.]launchers|ray::(RayTrainWorker|TrainController)"
RAY_SETTLE_S = 30  # Ray ends a job's actors shortly after its driver, not at once


def running_trainers(nodes) -> dict[str, str]:
    """Trainer processes on each of `nodes` now (pgrep only looks; nothing is killed by name)."""
    answers = remote.run_all(nodes, f"pgrep -a -f '{TRAINER_PATTERN}' || true")
    return {name: answer.stdout.strip() for name, answer in answers.items() if answer.stdout.strip()}


def trainer_processes(cluster) -> dict[str, str]:
    """Trainer processes left on each node once Ray has had RAY_SETTLE_S to end its actors."""
    return wait_until(lambda: running_trainers(cluster.nodes), timeout_s=RAY_SETTLE_S, every_s=1,
                      until=lambda found: not found)


@pytest.mark.core  # the default tier's proof that every platform trains, to the same numbers
def test_smoke_matrix_completes_every_cell_and_a_second_run_runs_nothing(harness_lab):
    cluster, env = harness_lab
    first = invoke("bench.all", "-i", str(cluster.inventory_path), "--profile", "smoke", "--only", SMOKE_ONLY,
                   env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    store = ResultStore.for_cluster(cluster.name)
    ok = {run.cell_key: run for run in store.runs(status="ok")}
    assert set(ok) >= SMOKE_KEYS
    labels = {key: run.result["framework_label"] for key, run in ok.items()}
    assert labels["determined-g2-e2-s0"] == "determined (Core API, off-cluster)"
    assert labels["spark-g2-e2-s0"].startswith("spark") and labels["ddp-g2-e2-s0"].startswith("ddp")
    assert labels["ray-g2-e2-s0"] == "ray (Ray Train, TorchTrainer)"
    assert labels["slurm-g2-e2-s0"] == "slurm (sbatch + srun torchrun)"
    assert {run.result["device"] for run in ok.values()} == {"cpu"}  # the report labels them CPU
    assert ok["ddp-g2-e2-s0"].result["world_size"] == 2 and ok["ddp-g2-e2-s0"].result["nodes"] == 2
    assert ok["spark-g2-e2-s0"].result["world_size"] == 2
    # Ray places its two workers on the two worker nodes: one CPU slot each, none on the head.
    assert ok["ray-g2-e2-s0"].result["world_size"] == 2 and ok["ray-g2-e2-s0"].result["nodes"] == 2
    # Slurm ran one torchrun a node on dtlab's placement; each node's task log came back to the attempt
    # folder beside the driver's, which followed the step live; the queue is its own phase.
    slurm = ok["slurm-g2-e2-s0"]
    assert slurm.result["world_size"] == 2 and slurm.result["nodes"] == 2
    assert all((slurm.log_dir / f"{node.name}.log").stat().st_size > 0 for node in cluster.workers)
    assert "epoch 2/2" in (slurm.log_dir / f"{slurm.result['hostnames'][0]}.log").read_text()
    driver_log = (slurm.log_dir / f"{cluster.master.name}.log").read_text()
    assert re.search(r"slurm: job \d+ RUNNING after [\d.]+ s in the queue", driver_log), driver_log[-2000:]
    assert "epoch 2/2" in driver_log, driver_log[-2000:]
    assert re.search(r"slurm: job \d+ COMPLETED", driver_log), driver_log[-2000:]
    assert 0 <= dict(whole_run_phases(slurm.result))["of which queued"] < 10
    # Every framework and world size really learns the generated signal (chance is 0.50).
    assert {key: run.result["final_accuracy"] >= 0.8 for key, run in ok.items()} == dict.fromkeys(ok, True)
    for key, run in ok.items():  # each run's logs came back, the epochs in them
        assert any("epoch 2/2" in log.read_text(errors="replace") for log in run.log_dir.glob("*.log")), key
    assert "report:" in first.stdout  # bench.all ends with the report
    # The health gate passed before the first cell; its file lies beside the results, and the report
    # shows it with the all-reduce between the two workers.
    assert "health gate passed: " in first.stdout
    gate = json.loads(sorted((store.root / paths.GATE_DIRNAME).glob("gate-*.json"))[-1].read_text())
    assert gate["status"] == "healthy" and gate["matrix"]["profile"] == "smoke" and gate["rechecks"] == []
    report = build_report(store)
    section = report.gate
    assert [row[-1].text for row in section.table.rows] == ["ok"], section.table.rows
    # Every platform's MFU against rank 0's measured GEMM rate; the lab's energy not measured, and why
    # (its nodes see this machine's sysfs: RAPL where the kernel here exposes it, never a GPU).
    [b14] = [table for table in report.extra_tables if table.number == "B.14"]
    assert all("%" in row[4].text and row[5].text.startswith("measured: fp32 GEMM") for row in b14.rows)
    energy = [row[7].text for row in b14.rows]
    if not rapl_packages():
        assert all(e.startswith("not measured: no GPU on this rank (NVML); no RAPL") for e in energy), energy
    if not store.runs(status="failed"):  # successful cells print no error tracebacks (the logs keep them)
        assert "Traceback" not in first.stdout and "Failed to recv" not in first.stdout, first.stdout[-3000:]
    # The whole-run clock: every phase from the controller's submit to the recorded result, in order.
    for key, run in ok.items():
        phases = dict(whole_run_phases(run.result))
        assert phases and min(phases.values()) >= 0, (key, phases)
        assert phases["end to end"] >= run.result["time_total_s"], (key, phases)
    # The platforms differ only in orchestration: the same cell trains to the same numbers under each.
    # Horovod's Gloo ring averages the gradients DDP's all-reduce averages, on two nodes as on one.
    trajectories = {name: _trajectory(ok[f"{name}-g2-e2-s0"]) for name in platforms.NAMES}
    assert all(trajectory == trajectories["ddp"] for trajectory in trajectories.values()), trajectories
    horovod = ok["horovod-g2-e2-s0"]
    assert (horovod.result["world_size"], horovod.result["nodes"]) == (2, 2)
    assert horovod.result["hostnames"] == [node.name for node in cluster.workers]  # dtlab's placement order
    assert "epoch 2/2" in (horovod.log_dir / f"{cluster.master.name}.log").read_text(), "horovodrun's output"

    rows_before = len(store.runs(status=None))
    started = time.monotonic()
    second = invoke("bench.all", "-i", str(cluster.inventory_path), "--profile", "smoke",
                    "--only", SMOKE_ONLY, "--no-report", env=env)
    assert second.returncode == 0, second.stderr
    assert f"0 ran ok, {len(SMOKE_KEYS)} already recorded, 0 failed" in second.stdout
    assert len(store.runs(status=None)) == rows_before
    assert time.monotonic() - started < 60


def test_the_same_cell_again_without_the_token_cache_trains_to_the_same_numbers(harness_lab):
    """Reproducible: the smoke test's ddp cell again, every node's token cache removed first."""
    cluster, env = harness_lab
    store = ResultStore.for_cluster(cluster.name)
    [first] = [run for run in store.runs(status="ok", cell_key="ddp-g2-e2-s0") if run.attempt == 1] or [None]
    assert first is not None, "needs the smoke test's ddp cell recorded (it runs first in this file)"
    cache_dir = f"{cluster.data_dir}/token-cache"
    remote.run_all(cluster.nodes, f"rm -rf {cache_dir}")
    again = invoke("bench.all", "-i", str(cluster.inventory_path), "--only", "ddp-g2", "--force",
                   "--no-report", env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    rerun = max((run for run in store.runs(status="ok") if run.cell_key == "ddp-g2-e2-s0"),
                key=lambda run: run.attempt)
    assert rerun.attempt > first.attempt
    assert _trajectory(rerun) == _trajectory(first)


def test_spark_and_ray_train_through_their_own_etl_to_the_dataloaders_numbers(harness_lab):
    """The pipeline profile's first seed (issue #53): each platform's own ETL (Spark's DataFrame, Ray Data)
    beside its DataLoader run, the same tokens, the same per-epoch numbers, timed on one clock, in B.13."""
    cluster, env = harness_lab
    done = invoke("bench.all", "-i", str(cluster.inventory_path), "--profile", "pipeline", "--only", "s1",
                  env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    store = ResultStore.for_cluster(cluster.name)
    ok = {run.cell_key: run for run in store.runs(status="ok") if run.cell.profile == "pipeline"}
    for name in ("spark", "ray"):
        loader, etl = ok[f"{name}-g2-e1-s1"], ok[f"{name}-g2-e1-s1-etl"]
        assert etl.result["config"]["data_path"] == "platform" and etl.cell.data_path == "platform"
        assert etl.result["framework_label"].endswith(" + platform ETL")
        if name == "spark":  # the lab runs Spark cells as Connect sessions: the ETL ran on the server
            assert etl.result["framework_label"].startswith(CONNECT_LABEL), etl.result["framework_label"]
        assert etl.result["data_fingerprint"] == loader.result["data_fingerprint"], name  # the same tokens
        assert _trajectory(etl) == _trajectory(loader), name
        marks = etl.result["timeline_unix"]
        assert marks["etl_started"] < marks["etl_ended"] <= marks["data_started"] < marks["data_ready"], marks
        assert (etl.result["world_size"], etl.result["nodes"]) == (2, 2)
    # The raw reviews stay staged on the shared disk for the next cells; each run's ETL rows are gone.
    shared = f"{cluster.var('dtlab_shared_checkpoint_dir')}/platform-data"
    listing = remote.run(cluster.master, f"ls {shared}").stdout.split()
    assert any(name.startswith("reviews-") for name in listing) and not [n for n in listing if "etl" in n]
    b13 = next(t for t in build_report(store, profile="pipeline").extra_tables if t.number == "B.13")
    assert len(b13.rows) == 4 and all("no spread" in row[12].text for row in b13.rows if "DataLoader" not in
                                      row[3].text)


def _first_seed_of(harness_lab, profile: str) -> tuple:
    """bench.all --profile PROFILE --only s1 on the lab: (the cluster, its store, {cell key: ok result})."""
    cluster, env = harness_lab
    done = invoke("bench.all", "-i", str(cluster.inventory_path), "--profile", profile, "--only", "s1",
                  env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    store = ResultStore.for_cluster(cluster.name)
    return cluster, store, {run.cell_key: run.result for run in store.runs(status="ok")
                            if run.cell.profile == profile}


def test_the_tune_profile_searches_four_ways_and_the_sweeps_agree_epoch_for_epoch(harness_lab):
    """The tune profile's first seed (#54): the plain sweep, dtlab's ASHA sweep, Ray Tune on the lab's Ray
    cluster and Determined's searcher stand-in each run the one drawn plan to a search.json in the store;
    the sweeps train the same trials on the same workers, so ASHA's epochs are the plain sweep's, and the
    stand-in (the same rule) stops the very trials dtlab's ASHA sweep stops. Table B.16 sets them side by
    side."""
    _, store, ok = _first_seed_of(harness_lab, "tune")
    plain, asha = ok["ddp-g2-e2-s1-search-none"], ok["ddp-g2-e2-s1-search-asha"]
    tune, stand_in = ok["ray-g2-e2-s1-search-asha"], ok["determined-g2-e2-s1-search-asha"]
    for result in (plain, asha, tune, stand_in):
        assert result["counts"]["started"] == 4 and result["counts"]["failed"] == 0, result["counts"]
        assert result["best"] is not None and result["wall_s"] > 0, result["way"]
    assert plain["counts"]["stopped_early"] == 0 and all(len(t["epochs"]) == 2 for t in plain["trials"])
    assert asha["counts"]["stopped_early"] >= 1 and tune["counts"]["stopped_early"] >= 1

    def accuracies(result):
        return [[epoch["val_accuracy"] for epoch in trial["epochs"]] for trial in result["trials"]]

    for trial, (full, stopped) in enumerate(zip(accuracies(plain), accuracies(asha), strict=True)):
        assert stopped == full[:len(stopped)], trial  # the same trial, the same digits, as far as it went
    assert accuracies(stand_in) == accuracies(asha)
    assert stand_in["label"].startswith("determined searcher stand-in")
    assert stand_in["determined_searcher"]["name"] == "adaptive_asha"  # the config a master would run
    assert (tune["way"], tune["slots"], tune["workers_per_trial"]) == ("ray-tune", 2, 1)
    b16 = next(t for t in build_report(store).extra_tables if t.number == "B.16")
    assert len(b16.rows) == 4 and all("no spread" in row[6].text for row in b16.rows[1:])


def test_the_serve_profile_serves_one_checkpoint_two_ways_and_every_answer_is_the_trainers(harness_lab):
    """The serve profile's first seed (#54): a 2-worker DDP run, then its checkpoint served by a plain
    FastAPI server on each worker and by Ray Serve's replicas, each load-tested from the controller at
    1, 8 and 32 at once against the workers' addresses. Every answer is the trainer's own, whose
    accuracy is the one the run recorded; Table B.17 sets the ways side by side."""
    cluster, store, ok = _first_seed_of(harness_lab, "serve")
    trained, plain, ray = ok["ddp-g2-e2-s1"], ok["ddp-g2-e2-s1-serve"], ok["ray-g2-e2-s1-serve"]
    workers = {node.address for node in cluster.workers}
    for served in (plain, ray):
        assert served["serves"] == "ddp-g2-e2-s1" and served["epoch"] == 2, served["label"]
        assert served["accuracy"] == trained["epoch_metrics"][-1]["val_accuracy"]  # the run's own evaluation
        assert [level["concurrency"] for level in served["levels"]] == [1, 8, 32]
        for level in served["levels"]:
            assert level["errors"] == 0 and level["mismatches"] == 0 and level["throughput_rps"] > 0, level
        assert {url.split("/")[2].split(":")[0] for url in served["urls"]} == workers
    assert plain["checkpoint"] == ray["checkpoint"] and (plain["replicas"], ray["replicas"]) == (2, 2)
    b17 = next(t for t in build_report(store).extra_tables if t.number == "B.17")
    assert len(b17.rows) == 6 and all(row[9].text.startswith("0 / 0 of ") for row in b17.rows)


def _trajectory(run) -> list[tuple]:
    """Per-epoch train loss, validation loss and accuracy: every printed digit."""
    return [(m["train_loss"], m["val_loss"], m["val_accuracy"]) for m in run.result["epoch_metrics"]]


FRAMEWORKS = platforms.NAMES


def assert_recovered_to_the_undisturbed_numbers(store, cluster, framework):
    """The newest faulted run of `framework`'s 2-worker smoke cell: killed on the last worker after epoch 1,
    noticed within a minute, recovered, and trained to the very numbers of its undisturbed twin."""
    twins = {run.cell_key: run for run in store.runs(status="ok")}
    hit = cluster.workers[-1].name  # the plan names no node: the last worker each cell runs on
    key = f"{framework}-g2-e2-s0-kill-after1"
    run = max((r for r in store.runs(status=None) if r.cell_key == key), key=lambda r: r.id)
    record = run.fault_record
    assert run.status == "ok" and record["outcome"] == "recovered", (key, run.reason, record)
    assert record["node"] == hit and record["injection"].startswith("kill -9 of trainer PID(s)"), record
    assert record["checkpointed_epoch"] == 1 and record["injected_in_attempt"] >= 1
    assert 0 < record["detected_s"] < DETECTED_WITHIN_S and record["training_again_s"] > 0, record
    assert record["epochs_redone"] == 1 - run.result["resumed_from_epoch"] and record["total_s"] > 0
    # Whatever recovered it, from a checkpoint or from the start: the very numbers of the undisturbed run.
    assert _trajectory(run) == _trajectory(twins[f"{framework}-g2-e2-s0"]), key
    if framework == "ray":  # Ray's FailureConfig restarted its worker group inside the one attempt
        assert record["attempts"] == 1 and record["detected_by"] == "the platform (restarted it)"
    else:  # dtlab's retry; Spark's from the newest checkpoint, on whichever worker holds it
        assert record["attempts"] == 2 and record["detected_by"] == "dtlab (attempt failed)"
        assert run.result["resumed_from_epoch"] == 1, key


@pytest.mark.core  # the default tier's fault path: one platform; the next test runs them all
def test_a_killed_ddp_worker_resumes_from_its_checkpoint_to_the_undisturbed_numbers(harness_lab):
    cluster, env = harness_lab
    store = ResultStore.for_cluster(cluster.name)
    done = invoke("bench.faults", "-i", str(cluster.inventory_path), "--only", "ddp", "--no-report", env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert not any(cell_units(cluster).values()) and trainer_processes(cluster) == {}
    assert_recovered_to_the_undisturbed_numbers(store, cluster, "ddp")


def test_bench_faults_kills_a_worker_of_every_platform_and_reports_what_recovering_cost(harness_lab):
    """The README's `invoke bench.faults` on the repository's faults profile. After the smoke test the
    undisturbed twins are recorded (same options), so only the faulted cells run here, one per platform."""
    cluster, env = harness_lab
    store = ResultStore.for_cluster(cluster.name)
    before = {(r.cell_key, r.attempt, r.status, r.recorded_at) for r in store.runs(status=None)}
    done = invoke("bench.faults", "-i", str(cluster.inventory_path), env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert before <= {(r.cell_key, r.attempt, r.status, r.recorded_at) for r in store.runs(status=None)}
    assert not any(cell_units(cluster).values()) and trainer_processes(cluster) == {}
    for framework in FRAMEWORKS:
        assert_recovered_to_the_undisturbed_numbers(store, cluster, framework)
    # Spark's retry ran as a session on the lab's Connect server, as its undisturbed twin did.
    spark = max(store.runs(status="ok", cell_key="spark-g2-e2-s0-kill-after1"), key=lambda run: run.id)
    assert spark.result["framework_label"].startswith(CONNECT_LABEL), spark.result["framework_label"]
    # The checkpoints are on the shared mount (the lab's bind, as NFS on a cluster): every worker sees them.
    shared = cluster.shared_checkpoint_dir
    seen = remote.run_all(cluster.workers, f"ls {shared}/spark-g2-e2-s0-kill-after1/checkpoints")
    assert {name: answer.stdout.split() for name, answer in seen.items()} == dict.fromkeys(
        (node.name for node in cluster.workers), ["epoch-0001", "epoch-0002"]), seen
    rows = _fault_rows(store)  # the report's fault table: every platform, each beside its twin
    assert set(rows) == set(FRAMEWORKS) and all("identical" in row for row in rows.values()), rows
    assert "a stand-in for the Determined master's trial restart" in rows["determined"]
    assert "report:" in done.stdout  # bench.faults ends with the report


def test_elastic_torchrun_horovod_and_ray_go_on_alone_when_a_workers_node_is_lost(harness_lab):
    """The elastic profile (#55), after epoch 1: ddp's cell unit (torchrun's agent with its trainer) on the
    last worker SIGKILLed, Horovod's rank there by its PID, and Ray's raylet on the last worker running a
    rank, held stopped. torchrun's first agent meets the rendezvous again alone; Horovod Elastic
    blacklists the lost host and resets rank 0; Ray Train starts its group again on the one raylet left.
    Each ends the run on 1 worker from epoch 1's checkpoint, in the one attempt: no dtlab retry. The raylet
    is back after the cell."""
    cluster, env = harness_lab
    store = ResultStore.for_cluster(cluster.name)
    done = invoke("bench.faults", "-i", str(cluster.inventory_path), "--profile", "elastic", "--no-report",
                  env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert not any(cell_units(cluster).values()) and trainer_processes(cluster) == {}
    raylet = platforms.get("ray").lost_node_service(cluster)
    injected = {"ddp": "SIGKILL to every process of", "horovod": "kill -9 of trainer PID(s)",
                "ray": f"SIGKILL to every process of {raylet}, held stopped"}
    for framework, injection in injected.items():
        key = f"{framework}-g2-e2-s0-elastic-kill-after1"
        run = max((r for r in store.runs(status=None) if r.cell_key == key), key=lambda r: r.id)
        record = run.fault_record
        assert run.status == "ok" and record["outcome"] == "recovered", (key, run.reason, record)
        lost = [cluster.workers[-1].name] if framework != "ray" else [node.name for node in cluster.workers]
        assert record["node"] in lost and record["injection"].startswith(injection), record
        assert record["attempts"] == 1 and record["detected_by"] == "the platform (restarted it)", record
        assert record["final_world_size"] == 1 == run.result["world_size"], key
        assert run.result["resumed_from_epoch"] == 1, key
        assert [m["epoch"] for m in run.result["epoch_metrics"]] == [1, 2], key
    states = remote.run_all(cluster.workers, f"systemctl is-active {raylet}", timeout=10)
    assert {name: answer.stdout.strip() for name, answer in states.items()} == dict.fromkeys(
        (node.name for node in cluster.workers), "active"), states
    rows = [" | ".join(value.text for value in row) for row in build_report(store).faults.table.rows]
    elastic = [row for row in rows if "(the node lost; elastic)" in row]
    assert len(elastic) == 3 and all(" | 1 of 2 | " in row for row in elastic), rows


# The seeds' techniques (#55) on the lab, each on ddp and Horovod: the profile, its cells (--only), and what
# the report's label adds for it. Their equivalence and tolerance tests are the trainer's (loopback).
TECHNIQUE_PROFILES = {
    "accumulation": ("ddp-s1,horovod-s1", " + 2-step gradient accumulation"),
    "compression": ("ddp-s1,horovod-s1", " + fp16 gradient compression"),
    "profiled": ("ddp,horovod", " + step profile"),  # ddp's cells: every strategy's too
}


def test_accumulation_compression_and_the_step_profile_run_on_ddp_and_horovod(harness_lab):
    cluster, env = harness_lab
    store = ResultStore.for_cluster(cluster.name)
    for profile, (only, label) in TECHNIQUE_PROFILES.items():
        done = invoke("bench.all", "-i", str(cluster.inventory_path), "--profile", profile, "--only", only,
                      "--force", "--no-report", env=env)
        assert done.returncode == 0, (profile, done.stdout[-3000:] + done.stderr[-2000:])
        ran = {run.cell_key: run for run in store.runs(status="ok") if run.cell.profile == profile}
        assert {run.cell.framework for run in ran.values()} == {"ddp", "horovod"}, (profile, sorted(ran))
        for key, run in ran.items():
            assert run.result["framework_label"].endswith(label), (key, run.result["framework_label"])
            assert run.result["world_size"] == 2, key
            if profile == "accumulation":
                assert run.result["config"]["grad_accum_steps"] == 2, key
            if profile == "compression":
                sent = run.result["gradient_sync"]
                assert sent["compression"] == "fp16" and sent["bytes_per_step"] > 0, (key, sent)
            if profile == "profiled":  # every rank's profile of the same 4 steady steps
                step_profile = run.result["step_profile"]
                assert step_profile["steps"] == 4 and len(step_profile["ranks"]) == 2, key
                assert all(rank for rank in step_profile["ranks"]), key
        if profile == "compression":  # 2 bytes per trainable gradient on both: DDP's hook and Horovod's
            sent = {run.cell.framework: run.result["gradient_sync"]["bytes_per_step"] for run in ran.values()}
            assert sent["ddp"] == sent["horovod"], sent
    tables = build_report(store, profile="profiled").extra_tables
    table, = (table for table in tables if table.number == "B.15")
    platforms_shown = {row[0].text for row in table.rows}
    assert platforms_shown == {platforms.label("ddp"), platforms.label("horovod")}, platforms_shown

def _fault_rows(store) -> dict[str, str]:
    """The report's fault table (B.5), one text per framework."""
    section = build_report(store).faults
    return {row[1].text.split("-")[0]: " | ".join(value.text for value in row) for row in section.table.rows}


@pytest.mark.parametrize("only", ["ddp-g2", "slurm-g2", "ray-g2"])
def test_sigint_to_bench_all_leaves_no_trainer_on_any_node(harness_lab, only):
    cluster, env = harness_lab
    store = ResultStore.for_cluster(cluster.name)
    ok_before = {(r.cell_key, r.attempt) for r in store.runs(status="ok")}
    process = subprocess.Popen(
        [
            INVOKE,
            "bench.all",
            "-i",
            str(cluster.inventory_path),
            "--only",
            only,
            "--force",
            "--no-report",
        ],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(cell_units(cluster).values()):
            time.sleep(0.5)
        assert any(cell_units(cluster).values()), "the cell never started"
        # The platform's trainers run on the workers (Ray's actors, Slurm's tasks start after the driver).
        started = wait_until(lambda: running_trainers(cluster.workers), timeout_s=120, every_s=0.5)
        assert started, "no trainer started on the workers"
        time.sleep(1)
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output[-2000:]
    assert "interrupted" in output
    assert "Traceback" not in output, "Ctrl-C is one line, not the stopped workers' tracebacks"
    assert not any(cell_units(cluster).values())
    assert trainer_processes(cluster) == {}
    # Slurm's job was cancelled, not left to run on: nothing of dtlab's in the queue.
    assert remote.run(cluster.master, f"squeue -h -u {cluster.user}").stdout.strip() == ""
    assert ok_before <= {(r.cell_key, r.attempt) for r in store.runs(status="ok")}


def test_a_stuck_cell_and_a_drained_slurm_node_are_cleared_by_cluster_reset(harness_lab):
    from dtlab import launch, matrix

    cluster, env = harness_lab
    # Slurm keeps a drained node out of every job until resumed: a slurm cell is refused in preflight.
    drained = cluster.workers[-1].name
    assert remote.run(cluster.master, f"scontrol update nodename={drained} state=drain reason=dtlab-test").ok
    refused = invoke("bench.all", "-i", str(cluster.inventory_path), "--only", "slurm-g2", "--force",
                     "--no-report", "--skip-gate", env=env, timeout=300)  # past the gate: to preflight
    assert refused.returncode != 0
    assert f"preflight: Slurm partition {cluster.var('slurm_partition')} on {cluster.master.name}: " \
           f"{drained} is drain" in refused.stdout + refused.stderr, refused.stdout[-2000:] + refused.stderr
    # Stuck for real: rank 0 of a 2-node DDP cell whose second node never starts waits in rendezvous.
    cell = next(c for c in matrix.load("smoke") if c.key == "ddp-g2-e2-s0")
    planned = platforms.get(cell.framework).build(cluster, cell, attempt=99, timeout_s=3600)
    node, spec = planned.jobs[0]
    assert remote.run(node, launch.prepare_command(planned, cluster.user, fresh=True)).ok
    start = remote.unit_script(spec).replace(" --wait", "")  # detached: nobody follows it
    remote.run(node, start.split("& waiter")[0], timeout=30)
    time.sleep(5)
    assert remote.running_units(node) == [spec.unit + ".service"]

    head_unit = f"{cluster.require('ray_head_service')}.service"
    head_started = f"systemctl show -p ActiveEnterTimestampMonotonic --value {head_unit}"
    before = int(remote.run(cluster.master, head_started).stdout.strip())
    # A wide console: rich folds a table cell at the width it has, and that width moves with the columns.
    reset = invoke("cluster.reset", "-i", str(cluster.inventory_path), env={**env, "COLUMNS": "250"},
                   timeout=600)
    assert reset.returncode == 0, reset.stdout[-3000:] + reset.stderr
    assert "all checks passed" in reset.stdout
    # Ray was restarted (its jobs ended with it) and its workers rejoined before the closing check.
    assert int(remote.run(cluster.master, head_started).stdout.strip()) > before
    ray_step = f"{platforms.NAMES.index('ray') + 2}/{len(platforms.ALL) + 3} Ray: stop its jobs"
    assert ray_step in reset.stdout and "no Ray job running" in reset.stdout
    assert f"resumed {drained}" in reset.stdout
    assert platforms.slurm.node_states(cluster)[drained] == "idle"
    assert "dtlab-ray-head active; 2/2 worker nodes alive" in reset.stdout  # the table's row
    assert not any(cell_units(cluster).values()) and trainer_processes(cluster) == {}
    again = invoke("cluster.reset", "-i", str(cluster.inventory_path), env={**env, "COLUMNS": "250"},
                   timeout=600)
    assert again.returncode == 0, again.stdout[-2000:]  # safe twice in a row
    # The reset ends with cluster.check's table (no separate check run needed to see the cluster healthy).
    assert "all checks passed" in again.stdout
    assert "spark master" in again.stdout and "slurm controller" in again.stdout


def test_ray_and_spark_cells_are_refused_in_preflight_at_once_when_a_worker_daemon_is_stopped(harness_lab):
    cluster, env = harness_lab
    store = ResultStore.for_cluster(cluster.name)
    before = {(r.cell_key, r.attempt, r.status, r.recorded_at) for r in store.runs(status=None)}
    ray_unit = str(cluster.require("ray_worker_service"))
    spark_unit = str(cluster.require("spark_worker_service"))
    gone = cluster.workers[-1]
    assert remote.run(gone, f"systemctl stop {ray_unit}.service {spark_unit}.service").ok
    try:
        # The health gate sees the stopped workers first: one line per failed check, nothing recorded.
        gated = invoke("bench.all", "-i", str(cluster.inventory_path), "--only", "ray-g2", "--force",
                       "--no-report", env=env, timeout=600)
        started = time.monotonic()
        refused = invoke("bench.all", "-i", str(cluster.inventory_path), "--only", "ray-g2,spark-g2",
                         "--force", "--no-report", "--skip-gate", env=env, timeout=600)
        refused_after_s = time.monotonic() - started
    finally:
        assert remote.run(gone, f"systemctl start {ray_unit}.service {spark_unit}.service").ok
        assert platforms.ray.wait_for_workers(cluster, len(cluster.workers), 120) == len(cluster.workers)
        assert platforms.spark.wait_for_workers(cluster, len(cluster.workers), 120) == len(cluster.workers)
    assert gated.returncode == 1 and gated.stderr.startswith("error: health gate: "), gated.stderr
    assert f"error: health gate: {gone.name}: ray worker: {ray_unit} inactive" in gated.stderr.splitlines()
    assert refused.returncode != 0
    master = cluster.master.name
    reasons = {
        "ray-g2-e2-s0": f"preflight: Ray head {master} has 1 alive worker nodes, the cell needs 2 "
                        f"({gone.name}: {ray_unit} inactive)",
        "spark-g2-e2-s0": f"preflight: Spark master {master} has 1 alive workers, the cell needs 2 "
                          f"({gone.name}: {spark_unit} inactive)",
    }
    for cell_key, reason in reasons.items():
        assert reason in refused.stdout + refused.stderr, refused.stdout[-2000:] + refused.stderr
        # Refused before anything started: the attempt is recorded as failed with that reason.
        [failed] = [r for r in store.runs(status="failed", cell_key=cell_key)
                    if (r.cell_key, r.attempt, r.status, r.recorded_at) not in before]
        assert reason in (failed.reason or "")
    # A stopped unit's daemon never rejoins by itself: neither preflight waited out its rejoin time.
    assert refused_after_s < platforms.ray.JOIN_WAIT_S, refused_after_s
    # No unit ran, and nothing recorded before is lost.
    assert not any(cell_units(cluster).values())
    assert before <= {(r.cell_key, r.attempt, r.status, r.recorded_at) for r in store.runs(status=None)}


def test_spark_cells_run_on_the_connect_server_and_as_their_own_application_where_asked(harness_lab):
    """Issues #29 and #50, Spark at its best: the lab runs each spark cell as a session on the master's
    Spark Connect server (group_vars/lab.yml). cluster.check sees it hold the largest cell's cores, a
    worker's loss is survived, and cluster.reset restarts it. Converged to spark_session: application (the
    study's setup) the server is removed and a cell runs as its own application, to the same numbers;
    converged back, the server holds its cores again."""
    cluster, env = harness_lab
    assert platforms.spark.connect_session(cluster)  # the lab's own setting, not a variant's
    unit = str(cluster.require("spark_connect_service"))
    store = ResultStore.for_cluster(cluster.name)
    inventory = str(cluster.inventory_path)
    assert remote.unit_state(cluster.master, unit, timeout=30) == "active"
    needs = f"{unit} active; 2 cores granted, the largest cell needs 2"
    checked = invoke("cluster.check", "-i", inventory, env=env, timeout=300)
    assert checked.returncode == 0 and needs in " ".join(checked.stdout.replace("│", " ").split()), (
        checked.stdout[-3000:])
    # The smoke test's spark cell ran on the server: then nothing runs here. (A killed training process,
    # recovered by dtlab's retry on the same server: the faults test, test_bench_faults_kills_...)
    ran = invoke("bench.all", "-i", inventory, "--only", "spark-g2", "--no-report", "--skip-gate",
                 env=env, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    # A worker lost for a while (powered off and on): the server's executor there is lost and replaced.
    # The replacement must wait for a free core on that worker, never take one beside the survivor.
    import dtlab.lab

    dtlab.lab.restart_node(cluster.workers[-1].name, str(cluster.var("dtlab_lab_name")))
    after_loss = invoke("bench.all", "-i", inventory, "--only", "spark-g2", "--force", "--no-report",
                        "--skip-gate", env=env, timeout=600)
    assert after_loss.returncode == 0, after_loss.stdout[-3000:] + after_loss.stderr[-2000:]
    reset = invoke("cluster.reset", "-i", inventory, env=env, timeout=600)
    assert reset.returncode == 0 and "restart spark connect" not in reset.stdout, reset.stdout[-3000:]
    assert "then the Connect server where it runs" in reset.stdout  # its step ran, and nothing failed
    assert platforms.spark.wait_for_connect_cores(cluster, 2, 120) == 2  # its executors are back
    # The study's setup: converged to application, the server and its token file are gone.
    application_inventory = lab_inventory.variant(cluster.inventory_path, "application",
                                                  spark_session="application")
    try:
        converged = provision.converge(application_inventory, tags=["spark"])
        assert converged.ok, converged.summary()
        listed = remote.run(cluster.master, f"systemctl list-unit-files --plain --no-legend {unit}.service; "
                                            f"ls {cluster.var('spark_connect_env_file')} 2>&1 || true")
        assert unit not in listed.stdout and "No such file" in listed.stdout, listed.stdout
        standalone = invoke("bench.all", "-i", str(application_inventory), "--only", "spark-g2", "--force",
                            "--no-report", "--skip-gate", env=env, timeout=600)
        assert standalone.returncode == 0, standalone.stdout[-3000:] + standalone.stderr[-2000:]
    finally:
        back = provision.converge(cluster.inventory_path, tags=["spark"])
        application_inventory.unlink()
    assert back.ok, back.summary()
    assert remote.unit_state(cluster.master, unit, timeout=30) == "active"
    assert platforms.spark.wait_for_connect_cores(cluster, 2, 120) == 2
    spark_runs = sorted(store.runs(status="ok", cell_key="spark-g2-e2-s0"), key=lambda run: run.attempt)
    # The last three: on the server before the worker's loss and after it, then the application's.
    spark, after_loss_run, own_application = spark_runs[-3:]
    setups = [run.result["framework_label"].split(" + ")[0] for run in spark_runs[-3:]]
    assert setups == [CONNECT_LABEL, CONNECT_LABEL, STANDALONE_LABEL], setups
    assert spark.result["world_size"] == 2 and spark.result["nodes"] == 2
    # After the worker's loss still one rank per worker: each worker offers one process's cores. With a
    # second core to spare, the survivor took the replacement executor and both ranks ran there.
    assert after_loss_run.result["nodes"] == 2, after_loss_run.result["hostnames"]
    assert _trajectory(after_loss_run) == _trajectory(spark) == _trajectory(own_application)
    baseline = invoke("bench.all", "-i", inventory, "--only", "ddp-g2", "--no-report", "--skip-gate", env=env,
                      timeout=600)  # already recorded by the smoke test: nothing runs
    assert baseline.returncode == 0, baseline.stdout[-3000:]
    ddp = max(store.runs(status="ok", cell_key="ddp-g2-e2-s0"), key=lambda run: run.attempt)
    assert _trajectory(spark) == _trajectory(ddp)


def test_a_cell_over_its_timeout_is_stopped_by_systemd_and_recorded_as_timed_out(harness_lab):
    cluster, env = harness_lab
    answer = invoke(
        "bench.run",
        "ddp-g1-e2-s0",
        "-i",
        str(cluster.inventory_path),
        "--timeout",
        "6",
        "--retries",
        "0",
        env=env,
        timeout=300,
    )
    assert answer.returncode == 1, answer.stdout[-2000:]
    [failure] = ResultStore.for_cluster(cluster.name).runs(status="failed", cell_key="ddp-g1-e2-s0")[-1:]
    assert (
        failure.reason.startswith("timed out after 6 s on ")
        and failure.failed_node == cluster.workers[0].name
    )
    assert not any(cell_units(cluster).values()) and trainer_processes(cluster) == {}


# --- faults a user meets: each is noticed within a minute, and nothing recorded is lost ----------

DETECTED_WITHIN_S = 60


def _fault_matrix(tmp_path, framework: str, seed: int, fault: str | None = None) -> Path:
    """A matrix file with profile `fault`: one 2-worker, 4-epoch cell (and `fault:`, the YAML, if given)."""
    matrix_file = tmp_path / "matrix.yml"
    plan = f"    fault: {fault}\n" if fault else ""
    matrix_file.write_text(f"""\
profiles:
  fault:
    timeout_s: 900
    trainer: {{model: "generated:bert-tiny", dataset: generated, generated_train_size: 1024,
              generated_test_size: 128, generated_median_words: 40, max_length: 64, batch_size: 16,
              learning_rate: 5.0e-4, warmup_steps: 4}}
{plan}    runs: [{{frameworks: [{framework}], gpus: [2], epochs: [4], seeds: [{seed}]}}]
""")
    return matrix_file


def _fault_mid_cell(harness_lab, tmp_path, seed: int, inject, framework: str = "ddp") -> dict:
    """Run a 2-worker cell, call `inject(rank0, worker)` once epoch 1 is checkpointed; return what
    the harness did: the outcome, its attempts, its printed lines and when the fault was noticed.
    rank0 is the worker holding the checkpoint (Ray and Spark choose it; ddp: the first worker)."""
    from dtlab.bench import Bench, BenchOptions, Display

    cluster, _ = harness_lab
    matrix_file = _fault_matrix(tmp_path, framework, seed)
    store = ResultStore.for_cluster(cluster.name)
    before = {(r.cell_key, r.attempt, r.status, r.recorded_at) for r in store.runs(status=None)}
    lines: list[tuple[float, str]] = []

    class Recording(Display):
        def note(self, message: str) -> None:
            lines.append((time.monotonic(), message))
            super().note(message)

    bench = Bench(cluster, BenchOptions(profile="fault", matrix_path=matrix_file, force=True, retries=1),
                  display=Recording(1, verbose=False))
    selected = bench.load_matrix()
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(result=bench.run_matrix(selected)))
    runner.start()
    cell_key = f"{framework}-g2-e4-s{seed}"
    # On the shared checkpoint mount where the inventory has one (the lab does), else on each node.
    root = cluster.shared_checkpoint_dir or cluster.runs_dir
    checkpoint = f"{root}/{cell_key}/checkpoints/epoch-0001/checkpoint.pt"

    def checkpointed_on() -> list:
        answers = remote.run_all(cluster.workers, f"test -f {checkpoint}")
        return [node for node in cluster.workers if getattr(answers[node.name], "ok", False)]

    holders = wait_until(checkpointed_on, until=bool, timeout_s=400, every_s=1)
    assert holders, "epoch 1 never checkpointed"
    rank0 = holders[0]
    [worker] = [node for node in cluster.workers if node.name != rank0.name]
    injected_at = time.monotonic()
    inject(rank0, worker)
    failed_at = None
    while runner.is_alive() and time.monotonic() < injected_at + 900:
        runner.join(1)
        if failed_at is None and any(r.cell_key == cell_key and r.status == "failed"
                                     and (r.cell_key, r.attempt, r.status, r.recorded_at) not in before
                                     for r in store.runs(status="failed")):
            failed_at = time.monotonic()
    assert not runner.is_alive(), "the cell never ended"
    [result] = outcome["result"]
    attempts = [r for r in store.runs(status=None, cell_key=cell_key)
                if (r.cell_key, r.attempt, r.status, r.recorded_at) not in before]
    # Nothing recorded before was lost or changed, and no unit of the cell is left on any node.
    assert before <= {(r.cell_key, r.attempt, r.status, r.recorded_at) for r in store.runs(status=None)}
    assert not any(cell_units(cluster).values()), cell_units(cluster)
    return {"result": result, "attempts": attempts, "lines": lines, "injected_at": injected_at,
            "failed_at": failed_at}


def test_a_pattern_kill_on_a_worker_is_noticed_within_a_minute(harness_lab, tmp_path):
    def kill_everything_named_trainer(rank0, worker):
        # What `pkill -9 -f trainer.launchers` does, by PID: the trainer, torchrun, and the harness's
        # own follower shell on that node (whose command line names the launcher too).
        killed = remote.run(worker, "pids=$(pgrep -f 'trainer[.]launchers'); kill -9 $pids; echo $pids")
        assert killed.stdout.split(), killed

    seen = _fault_mid_cell(harness_lab, tmp_path, 21, kill_everything_named_trainer)
    assert seen["failed_at"] is not None and seen["failed_at"] - seen["injected_at"] < DETECTED_WITHIN_S
    assert [r.status for r in seen["attempts"]] == ["failed", "ok"], [r.reason for r in seen["attempts"]]
    assert seen["result"].result["resumed_from_epoch"] >= 1


def _fault_plan_cell(harness_lab, tmp_path, seed: int, fault: str) -> dict:
    """A 2-worker ddp cell under a fault plan (`fault`: the profile's fault: YAML), its twin left out;
    returns its newest run, every attempt of it and the lines the harness said."""
    from dtlab.bench import Bench, BenchOptions, Display

    cluster, _ = harness_lab
    matrix_file = _fault_matrix(tmp_path, "ddp", seed, fault)
    store = ResultStore.for_cluster(cluster.name)
    before = {(r.cell_key, r.attempt, r.status, r.recorded_at) for r in store.runs(status=None)}
    lines: list[str] = []

    class Recording(Display):
        def note(self, message: str) -> None:
            lines.append(message)
            super().note(message)

    bench = Bench(cluster, BenchOptions(profile="fault", matrix_path=matrix_file, force=True, retries=1),
                  display=Recording(1, verbose=False))
    loaded = bench.load_matrix()
    [faulted] = [cell for cell in loaded.cells if cell.fault]
    bench.run_matrix(dataclasses.replace(loaded, cells=(faulted,)))
    attempts = [r for r in store.runs(status=None, cell_key=faulted.key)
                if (r.cell_key, r.attempt, r.status, r.recorded_at) not in before]
    assert before <= {(r.cell_key, r.attempt, r.status, r.recorded_at) for r in store.runs(status=None)}
    assert not any(cell_units(cluster).values()), cell_units(cluster)
    return {"run": attempts[-1], "attempts": attempts, "lines": lines}


def test_a_worker_restarted_by_a_fault_plan_is_waited_for_and_the_retry_completes(harness_lab, tmp_path):
    seen = _fault_plan_cell(harness_lab, tmp_path, 22, "{kind: restart, after_epoch: 1}")
    run, record = seen["run"], seen["run"].fault_record
    assert record["injection"].endswith("powered off and on (lab.restart_node)"), record
    assert [r.status for r in seen["attempts"]] == ["failed", "ok"], [r.reason for r in seen["attempts"]]
    assert record["outcome"] == "recovered" and record["detected_s"] < DETECTED_WITHIN_S, record
    assert run.result["resumed_from_epoch"] >= 1
    assert record["epochs_redone"] == record["checkpointed_epoch"] - run.result["resumed_from_epoch"], record


def test_a_netdrop_is_said_live_and_never_recorded_as_a_timing(harness_lab, tmp_path):
    # Down longer than a silence takes to be noticed (at most 50 s: dtlab/bench/watch.py), with 15 s to spare.
    seen = _fault_plan_cell(harness_lab, tmp_path, 23, "{kind: netdrop, after_epoch: 1, seconds: 65}")
    record = seen["run"].fault_record
    assert "down for 65 s" in record["injection"], record
    said = [line for line in seen["lines"] if "has not answered" in line]
    noticed = record["failure_noticed_unix"] - record["injected_unix"]
    assert said and noticed < DETECTED_WITHIN_S, seen["lines"]
    [failed, *rest] = seen["attempts"]
    assert failed.status == "failed" and "network partition" in failed.reason
    # The stalled attempt is a failure, never a timing: the cell either completed after a retry
    # (resumed, so kept out of the tables) or stands recorded as failed with the reason.
    assert [r.status for r in rest] in (["ok"], ["failed"])
    if rest and rest[0].status == "ok":
        assert rest[0].result["resumed_from_epoch"] >= 1 and record["outcome"] == "recovered"
