"""Launcher overhead: torchrun vs Spark TorchDistributor vs the Determined Core API entry vs Ray Train's
TorchTrainer, same tiny job. Spark three times: its own application with the spark role's JVM options
(spark_jvm_options, dtlab's setup on the nodes), the same with the JVM's defaults (`spark-jvm-defaults`),
and a session on a Spark Connect server whose driver and executors stay up (`spark-connect`), side by
side in each round.

    .venv/bin/python benchmarks/launcher_overhead.py [--processes 2] [--repeats 3] [--train-size 1024]
        [--launchers torchrun,spark,spark-connect]

For every launch: wall clock from starting the command to the first optimizer step done (rank 0's
result.json timeline), the steady-state step time (median step after warm-up) and rank 0's CPU time per
step (less sensitive to other users' load on a shared host), all from result.json.
Launchers take turns, so that load from other users hits them alike; the median over repeats counts.
The Spark standalone cluster (a real master + workers on 127.0.0.1, tests/sparkcluster.py) starts once
beforehand, as the long-running service it is on a cluster; its start-up is reported on its own line.
Ray runs twice per round: `ray` with Ray's defaults (as the ray role starts it) and `ray-no-metrics` with
its metrics collection off (RAY_enable_metrics_collection=0 for every node and the driver). Each Ray launch
gets a fresh cluster of its own setting (a real head + N worker raylets on 127.0.0.1, token auth on,
tests/raycluster.py), warmed by one untimed launch and stopped after it, so that one setting's idle daemons
never run beside another launch; its start-up and warm-up are not counted. The Spark cluster starts only
when a Spark launcher is chosen.
So does the Spark Connect server (with the conf a standalone run sets for itself and the role's JVM
options; its workers offer 2 slots each, so that it and a standalone run each find theirs), and its
first job, on executors that have run nothing yet, is a warm-up that is not counted: a matrix sends every
cell through one server.
Determined runs off-cluster (no master here): the Core API entry under torchrun, dummy contexts.
Ratios against torchrun are taken per round (each launcher against torchrun's launch of the same
round) and printed as median [min-max] over the rounds.
Targets (trainer issue): steady-state <= 1.03x torchrun; TorchDistributor launch <= 15 s, teardown <= 3 s.
With --split-teardown, Spark's event log is on for every Spark application (the Connect server's
included), and every EXIT_WATCH_S a watcher notes which of the launch's processes are still alive: the
training processes, torchrun's agents (torch.distributed.run) and, under Spark, TorchDistributor's wrapper
around each agent. Each Spark launch is then split at its barrier job's events and those processes: launch
-> the job's tasks launched -> the wrappers seen -> the agents seen -> the training processes started; and
its teardown, training ended -> the training processes gone -> the agents gone -> the wrappers gone -> the
tasks' runs ended (the event log's launch + deserialise + run times) -> the tasks finished at the driver ->
the job ended -> the session stopped (the launcher's "result:" line, printed after spark.stop()) -> the
launcher exited. torchrun's teardown is split at the same processes. The watcher walks the process table
ten times a second beside the training: take steady steps from a run without it.
Where a steady step's time goes beyond the workers: during each launch a sampler reads the machine's
busy CPU time (/proc/stat) and the training workers' own CPU time every 0.5 s; "beside the workers" is
the CPU the rest of the machine used (launcher, agents, the idle Spark and Ray clusters, Ray's
daemons) between rank 0's first step and the end of training, in cores; and, per training process, its
busiest thread (the training loop) and its other threads (gloo's, and under Ray its core worker's), from
/proc's per-thread CPU times. Spark's workers run a script TorchDistributor writes, which the sampler
does not recognise: no figure for Spark.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from benchmarks._launch_watchers import CpuSampler, ExitWatcher  # noqa: E402
from benchmarks._trainer_common import OUT_DIR, free_loopback_port, machine, spread  # noqa: E402
from tests.raycluster import RayCluster  # noqa: E402
from tests.sparkcluster import SparkStandaloneCluster, connect_server_conf, role_defaults  # noqa: E402
from trainer.launchers._spark import CONNECT_TOKEN_ENV  # noqa: E402

# "spark" is TorchDistributor with the spark role's JVM options (spark_jvm_options, as on the nodes);
# "spark-jvm-defaults" the same launch with the JVM's defaults; "spark-connect" a session on a Spark
# Connect server with the same JVM options, side by side.
LAUNCHERS = ("torchrun", "spark", "spark-jvm-defaults", "spark-connect", "determined", "ray",
             "ray-no-metrics")
# Each Ray launcher's cluster settings, for its nodes and its driver.
RAY_SETTINGS = {"ray": {}, "ray-no-metrics": {"RAY_enable_metrics_collection": "0"}}
REPO = Path(__file__).resolve().parent.parent
STEADY_TARGET, SPARK_LAUNCH_TARGET_S, SPARK_TEARDOWN_TARGET_S = 1.03, 15.0, 3.0


class Clusters(NamedTuple):
    spark: SparkStandaloneCluster | None
    ray: RayCluster | None
    connect_url: str | None
    spark_conf: dict[str, str]  # conf every Spark application gets (the event log's, with --split-teardown)
    watch_exits: bool  # --split-teardown: when each layer of the launch's processes ends


def job_config(args, scratch: Path) -> Path:
    config = dict(model="generated:bert-tiny", dataset="generated", generated_train_size=args.train_size,
                  generated_test_size=64, generated_median_words=60, max_length=64, batch_size=8, epochs=1,
                  learning_rate=1e-3, warmup_steps=4, threads=1, device="cpu", mixed_precision="no",
                  cache_dir=str(scratch / "token-cache"))
    path = scratch / "job.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def command(launcher: str, processes: int, config: Path, out: Path, clusters: Clusters) -> list[str]:
    trainer_args = ["--config", str(config), "--output-dir", str(out)]
    if launcher == "spark-connect":
        return [sys.executable, "-m", "trainer.launchers.spark", *trainer_args,
                "--num-processes", str(processes), "--remote", clusters.connect_url]
    if launcher.startswith("spark"):
        jvm_options = "" if launcher == "spark-jvm-defaults" else role_defaults()["spark_jvm_options"]
        jvm_conf = [f"--spark-conf=spark.{side}.extraJavaOptions={jvm_options}"
                    for side in ("driver", "executor") if jvm_options]
        jvm_conf += [f"--spark-conf={key}={value}" for key, value in clusters.spark_conf.items()]
        return [sys.executable, "-m", "trainer.launchers.spark", *trainer_args, *jvm_conf,
                "--num-processes", str(processes), "--master", clusters.spark.master_url]
    if launcher in RAY_SETTINGS:
        return [sys.executable, "-m", "trainer.launchers.ray", *trainer_args,
                "--num-workers", str(processes), "--address", clusters.ray.address]
    module = "trainer.launchers.torchrun" if launcher == "torchrun" else "trainer.launchers.determined"
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={processes}",
            "--master_addr=127.0.0.1", f"--master_port={free_loopback_port()}", "-m", module, *trainer_args]


def launch_on_fresh_ray(launcher: str, processes: int, config: Path, out: Path, clusters: Clusters,
                        secret: str, cluster_start_s: dict) -> dict:
    """One timed launch on a Ray cluster of this launcher's settings, started for it and warmed by one
    untimed launch (the lab's cluster has run jobs before a cell comes), then stopped."""
    started = time.monotonic()
    with RayCluster(workers=processes, extra_env=RAY_SETTINGS[launcher]) as ray:
        cluster_start_s.setdefault(launcher, []).append(time.monotonic() - started)
        on_ray = clusters._replace(ray=ray)
        launch(launcher, processes, config, out.with_name(out.name + "-warm-up"), on_ray, secret)
        return launch(launcher, processes, config, out, on_ray, secret)


def launch(launcher: str, processes: int, config: Path, out: Path, clusters: Clusters, secret: str) -> dict:
    env = {**os.environ, **(clusters.ray.env if clusters.ray else {}), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO),  # Ray's workers import the trainer from here (the driver forwards it)
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_AUTHENTICATE_SECRET": secret, CONNECT_TOKEN_ENV: secret,
           # Determined's chief-worker messaging ports (default 12360+): free ones.
           "INTER_TRAIN_PROCESS_COMM_PORT_1": str(free_loopback_port()),
           "INTER_TRAIN_PROCESS_COMM_PORT_2": str(free_loopback_port())}
    launched_at, distributor_started_at, result_line_at, tail = time.time(), None, None, []
    with subprocess.Popen(command(launcher, processes, config, out, clusters), env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
        sampler, watcher = CpuSampler(process.pid), ExitWatcher() if clusters.watch_exits else None
        sampler.start()
        if watcher:
            watcher.start()
        for line in process.stdout:  # timestamps TorchDistributor's "Started distributed training" line
            if distributor_started_at is None and line.startswith("Started distributed training"):
                distributor_started_at = time.time()
            if line.startswith("result: "):  # the Spark launcher's, after its session has stopped
                result_line_at = time.time()
            tail = [*tail[-40:], line]
        returncode = process.wait(timeout=1800)
        sampler.done.set()
        sampler.join(timeout=10)
        if watcher:
            watcher.done.set()
            watcher.join(timeout=10)
    exited_at = time.time()
    if returncode != 0:
        raise SystemExit(f"{launcher} failed:\n{''.join(tail)}")
    result = json.loads((out / "result.json").read_text())
    timeline, steps = result["timeline_unix"], result["epoch_metrics"][0]["train_samples"] // (8 * processes)
    run = {"launcher": launcher, "label": result["framework_label"], "world_size": result["world_size"],
            "launch_to_session_ready_s": distributor_started_at and distributor_started_at - launched_at,
            "launch_to_train_process_s": timeline["process_started"] - launched_at,
            "launch_to_core_s": timeline["core_entered"] - launched_at,
            "launch_to_first_step_s": timeline["first_step_done"] - launched_at,
            "steady_step_s": result["steady_step_time_s"], "wall_s": exited_at - launched_at,
            "training_end_to_exit_s": exited_at - timeline["training_ended"],
            # Absolute times, to place the run's Spark events (--split-teardown) in its teardown.
            "launched_at": launched_at, "process_started_at": timeline["process_started"],
            "training_ended_at": timeline["training_ended"],
            "result_line_at": result_line_at, "exited_at": exited_at,
            **({f"{layer}_gone_at": seen for layer, seen in watcher.last_seen.items()} if watcher else {}),
            **({f"{layer}_seen_at": seen for layer, seen in watcher.first_seen.items()} if watcher else {}),
            "steps": steps, "cpu_step_s": result["epoch_metrics"][0]["train_cpu_time_s"] / steps,
            "beside_workers_cores": sampler.beside_workers_cores(timeline["first_step_done"],
                                                                 timeline["training_ended"])}
    threads = sampler.worker_threads_cores(timeline["first_step_done"], timeline["training_ended"])
    run["training_thread_cores"], run["other_threads_cores"] = threads or (None, None)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2, help="training processes per launch")
    parser.add_argument("--repeats", type=int, default=2, help="launches per launcher (median counts)")
    parser.add_argument("--train-size", type=int, default=1024, help="generated training reviews")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS),
                        help=f"comma-separated, torchrun first (default: all of {','.join(LAUNCHERS)})")
    parser.add_argument("--split-teardown", action="store_true",
                        help="Spark's event log on and the launch's processes watched, to split each "
                             "launch's teardown (and Spark's launch) at its job's events and its processes")
    args = parser.parse_args()
    launchers = args.launchers.split(",")
    if launchers[0] != "torchrun" or not set(launchers) <= set(LAUNCHERS):
        parser.error(f"--launchers: torchrun first, then any of {', '.join(LAUNCHERS[1:])}")
    machine_before = machine()
    secret = secrets.token_hex(16)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="dtlab-launcher-bench-") as scratch_name, \
            ExitStack() as clusters_up:
        scratch = Path(scratch_name)
        config = job_config(args, scratch)
        event_dir = scratch / "spark-events"
        spark_conf = {}
        if args.split_teardown:
            event_dir.mkdir()
            spark_conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": event_dir.as_uri(),
                          # One plain file of JSON lines per application, read below (Spark 4's
                          # defaults are a directory of rolled, compressed files).
                          "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}
        cluster_start_s, spark = {}, None
        if any(launcher.startswith("spark") for launcher in launchers):
            started = time.monotonic()
            spark = clusters_up.enter_context(SparkStandaloneCluster(
                workers=args.processes, auth_secret=secret, cores_per_worker=2))
            cluster_start_s["spark"] = time.monotonic() - started
        connect_url = None
        if "spark-connect" in launchers:
            started = time.monotonic()
            connect_url = spark.start_connect_server(secret, connect_server_conf(args.processes) | spark_conf,
                                                     slots=args.processes)
            cluster_start_s["spark connect server"] = time.monotonic() - started
        clusters = Clusters(spark, None, connect_url, spark_conf, watch_exits=args.split_teardown)
        # The token cache, built once before any timed launch; the Connect server's first job.
        for warm_up in ("torchrun", "spark-connect")[:1 + bool(connect_url)]:
            launch(warm_up, args.processes, config, scratch / f"warm-up-{warm_up}", clusters, secret)
        for repeat in range(args.repeats):
            for launcher in launchers:
                out = scratch / f"{launcher}-{repeat}"
                if launcher in RAY_SETTINGS:
                    run = launch_on_fresh_ray(launcher, args.processes, config, out, clusters, secret,
                                              cluster_start_s)
                else:
                    run = launch(launcher, args.processes, config, out, clusters, secret)
                runs.append(run | {"round": repeat})
                beside, threads = run["beside_workers_cores"], run["training_thread_cores"]
                print(f"  {launcher:<18} first step after {run['launch_to_first_step_s']:6.2f} s, "
                      f"steady step {run['steady_step_s'] * 1000:6.1f} ms, CPU beside the workers "
                      f"{'n/a' if beside is None else f'{beside:.2f} cores'}; per worker, training thread "
                      + ("n/a" if threads is None
                         else f"{threads:.2f} and other threads {run['other_threads_cores']:.2f} cores"),
                      flush=True)
        clusters_up.close()  # the Connect server's event log is complete once its application has ended
        if args.split_teardown:
            place_spark_events(runs, read_spark_events(event_dir))
    report(args, launchers, runs, cluster_start_s, machine_before, machine())


