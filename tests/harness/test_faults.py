"""Fault plans (dtlab.faults): which node a fault hits, the shell that hits it, and what a run's
record says it cost. The injection over SSH and the recoveries run on the lab (test_bench_lab.py)."""

import subprocess
import sys
import time

import pytest
from harness_helpers import CPU_CLUSTER_3, CPU_SITE_VARS, write_inventory

from dtlab import faults, launch, platforms
from dtlab.cell import Cell, Fault
from dtlab.errors import DtlabError
from dtlab.platforms import determined, load_cluster
from trainer import progress


@pytest.fixture
def cluster(tmp_path):
    # The controller's own venv as the nodes' one: the kill below checks /proc/PID/exe against it.
    site = CPU_SITE_VARS + f"dtlab_venv_dir: {sys.prefix}\n"
    return load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": site}))


CONFIG = {"output_dir": "/runs/out", "cache_dir": "/data/cache", "checkpoint_dir": "/runs/ck", "epochs": 3}


def faulted(framework="ddp", spec="kill-after1") -> Cell:
    return Cell(framework, 2, 3, 0, "faults", {}, fault=spec)


def test_a_fault_hits_the_cells_last_worker_unless_the_plan_names_one_it_runs_on(cluster):
    placed = launch.place(cluster, faulted()).nodes
    assert faults.target(cluster, faulted(), placed).name == placed[-1].name
    assert faults.target(cluster, faulted(spec=f"kill-after1-{placed[0].name}"), placed) == placed[0]
    with pytest.raises(DtlabError, match=r"node n0 is not among the workers the cell runs on \(n1, n2\)"):
        faults.target(cluster, faulted(spec="kill-after1-n0"), placed)


def test_the_poll_reads_rank_0s_checkpointed_epoch_and_the_ranks_running_on_the_node(tmp_path):
    output_dir = tmp_path / "out"

    def poll() -> tuple[int | None, int]:
        answer = subprocess.run(["bash", "-c", faults.poll_command(str(output_dir))], capture_output=True,
                                text=True, timeout=30)
        assert answer.returncode == 0, answer.stderr
        return faults.parse_poll(answer.stdout)

    assert poll() == (None, 0)  # before the attempt has written anything here
    progress.mark_rank(output_dir, 1)
    progress.mark_rank(output_dir, 2)
    assert poll() == (None, 2)  # ranks run here, rank 0 elsewhere
    (output_dir / progress.CHECKPOINTED_FILE).write_text("2\n")
    assert poll() == (2, 2)


def test_a_plan_without_a_node_hits_the_last_worker_where_the_platform_put_ranks(cluster):
    """Spark and Ray pick their workers: a 1-worker cell planned on n1 may run on n2."""
    _, n1, n2 = cluster.nodes
    watched, unnamed = (n1, n2), Fault("kill", 1)
    assert faults.hit_node(unnamed, n1, watched, {"n1": 0, "n2": 1}) == n2
    assert faults.hit_node(unnamed, n1, watched, {"n1": 2, "n2": 1}) == n2
    assert faults.hit_node(unnamed, n2, watched, {"n1": 1}) == n1
    assert faults.hit_node(unnamed, n1, watched, {}) == n1  # no rank seen: as planned
    assert faults.hit_node(Fault("kill", 1, node="n1"), n1, watched, {"n2": 1}) == n1  # named: kept


def test_the_kill_ends_the_trainer_processes_named_in_the_ranks_files_and_nothing_else(cluster, tmp_path):
    output_dir = tmp_path / "out"
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    bystander = subprocess.Popen(["sleep", "60"])  # not the venv's Python: left alone though listed
    try:
        progress.mark_rank(output_dir, 0)  # this test's own PID: replaced below by the trainer's
        (output_dir / progress.RANKS_DIR / "0.pid").write_text(f"{trainer.pid}\n")
        (output_dir / progress.RANKS_DIR / "1.pid").write_text(f"{bystander.pid}\n")
        command = faults.inject_command(cluster, Fault("kill", 1), str(output_dir), "unused")
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and done.stdout.strip() == f"kill -9 of trainer PID(s) {trainer.pid}"
        assert trainer.wait(timeout=10) == -9 and bystander.poll() is None
        again = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
        assert again.returncode == 3 and again.stdout.strip() == "no live trainer process"
    finally:
        for process in (trainer, bystander):
            process.kill()
            process.wait()


