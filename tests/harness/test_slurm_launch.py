"""What a slurm cell submits, from the inventory alone: the ddp launch's torchrun commands inside one
sbatch job, on dtlab's placement; the task script's branches run for real in bash."""

import json
import shlex
import subprocess

import pytest
from harness_helpers import build_launch
from test_placement import cell

from dtlab.errors import DtlabError
from dtlab.platforms import ddp, slurm
from dtlab.report.aggregate import whole_run_phases


def sbatch_options(planned) -> list[str]:
    (node, spec), = planned.jobs
    argv = list(spec.argv)
    assert argv[1:3] == ["-m", "trainer.launchers.slurm"]
    return argv[argv.index("--") + 1:]


def wrapped_srun(options: list[str]) -> list[str]:
    wrap = next(option for option in options if option.startswith("--wrap="))
    return shlex.split(wrap.removeprefix("--wrap="))


def test_one_sbatch_job_on_the_master_asks_for_the_placed_workers_whole(gpu_cluster):
    planned = build_launch(gpu_cluster, cell("slurm", gpus=4), attempt=2, timeout_s=600)
    (node, spec), = planned.jobs
    assert node.name == gpu_cluster.master.name and spec.user == gpu_cluster.user
    options = sbatch_options(planned)
    assert "--nodes=2" in options and "--nodelist=gpu1,gpu2" in options
    assert "--ntasks-per-node=1" in options and "--exclusive" in options
    assert "--gres=gpu:2" in options  # Slurm picks the GPUs: no CUDA_VISIBLE_DEVICES of dtlab's
    assert "--time=10" in options and f"--job-name=dtlab-{planned.cell.key}" in options
    assert f"--partition={gpu_cluster.var('slurm_partition')}" in options
    # rank 0 is on the first placed worker: the result is fetched there, the queue marks on the master
    assert planned.result_node.name == "gpu1"
    assert planned.platform_marks == (node, f"{planned.paths.output_dir}/{slurm.MARKS_FILE}")
    assert [n.name for n, _ in planned.node_logs] == ["gpu1", "gpu2"]
    assert {n.name for n in planned.prepare_nodes} >= {"gpu1", "gpu2", gpu_cluster.master.name}


def test_each_task_execs_the_ddp_launchs_own_torchrun_command_for_its_node(gpu_cluster):
    planned = build_launch(gpu_cluster, cell("slurm", gpus=4), attempt=1, timeout_s=600)
    srun = wrapped_srun(sbatch_options(planned))
    assert srun[:3] == ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1"] and srun[3:5] == ["bash", "-c"]
    script = srun[5]
    ddp_launch = ddp.build(gpu_cluster, cell("ddp", gpus=4), attempt=1, timeout_s=600)
    for node, spec in ddp_launch.jobs:
        # the very command, not a copy of it (but for the cell's own config path)
        argv = [arg.replace(ddp_launch.paths.config_path, planned.paths.config_path) for arg in spec.argv]
        assert shlex.join(argv) in script, node.name
        assert f"tee -a {shlex.quote(planned.paths.log_path(node))}" in script
    assert "CUDA_VISIBLE_DEVICES" not in script
    assert script.startswith(f"set -a; . {gpu_cluster.socket_env_file}; set +a")


def test_the_task_script_refuses_a_node_outside_the_placement_in_one_line(cpu_cluster, tmp_path):
    planned = build_launch(cpu_cluster, cell("slurm", gpus=2), attempt=1, timeout_s=600)
    script = wrapped_srun(sbatch_options(planned))[5]
    socket_env = tmp_path / "socket.env"
    socket_env.write_text("GLOO_SOCKET_IFNAME=lo\n")
    script = script.replace(cpu_cluster.socket_env_file, str(socket_env))
    run = subprocess.run(["bash", "-c", script], env={"SLURMD_NODENAME": "stranger", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert run.stderr.strip() == "dtlab: node stranger is not in this cell's placement"
    # the whole --wrap line is valid sh, as sbatch's wrapper runs it
    wrap_line = shlex.join(wrapped_srun(sbatch_options(planned)))
    assert subprocess.run(["sh", "-n", "-c", wrap_line]).returncode == 0


def test_a_slurm_job_cannot_ask_nodes_for_unequal_gpu_counts(gpu_cluster):
    with pytest.raises(DtlabError, match=r"same number of GPUs, but the placement takes \[2, 1\]"):
        build_launch(gpu_cluster, cell("slurm", gpus=3), attempt=1, timeout_s=600)


def test_sinfo_states_parse_and_flags_are_kept_apart():
    states = slurm.parse_nodes("node1 idle\nnode2 down*\n\nnoise\n")
    assert states == {"node1": "idle", "node2": "down*"}
    assert slurm.base_state("down*") == "down" and slurm.base_state("drain") == "drain"
    assert "down" in slurm.HELD_STATES and "idle" not in slurm.HELD_STATES


def test_the_queue_is_its_own_phase_only_for_runs_that_went_through_one():
    marks = {"submitted": 100.0, "units_started": 101.0, "recorded": 140.0}
    trainer = {"process_started": 104.0, "first_step_done": 110.0, "training_ended": 138.0}
    queued = {"timeline_unix": trainer,
              "harness_timeline_unix": {**marks, "queue_entered": 101.5, "queue_left": 102.25}}
    phases = dict(whole_run_phases(queued))
    assert phases["of which queued"] == pytest.approx(0.75)
    assert phases["submit → trainer process"] == pytest.approx(4.0)
    plain = dict(whole_run_phases({"timeline_unix": trainer, "harness_timeline_unix": marks}))
    assert "of which queued" not in plain and plain["end to end"] == pytest.approx(40.0)
    json.dumps(phases)  # plain numbers, as the report writes them


@pytest.mark.parametrize(
    ("argv", "path", "code", "line"),
    [
        (["--marks", "m.json", "--"], "/usr/bin:/bin", 2, "error: no sbatch options after --"),
        (["--marks", "m.json", "--", "--wrap=true"], "/nonexistent", 127,
         "error: no sbatch here: slurm-client is not installed (the slurm role)"),
    ],
)
def test_the_slurm_driver_refuses_bad_input_in_one_line(tmp_path, argv, path, code, line):
    import sys

    from dtlab import paths

    run = subprocess.run([sys.executable, "-m", "trainer.launchers.slurm", *argv], cwd=tmp_path,
                         env={"PATH": path, "PYTHONPATH": str(paths.REPO_ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == code
    assert run.stderr.strip().splitlines()[-1].endswith(line)
    assert not (tmp_path / "m.json").exists()  # nothing written before the job exists


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"JobState": "COMPLETED", "ExitCode": "0:0"}, 0),
        ({"JobState": "FAILED", "ExitCode": "1:0"}, 1),
        ({"JobState": "CANCELLED", "ExitCode": "0:15"}, 143),
        ({"JobState": "TIMEOUT", "ExitCode": "0:0"}, 1),  # not completed is never 0
        ({"JobState": "NODE_FAIL"}, 1),
    ],
)
def test_the_drivers_exit_code_is_the_jobs_as_a_shell_gives_it(fields, code):
    from trainer.launchers._slurm import exit_code

    assert exit_code(fields) == code