def read_spark_events(event_dir: Path) -> dict:
    """From Spark's event logs (one JSON object per line; every application's, the Connect server's
    included): each job's end and stages, each task's launch and finish, each application's end. Unix
    seconds (Spark's milliseconds on this machine's clock)."""
    jobs, tasks, app_ends = {}, [], []
    for log in sorted(event_dir.iterdir()):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            kind = event["Event"]
            if kind == "SparkListenerJobStart":
                jobs[(log.name, event["Job ID"])] = {"stages": set(event["Stage IDs"]), "ended_at": None}
            elif kind == "SparkListenerJobEnd":
                jobs[(log.name, event["Job ID"])]["ended_at"] = event["Completion Time"] / 1000
            elif kind == "SparkListenerTaskEnd":
                info, metrics = event["Task Info"], event["Task Metrics"]
                # The executor's own account: its deserialisation of the task, then its run (the Python
                # worker's whole UDF), from when the driver launched it.
                ran_until = (info["Launch Time"] + metrics["Executor Deserialize Time"]
                             + metrics["Executor Run Time"])
                tasks.append({"log": log.name, "stage": event["Stage ID"],
                              "launched_at": info["Launch Time"] / 1000, "run_ended_at": ran_until / 1000,
                              "finished_at": info["Finish Time"] / 1000})
            elif kind == "SparkListenerApplicationEnd":
                app_ends.append(event["Timestamp"] / 1000)
    return {"jobs": [{"log": log, **job} for (log, _), job in jobs.items() if job["ended_at"]],
            "tasks": tasks, "app_ends": app_ends}