def test_a_netdrop_runs_from_a_unit_of_its_own_and_brings_the_interface_back(cluster):
    command = faults.inject_command(cluster, Fault("netdrop", 1, seconds=20), "/unused", "dtlab-x-fault")
    subprocess.run(["bash", "-n", "-c", command], check=True, timeout=10)  # well-formed shell
    assert "systemd-run --quiet --collect --unit=dtlab-x-fault sh -c" in command
    assert 'down; sleep 20; ip link set "$GLOO_SOCKET_IFNAME" up' in command
    assert command.startswith(". /etc/dtlab/veth9.env &&")


def _fired(cluster, cell, injected: float, checkpointed: int = 1) -> faults.FaultRun:
    recovery = platforms.get(cell.framework).recovery(cluster)
    run = faults.FaultRun(cluster, cell, recovery)
    run.record = faults.FaultRecord("kill-after1", "kill", "n2", 1, None, recovery,
                                    run_started_unix=injected - 30)
    run.record.injected_unix, run.record.injected_in_attempt = injected, 1
    run.record.checkpointed_epoch = checkpointed
    return run


def _result(process_started, training_started, first_step, resumed, recorded):
    return {"timeline_unix": {"process_started": process_started, "training_started": training_started,
                              "first_step_done": first_step},
            "resumed_from_epoch": resumed, "harness_timeline_unix": {"recorded": recorded}}


def test_a_run_recovered_by_dtlabs_retry_is_measured_from_the_failure_the_harness_noticed(cluster):
    now = time.time()
    run = _fired(cluster, faulted(), injected=now - 100)
    run.noticed_failure()  # the attempt's failure: the harness knows now
    first = run.finish(1, None)
    assert first["outcome"] == "failed" and first["detected_s"] is None  # measures come with the end
    record = run.finish(2, _result(now - 80, now - 79, now - 70, resumed=1, recorded=now))
    assert record["outcome"] == "recovered" and record["attempts"] == 2
    assert record["detected_by"] == "dtlab (attempt failed)" and 99 < record["detected_s"] < 101
    assert record["training_again_s"] == pytest.approx(30) and record["epochs_redone"] == 0
    assert record["total_s"] == pytest.approx(130) and record["recovered_by"] == platforms.DTLAB_RETRY


def test_a_run_the_platform_restarted_itself_is_detected_when_its_new_trainer_started(cluster):
    now = time.time()
    run = _fired(cluster, faulted("ray"), injected=now - 100, checkpointed=2)
    # Ray placed the new rank 0 in a process older than the fault: its training start tells.
    record = run.finish(1, _result(now - 200, now - 90, now - 85, resumed=0, recorded=now))
    assert record["detected_by"] == "the platform (restarted it)"
    assert record["detected_s"] == pytest.approx(10) and record["training_again_s"] == pytest.approx(15)
    assert record["epochs_redone"] == 2 and record["recovered_by"].startswith("Ray Train FailureConfig(")


def test_determined_off_cluster_says_dtlabs_retry_stands_in_for_the_master(cluster, tmp_path):
    assert platforms.get("determined").recovery(cluster).startswith(
        "the Determined master's trial restart (max_restarts: 1)")
    site = CPU_SITE_VARS + "determined_install_binaries: false\n"  # as on the lab
    off_cluster = load_cluster(write_inventory(tmp_path / "lab", CPU_CLUSTER_3, group_vars={"all": site}))
    assert platforms.get("determined").recovery(off_cluster) == (
        f"{platforms.DTLAB_RETRY}, a stand-in for the Determined master's trial restart")


def test_a_faulted_determined_cell_lets_the_master_restart_its_trial(cluster):
    undisturbed = determined.render_experiment(cluster, faulted("determined").undisturbed, CONFIG)
    assert undisturbed["max_restarts"] == 0  # a failure of an ordinary cell is the harness's to retry
    assert determined.render_experiment(cluster, faulted("determined"), CONFIG)["max_restarts"] == 1


def test_an_elastic_kill_takes_the_nodes_whole_cell_unit_and_the_survivors_go_on(cluster):
    """recovery elastic: the hit node's unit (torchrun's agent with its trainers) is SIGKILLed, as when the
    node is lost; ddp then runs torchrun's elastic rendezvous and tells the trainer to resume on fewer."""
    plan = Fault("kill", 1, recovery="elastic")
    command = faults.inject_command(cluster, plan, "/runs/out", "unused", "dtlab-ddp-g2-e2-s0-node2")
    assert "systemctl kill --signal=SIGKILL dtlab-ddp-g2-e2-s0-node2.service" in command
    assert "ranks" not in command  # not the trainers' PIDs alone: the agent would restart them in place
    cell = faulted(spec="elastic-kill-after1")
    planned = platforms.get("ddp").build(cluster, cell, attempt=2, timeout_s=60)
    first, second = (spec.argv for _, spec in planned.jobs)
    assert "--nnodes=1:2" in first and "--rdzv-backend=c10d" in first and "--max-restarts=1" in first
    assert f"--rdzv-endpoint={planned.placement.slots[0].node.address}:29500" in second
    assert not any(arg.startswith("--node_rank") for arg in first)
    assert "--rdzv-conf=last_call_timeout=10,is_host=true" in first
    assert "--rdzv-conf=last_call_timeout=10,is_host=false" in second
    assert {arg for arg in first if arg.startswith("--rdzv-id=")} == {
        f"--rdzv-id={launch.unit(cell, planned.placement.slots[0].node)}-a2"}
    assert planned.trainer_config["elastic"] is True
    plain = platforms.get("ddp").build(cluster, faulted(), attempt=1, timeout_s=60)
    assert "elastic" not in plain.trainer_config and "--node_rank=0" in plain.jobs[0][1].argv



def test_an_elastic_horovod_cell_runs_horovod_elastic_and_its_lost_node_loses_its_ranks(cluster):
    """Horovod's ranks run outside dtlab's units (horovodrun on the master starts them over SSH): on the
    lost node the kill takes the ranks by their PIDs, and the driver runs Horovod Elastic on the fixed
    hosts, going on with as few as 1 rank."""
    from dtlab.platforms.horovod import ELASTIC_OPTIONS

    plan = Fault("kill", 1, recovery="elastic")
    command = faults.inject_command(cluster, plan, "/runs/out", "unused", "")
    assert f"{progress.RANKS_DIR}/*.pid" in command and "systemctl kill" not in command
    cell = faulted("horovod", spec="elastic-kill-after1")
    planned = platforms.get("horovod").build(cluster, cell, attempt=1, timeout_s=60)
    (node, spec), = planned.jobs
    assert node.name == "n0"
    driver = spec.argv[-1]
    assert f"-np 2 -H 127.0.20.11:1,127.0.20.12:1 --start-timeout 60 --min-np 1 --max-np 2 " \
        f"{' '.join(ELASTIC_OPTIONS)} " in driver
    assert planned.trainer_config["elastic"] is True
    assert platforms.get("horovod").elastic_refusal(cluster) is None
    plain = platforms.get("horovod").build(cluster, faulted("horovod"), attempt=1, timeout_s=60)
    assert "--min-np" not in plain.jobs[0][1].argv[-1] and "elastic" not in plain.trainer_config