def place_spark_events(runs: list[dict], events: dict) -> None:
    """Each Spark run's barrier job (the last job to end while it ran): when its tasks were launched and
    finished, and when the job and (its own application's) application ended."""
    for run in (run for run in runs if run["launcher"].startswith("spark")):
        start, end = run["launched_at"], run["exited_at"]
        jobs = sorted((job for job in events["jobs"] if start <= job["ended_at"] <= end),
                      key=lambda job: job["ended_at"])
        if not jobs:
            raise SystemExit(f"{run['launcher']} round {run['round']}: no Spark job ended while it ran "
                             "(is the event log written?)")
        job = jobs[-1]
        tasks = [task for task in events["tasks"]
                 if task["log"] == job["log"] and task["stage"] in job["stages"]]
        run |= {"tasks_launched_at": max(task["launched_at"] for task in tasks),
                "tasks_run_ended_at": max(task["run_ended_at"] for task in tasks),
                "tasks_finished_at": max(task["finished_at"] for task in tasks),
                "job_ended_at": job["ended_at"],
                "app_ended_at": next((at for at in events["app_ends"] if start <= at <= end), None)}


def teardown_split(launchers: list[str], runs: list[dict]) -> None:
    """Each launch's teardown at the ends of its processes (to ExitWatcher.EXIT_WATCH_S) and, under Spark,
    its barrier job's events; and Spark's launch at those events (--split-teardown)."""
    gone = [("training ended -> the training processes gone (train()'s return, the process's exit)",
             "training_ended_at", "workers_gone_at"),
            ("-> torchrun's agents gone (its exit barrier and shutdown)",
             "workers_gone_at", "agents_gone_at")]
    spark_parts = [("launch -> the barrier job's tasks launched", "launched_at", "tasks_launched_at"),
                   ("-> TorchDistributor's wrappers seen (the Python worker, TorchDistributor's set-up)",
                    "tasks_launched_at", "wrappers_seen_at"),
                   ("-> torchrun's agents seen", "wrappers_seen_at", "agents_seen_at"),
                   ("-> the training processes started (torchrun's import, rendezvous and spawn)",
                    "agents_seen_at", "process_started_at"),
                   *gone,
                   ("-> TorchDistributor's wrappers gone", "agents_gone_at", "wrappers_gone_at"),
                   ("-> the tasks' runs ended, by the executors' run times (the output read, the result "
                    "through the Python worker)", "wrappers_gone_at", "tasks_run_ended_at"),
                   ("-> the tasks finished at the driver", "tasks_run_ended_at", "tasks_finished_at"),
                   ("-> the job ended", "tasks_finished_at", "job_ended_at"),
                   ("-> the session stopped ('result:' line: the result to the client, spark.stop())",
                    "job_ended_at", "result_line_at"),
                   ("-> the launcher exited", "result_line_at", "exited_at")]
    torchrun_parts = [*gone[:1],
                      ("-> the launcher (torchrun's agent) exited", "workers_gone_at", "exited_at")]
    for launcher in (name for name in launchers if name == "torchrun" or name.startswith("spark")):
        mine = [run for run in runs if run["launcher"] == launcher]
        job = "" if launcher == "torchrun" else " and its barrier job's events"
        print(f"{launcher}, split at its processes' ends{job}, median [min-max] over {len(mine)} rounds:")
        for what, start, end in (torchrun_parts if launcher == "torchrun" else spark_parts):
            print(f"  {what}: {spread([run[end] - run[start] for run in mine], unit=' s')}")
        print(f"  teardown, training ended -> the launcher exited: "
              f"{spread([run['exited_at'] - run['training_ended_at'] for run in mine], unit=' s')}")
        if all(run.get("app_ended_at") for run in mine):
            after_job = [run["app_ended_at"] - run["job_ended_at"] for run in mine]
            print(f"  (its own application ended {spread(after_job, unit=' s')} after the job)")