def test_an_elastic_ray_cell_scales_ray_train_and_its_lost_node_loses_its_raylet_until_the_cell_ends(cluster):
    """Ray's ranks are its raylet's actors: the lost node's raylet is SIGKILLed and held stopped (the stop
    cancels systemd's Restart=always), so that it does not rejoin the run; bench starts it after the cell."""
    ray = platforms.get("ray")
    raylet = ray.lost_node_service(cluster)
    assert raylet == cluster.require("ray_worker_service") and ray.elastic_refusal(cluster) is None
    command = faults.inject_command(cluster, Fault("kill", 1, recovery="elastic"), "/runs/out", "unused", "",
                                    raylet)
    assert f"systemctl kill --signal=SIGKILL {raylet}.service && systemctl stop {raylet}.service" in command
    assert "systemctl kill" not in faults.inject_command(cluster, Fault("kill", 1), "/runs/out", "unused", "",
                                                         raylet)  # a restart plan kills the trainers alone
    planned = ray.build(cluster, faulted("ray", spec="elastic-kill-after1"), attempt=1, timeout_s=60)
    assert planned.trainer_config["elastic"] is True
    assert "elastic" not in ray.build(cluster, faulted("ray"), attempt=1, timeout_s=60).trainer_config
    assert platforms.get("ddp").lost_node_service(cluster) == ""  # its ranks run in the cell's units
    unfired = faults.FaultRun(cluster, faulted("ray", spec="elastic-kill-after1"), "elastic", raylet)
    assert unfired.restore() is None  # nothing was held: nothing to start


def test_an_elastic_run_is_recorded_with_the_workers_it_finished_on(cluster):
    run = faults.FaultRun(cluster, faulted(spec="elastic-kill-after1"), "torchrun's elastic rendezvous")
    run.record = faults.FaultRecord("elastic-kill-after1", "kill", "node2", 1, None, run.recovery, 100.0,
                                    injected_unix=110.0, injected_in_attempt=1, checkpointed_epoch=1)
    record = run.finish(1, {"world_size": 1, "resumed_from_epoch": 1,
                            "timeline_unix": {"process_started": 140.0, "first_step_done": 150.0}})
    assert record["final_world_size"] == 1 and record["outcome"] == "recovered"
    assert record["detected_by"] == "the platform (restarted it)" and record["epochs_redone"] == 0


@pytest.mark.parametrize(("run", "refused_cell", "why"), [
    ("{frameworks: [ddp, spark], gpus: [2], epochs: [2], seeds: [0]}", "spark-g2-e2-s0-elastic-kill-after1",
     "recovery elastic: dtlab runs no elastic mode of Apache Spark yet (docs/faults.md); use recovery "
     "restart"),
    ("{frameworks: [ddp], gpus: [1], epochs: [2], seeds: [0]}", "ddp-g1-e2-s0-elastic-kill-after1",
     "recovery elastic: the fault would take the first worker, where rank 0 and the rendezvous run (a "
     "1-worker cell's only one); name another node"),
    ("{frameworks: [ddp], strategies: [zero1], gpus: [2], epochs: [2], seeds: [0]}",
     "ddp-g2-e2-s0-zero1-elastic-kill-after1", "recovery elastic: tested with strategy ddp alone, not zero1"),
])
def test_an_elastic_plan_that_cannot_be_followed_is_one_line_before_anything_starts(cluster, tmp_path, run,
                                                                                    refused_cell, why):
    from dtlab.bench import Bench, BenchOptions
    from dtlab.results import ResultStore

    path = tmp_path / "matrix.yml"
    path.write_text("profiles:\n  p:\n    fault: {kind: kill, after_epoch: 1, recovery: elastic}\n"
                    f"    runs: [{run}]\n")
    store = ResultStore(tmp_path / "results")
    bench = Bench(cluster, BenchOptions(profile="p", matrix_path=path), store=store)
    with pytest.raises(DtlabError) as refused:
        bench.check_cells(bench.load_matrix())
    assert str(refused.value) == f"{path}: profiles.p: cell {refused_cell}: {why}"
    assert not store.root.exists()