def report(args, launchers: list[str], runs: list[dict], cluster_start_s: dict, machine_before: str,
           machine_after: str) -> None:
    def of(launcher: str, key: str) -> list[float]:
        return [run[key] for run in runs if run["launcher"] == launcher]

    def median(launcher: str, key: str) -> float:
        return statistics.median(of(launcher, key))

    def ratios(launcher: str, key: str) -> list[float]:
        """Per round: this launcher's figure over torchrun's launch of the same round."""
        base = {run["round"]: run[key] for run in runs if run["launcher"] == "torchrun"}
        return [run[key] / base[run["round"]] for run in runs if run["launcher"] == launcher]

    rows = []
    print(f"\nmachine: {machine_before} (after: {machine_after.split('load average ')[1]})")
    print(f"job: {args.processes} processes x 1 thread, {runs[0]['steps']} steps, {args.repeats} rounds; "
          "median [min-max] over the rounds; cluster start-up, not counted: "
          + ", ".join(f"{name} {seconds:.1f} s" if isinstance(seconds, float)
                      else f"{name} {statistics.median(seconds):.1f} s (median of {len(seconds)})"
                      for name, seconds in cluster_start_s.items()) + "\n")
    print(f"{'launcher':<20}{'launch->process':>22}{'launch->1st step':>24}{'steady step':>26}"
          f"{'step ratio':>22}{'CPU/step ratio':>22}{'training end->exit':>24}")
    for launcher in launchers:
        row = {key: median(launcher, key) for key in ("launch_to_train_process_s", "launch_to_first_step_s",
                                                       "steady_step_s", "cpu_step_s", "wall_s",
                                                       "training_end_to_exit_s")}
        steady, cpu = ratios(launcher, "steady_step_s"), ratios(launcher, "cpu_step_s")
        row |= {"launcher": launcher, "steady_ratio": statistics.median(steady),
                "steady_ratio_range": [min(steady), max(steady)], "cpu_ratio": statistics.median(cpu),
                "cpu_ratio_range": [min(cpu), max(cpu)],
                "first_step_ratio": statistics.median(ratios(launcher, "launch_to_first_step_s"))}
        rows.append(row)
        print(f"{launcher:<20}{spread(of(launcher, 'launch_to_train_process_s'), '.1f', ' s'):>22}"
              f"{spread(of(launcher, 'launch_to_first_step_s'), '.1f', ' s'):>24}"
              f"{spread(of(launcher, 'steady_step_s'), '.1f', ' ms', 1000):>26}"
              f"{spread(ratios(launcher, 'steady_step_s'), '.3f'):>22}"
              f"{spread(ratios(launcher, 'cpu_step_s'), '.3f'):>22}"
              f"{spread(of(launcher, 'training_end_to_exit_s'), '.1f', ' s'):>24}")
    print("CPU beside the training workers during training, in cores, median [min-max]: " + "; ".join(
        f"{launcher} {spread(values)}" if (values := [v for v in of(launcher, 'beside_workers_cores')
                                                       if v is not None]) else f"{launcher} n/a"
        for launcher in launchers))
    for key, what in (("training_thread_cores", "its busiest thread (the training loop)"),
                      ("other_threads_cores", "its other threads (gloo's; under Ray its core worker's)")):
        print(f"Cores each training process used during training, {what}, median [min-max]: " + "; ".join(
            f"{launcher} {spread(values)}" if (values := [v for v in of(launcher, key) if v is not None])
            else f"{launcher} n/a" for launcher in launchers))
    print("Launch -> first step in three parts, medians: launch -> training process; -> train() called "
          "(imports, and the framework's own set-up in that process); -> first step (train()'s set-up)")
    for launcher in launchers:
        process, core, first = (median(launcher, key) for key in (
            "launch_to_train_process_s", "launch_to_core_s", "launch_to_first_step_s"))
        print(f"  {launcher:<20}{process:6.1f} s {core - process:6.1f} s {first - core:6.1f} s")
    for ray in (launcher for launcher in launchers if launcher in RAY_SETTINGS):
        print(f"{ray} vs torchrun, launch -> first step: {spread(ratios(ray, 'launch_to_first_step_s'))}x; "
              f"steady step: {spread(ratios(ray, 'steady_step_s'), '.3f')}x")
    if set(RAY_SETTINGS) <= set(launchers):
        on, off = of("ray", "steady_step_s"), of("ray-no-metrics", "steady_step_s")
        print("ray's steady step with metrics collection off over on, per round: "
              f"{spread([b / a for a, b in zip(on, off, strict=True)], '.3f')}")
    sparks = [row for row in rows if row["launcher"] in ("spark", "spark-connect")]
    for spark in sparks:
        name = spark["launcher"]
        session_ready = median(name, "launch_to_session_ready_s")
        print(f"{name} breakdown: SparkSession ready + TorchDistributor started after {session_ready:.1f} s; "
              f"training processes started {spark['launch_to_train_process_s'] - session_ready:.1f} s later "
              "(executors, Python worker, torchrun on each executor); first step "
              f"{spark['launch_to_first_step_s'] - spark['launch_to_train_process_s']:.1f} s after that")
    for other, what in (("spark-jvm-defaults", "with the JVM's defaults"),
                        ("spark-connect", "on the Connect server")):
        if {"spark", other} <= set(launchers):
            base, beside = of("spark", "launch_to_first_step_s"), of(other, "launch_to_first_step_s")
            per_round = [b - o for o, b in zip(beside, base, strict=True)]
            print(f"spark's launch -> first step: {spread(base, '.1f', ' s')} as its own application "
                  f"with the JVM options ({role_defaults()['spark_jvm_options']}), "
                  f"{spread(beside, '.1f', ' s')} {what}; the application's minus this, per round: "
                  f"{spread(per_round, '.1f', ' s')}")
    for kind in ("steady", "cpu"):
        worst = max(row[f"{kind}_ratio"] for row in rows)
        print(f"\n{kind} step ratio, worst vs torchrun: {worst:.3f} (target <= {STEADY_TARGET}) -> "
              f"{'met' if worst <= STEADY_TARGET else 'MISSED'}", end="")
    print()
    for spark in sparks:
        spark_launch = spark["launch_to_first_step_s"]
        ratio = spark_launch / SPARK_LAUNCH_TARGET_S
        print(f"TorchDistributor launch -> first step, {spark['launcher']}: {spark_launch:.1f} s "
              f"(target <= {SPARK_LAUNCH_TARGET_S:.0f} s, ratio {ratio:.2f}) -> "
              f"{'met' if spark_launch <= SPARK_LAUNCH_TARGET_S else 'MISSED'}")
        teardown = spark["training_end_to_exit_s"]
        print(f"Spark teardown (training ended -> launcher exited), {spark['launcher']}: {teardown:.1f} s "
              f"(target <= {SPARK_TEARDOWN_TARGET_S:.0f} s) -> "
              f"{'met' if teardown <= SPARK_TEARDOWN_TARGET_S else 'MISSED'}")
    if args.split_teardown:
        teardown_split(launchers, runs)
    OUT_DIR.mkdir(exist_ok=True)
    out = OUT_DIR / "launcher_overhead.json"
    out.write_text(json.dumps({"machine": machine_before, "machine_after": machine_after, "args": vars(args),
                               "cluster_start_s": cluster_start_s, "rows": rows, "runs": runs}, indent=2))
    print(f"raw figures: {out}")


if __name__ == "__main__":
    main()
