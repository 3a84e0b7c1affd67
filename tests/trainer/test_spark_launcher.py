"""The Spark launcher for real: a Spark standalone master and 2 workers from the pyspark package, with
authentication on, and TorchDistributor running 2 CPU training processes (gloo) through the launcher.
The cluster runs with the spark role's spark-defaults.conf: its master UI cannot kill applications."""

import contextlib
import json
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from dtlab.waiting import wait_until
from tests.sparkcluster import connect_server_conf, role_defaults
from tests.trainer.conftest import (
    SUBPROCESS_TIMEOUT_S,
    TINY,
    run,
    torchrun_command,
    trainer_env,
    write_config,
)
from trainer.config import TrainConfig
from trainer.launchers._spark import CONNECT_LABEL, CONNECT_TOKEN_ENV, SECRET_ENV, STANDALONE_LABEL
from trainer.result import validate_result

pytestmark = pytest.mark.slow
SMALL = dict(generated_train_size=64, generated_test_size=32)  # the launcher is under test, not learning
# The cluster is tests/conftest.py's `loopback_spark`, one for the session; its teardown checks that its
# daemons and executors are stopped by PID.


def spark_launch(cluster, *args: str, secret_in_env: bool = True, defaults_file: bool = False,
                 remote: str | None = None, token: str | None = None) -> subprocess.CompletedProcess:
    """The launcher as the driver; `defaults_file`: it reads the cluster's spark-defaults.conf, as the
    harness's driver on the master reads the spark role's (SPARK_CONF_DIR). `remote`: a session on that
    Spark Connect server instead of an application of its own, with `token`."""
    command, env = launcher_command(cluster, args, secret_in_env, defaults_file, remote, token)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)


def launcher_command(cluster, args, secret_in_env=True, defaults_file=False, remote=None, token=None):
    env = {**trainer_env(), "SPARK_LOCAL_IP": "127.0.0.1"}  # the driver on loopback
    env |= {SECRET_ENV: cluster.auth_secret} if secret_in_env else {}
    env |= {"SPARK_CONF_DIR": str(cluster.spark_defaults_path.parent)} if defaults_file else {}
    env |= {CONNECT_TOKEN_ENV: token} if token else {}
    where = ["--remote", remote] if remote else ["--master", cluster.master_url]
    return [sys.executable, "-m", "trainer.launchers.spark", *where, *args], env


def training_processes(cluster) -> list[psutil.Process]:
    """The executors' training processes: TorchDistributor's torch.distributed.run under this cluster's
    workers, and its ranks (other tests' torchrun runs beside, under xdist, are not theirs)."""
    found = []
    for daemon in cluster.pids():
        with contextlib.suppress(psutil.Error):
            for process in psutil.Process(daemon).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "torch.distributed.run" in " ".join(process.cmdline()):
                        found += [process, *process.children(recursive=True)]
    return found


def stop_mid_training(cluster, config: Path, remote: str, token: str) -> tuple[int, float]:
    """Start a Connect run, SIGTERM its launcher (as a stopped cell's unit is) once its training processes
    run: its exit code, and the seconds until no training process is left on the executors."""
    command, env = launcher_command(cluster, ["--config", str(config), "--num-processes", "2"],
                                    remote=remote, token=token)
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        running = wait_until(lambda: training_processes(cluster), until=lambda found: len(found) >= 4,
                             timeout_s=120, every_s=0.5)  # two torchruns, a rank each
        assert len(running) >= 4, f"the training processes did not start within 120 s: {running}"
        launcher.send_signal(signal.SIGTERM)
        code = launcher.wait(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)
    stopped = time.monotonic()
    left = wait_until(lambda: [p for p in running if p.is_running()], until=lambda alive: not alive,
                      timeout_s=60, every_s=0.5)
    assert not left, f"training processes still run 60 s after the launcher stopped: {left}"
    return code, time.monotonic() - stopped


def test_cluster_has_two_alive_workers(loopback_spark):
    assert loopback_spark.alive_workers() == 2


def test_two_processes_train_through_torch_distributor(loopback_spark, make_config, tmp_path):
    """With the spark role's spark-defaults.conf, as on the nodes: its JVM options (spark_jvm_options) are
    the driver's and the executors', and the result's label names them."""
    cfg = make_config(epochs=1, checkpoint_dir=str(tmp_path / "checkpoints"), **SMALL)
    launched = spark_launch(loopback_spark, "--config", str(write_config(cfg, tmp_path / "run.yml")),
                            "--num-processes", "2", defaults_file=True)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]

    result = json.loads((tmp_path / "out" / "result.json").read_text())
    validate_result(result)
    jvm_options = role_defaults()["spark_jvm_options"]
    assert jvm_options.startswith("-XX:")
    label = f"{STANDALONE_LABEL} + JVM {jvm_options}"
    assert (result["framework"], result["framework_label"]) == ("spark", label)
    assert (result["world_size"], result["device"], result["backend"]) == (2, "cpu", "gloo")
    assert len(result["epoch_metrics"]) == 1 and result["epoch_metrics"][0]["train_samples"] == 64
    assert (tmp_path / "checkpoints" / "epoch-0001" / "checkpoint.pt").is_file()
    assert "PySpark does not yet fully support pandas" not in launched.stderr  # pandas-3 warning silenced


def test_missing_slot_fails_fast_with_one_clear_line(loopback_spark, make_config, tmp_path):
    """Also: the auth secret from a file (as the spark role writes it) instead of the environment."""
    cfg = make_config(epochs=1, **SMALL)
    secret_file = tmp_path / "spark-secret"
    secret_file.write_text(loopback_spark.auth_secret + "\n")
    started = time.monotonic()
    launched = spark_launch(loopback_spark, "--config", str(write_config(cfg, tmp_path / "run.yml")),
                            "--num-processes", "3",  # 2 workers x 1 core: one slot short
                            "--spark-conf", "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures=3",
                            "--spark-secret-file", str(secret_file), secret_in_env=False)
    assert launched.returncode == 2
    last_line = launched.stderr.strip().splitlines()[-1]
    assert last_line.startswith("python -m trainer.launchers.spark: error: --num-processes 3: ")
    assert last_line.endswith("lacks free slots")
    # Spark's default retries for ~10 minutes; this is JVM start-up plus 3 one-second checks.
    assert time.monotonic() - started < 240
    assert not (tmp_path / "out" / "result.json").exists()


def test_two_processes_train_on_a_connect_servers_executors_as_under_torchrun(loopback_spark, make_config,
                                                                              tmp_path):
    """--remote: a session on a Spark Connect server that keeps its driver and executors up (issue #29:
    Spark at its best), started with the conf a standalone run sets for itself and the role's JVM options.
    The epochs are torchrun's, the label says Connect; a wrong token is refused in one line. A run stopped
    with SIGTERM (a stopped cell) releases its session, so its training processes end and the next run
    finds both slots. The server holds both slots, so it runs for this test only."""
    cfg = make_config(epochs=1, **SMALL)
    run(torchrun_command(2, "--config", str(write_config(cfg, tmp_path / "torchrun.yml")), "--output-dir",
                         str(tmp_path / "torchrun")))
    reference = json.loads((tmp_path / "torchrun" / "result.json").read_text())
    jvm_options = role_defaults()["spark_jvm_options"]
    token = secrets.token_hex(16)
    remote = loopback_spark.start_connect_server(token, connect_server_conf(2, cfg.threads), slots=2)
    try:
        long_run = write_config(make_config(epochs=50, output_dir=str(tmp_path / "stopped"), **SMALL),
                                tmp_path / "long.yml")
        stopped_code, drained_s = stop_mid_training(loopback_spark, long_run, remote, token)
        # The next run needs both slots: it passes only if the stopped run's session let them go.
        launched = spark_launch(loopback_spark, "--config", str(write_config(cfg, tmp_path / "run.yml")),
                                "--num-processes", "2", remote=remote, token=token)
        assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
        refused = spark_launch(loopback_spark, "--config", str(tmp_path / "run.yml"), "--output-dir",
                               str(tmp_path / "refused"), remote=remote, token="not-" + token)
    finally:
        loopback_spark.stop_connect_server()

    result = json.loads((tmp_path / "out" / "result.json").read_text())
    validate_result(result)
    assert result["framework"] == "spark"
    assert result["framework_label"] == f"{CONNECT_LABEL} + JVM {jvm_options}"
    assert (result["world_size"], result["device"], result["backend"]) == (2, "cpu", "gloo")
    assert result["config_hash"] == reference["config_hash"]
    for key in ("train_loss", "val_loss", "val_accuracy", "train_samples"):  # tolerance 0
        assert [m[key] for m in result["epoch_metrics"]] == [m[key] for m in reference["epoch_metrics"]], key
    assert token not in launched.stdout + launched.stderr
    assert stopped_code == 128 + signal.SIGTERM and drained_s < 60
    assert not (tmp_path / "stopped" / "result.json").exists()
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == ("python -m trainer.launchers.spark: error: --remote: "
                                                       f"{remote} refused the token in ${CONNECT_TOKEN_ENV}")
    assert not (tmp_path / "refused" / "result.json").exists()


# data_path platform (#53): Spark's own ETL in the run's application or session, then TorchDistributor.
PLATFORM_SMALL = dict(generated_train_size=300, generated_test_size=40, max_length=32)
# The ETL alone, in an application of its own (a subprocess: the test process keeps no JVM): the
# launcher's session on the cluster, spark_etl writing each split's rows under argv[3].
ETL_ALONE = """
import os, sys
from pathlib import Path
from types import SimpleNamespace
from trainer import platform_data
from trainer.config import TrainConfig
from trainer.options import load_yaml
from trainer.launchers._spark import session
from trainer.launchers._spark_etl import spark_etl
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
cfg = TrainConfig(**load_yaml(sys.argv[1])).validate()
spark = session(cfg, SimpleNamespace(remote=None, master=sys.argv[2], num_processes=2, spark_conf=[],
                                     secret_file=None))
try:
    _, directories = platform_data.etl_run(cfg)
    spark_etl(spark, cfg, directories, Path(sys.argv[3]))
finally:
    spark.stop()
"""


def etl_directories(platform_data_dir: Path) -> list[Path]:
    return sorted(platform_data_dir.glob("etl-*"))


@pytest.fixture(scope="module")
def loader_reference(tmp_path_factory, token_cache) -> dict:
    """torchrun's result on the DataLoader path, 2 processes, 1 epoch of PLATFORM_SMALL: what the
    platform path's runs must give. Once for the module: each run of it costs seconds."""
    directory = tmp_path_factory.mktemp("loader-reference")
    cfg = TrainConfig(**{**TINY, "epochs": 1, **PLATFORM_SMALL, "output_dir": str(directory / "out"),
                         "cache_dir": str(token_cache)}).validate()
    run(torchrun_command(2, "--config", str(write_config(cfg, directory / "run.yml"))))
    return json.loads((directory / "out" / "result.json").read_text())


def test_spark_etl_then_torch_distributor_train_as_the_loader_path(loopback_spark, make_config, tmp_path,
                                                                   loader_reference):
    """One application reads the staged reviews, tokenizes them on its executors and writes the rows; its
    2 training processes train on them to torchrun's numbers on the loader path. The ETL's rows are
    removed afterwards, the staged reviews kept. (The same in a Connect session: the lab's pipeline
    test, tests/harness/test_bench_lab.py.)"""
    shared = tmp_path / "shared"
    cfg = make_config(epochs=1, data_path="platform", platform_data_dir=str(shared), **PLATFORM_SMALL)
    launched = spark_launch(loopback_spark, "--config", str(write_config(cfg, tmp_path / "run.yml")),
                            "--num-processes", "2")
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]

    result = json.loads((tmp_path / "out" / "result.json").read_text())
    validate_result(result)
    assert result["framework_label"].startswith(STANDALONE_LABEL)
    assert result["framework_label"].endswith(" + platform ETL")
    assert result["world_size"] == 2 and result["data_fingerprint"] == loader_reference["data_fingerprint"]
    for key in ("train_loss", "val_loss", "val_accuracy", "train_samples"):  # tolerance 0
        assert ([m[key] for m in result["epoch_metrics"]]
                == [m[key] for m in loader_reference["epoch_metrics"]]), key
    timeline = result["timeline_unix"]
    assert timeline["etl_started"] < timeline["etl_ended"] <= timeline["data_started"]
    assert not etl_directories(shared)  # the ETL's rows: removed with the run
    staged = list(shared.glob("reviews-*/train/*.parquet"))
    assert staged, f"the staged reviews are gone: {list(shared.iterdir())}"


def test_spark_etl_writes_the_loaders_tokens(loopback_spark, make_config, tmp_path):
    """The ETL alone on the cluster's executors: its rows, back as the core's splits, are token for token
    the DataLoader path's."""
    import numpy as np
    import pyarrow.parquet as pq

    from trainer import data, platform_data

    cfg = make_config(data_path="platform", platform_data_dir=str(tmp_path / "shared"), **PLATFORM_SMALL)
    _, env = launcher_command(loopback_spark, [])
    out_root = tmp_path / "shared" / "etl-alone"
    etl = subprocess.run([sys.executable, "-c", ETL_ALONE, str(write_config(cfg, tmp_path / "run.yml")),
                          loopback_spark.master_url, str(out_root)],
                         env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert etl.returncode == 0, etl.stdout[-3000:] + etl.stderr[-3000:]

    run_record, _ = platform_data.etl_run(cfg)
    tables = {split: pq.read_table(out_root / split) for split in data.SPLITS}
    written = platform_data.splits_from_tables(cfg, tables, run_record.tokens_fingerprint)
    loader = data.tokenized_splits(cfg)
    for split in data.SPLITS:
        assert (out_root / split / "_SUCCESS").is_file()  # Spark's DataFrameWriter wrote it
        assert written[split].fingerprint == loader[split].fingerprint
        assert np.array_equal(written[split].ids, loader[split].ids), split
        assert np.array_equal(written[split].offsets, loader[split].offsets), split
        assert np.array_equal(written[split].labels, loader[split].labels), split


@pytest.mark.parametrize(("flags", "said"), [
    (["--master", "local[2]"],
     "need --master spark://HOST:PORT ($SPARK_MASTER_URL) or --remote sc://HOST:PORT"),
    (["--remote", "spark://127.0.0.1:7077"],
     "--remote: must be sc://HOST:PORT of a Spark Connect server, got"),
    (["--remote", "sc://localhost:1", "--spark-conf", "spark.executor.cores=2"],
     "--spark-conf: a Spark Connect session runs with its server's conf; set it where the server starts"),
    (["--remote", "sc://localhost:1"], "--remote: nothing answers at localhost:1 ("),
])
@pytest.mark.core
def test_bad_flags_fail_before_spark_starts(tmp_path, flags, said):
    launched = subprocess.run([sys.executable, "-m", "trainer.launchers.spark", "--num-processes", "2",
                               *flags, "--output-dir", str(tmp_path)],
                              env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert launched.returncode == 2, launched.stderr
    last_line = launched.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"python -m trainer.launchers.spark: error: {said}")
    assert not list(tmp_path.iterdir())  # nothing written


# An application that registers with the master and waits (1 core, no UI of its own).
WAITING_APP = """
import os, sys, time
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master(sys.argv[1]).appName("dtlab-kill-target")
         .config("spark.authenticate", "true").config("spark.authenticate.secret", os.environ["TEST_SECRET"])
         .config("spark.ui.enabled", "false").config("spark.cores.max", "1").getOrCreate())
time.sleep(600)
"""


def active_apps(cluster) -> dict[str, str]:
    return {app["id"]: app["state"] for app in cluster.status().get("activeapps", [])
            if app.get("name") == "dtlab-kill-target"}


def test_the_master_ui_cannot_kill_an_application(loopback_spark, tmp_path):
    """spark.ui.killEnabled false, from the spark role's template: no kill link (and so no CSRF token) on
    the master's page, a kill POST finds no handler, and the application keeps running."""
    env = {**trainer_env(), "SPARK_LOCAL_IP": "127.0.0.1", "TEST_SECRET": loopback_spark.auth_secret}
    with open(tmp_path / "app.log", "wb") as log:
        app = subprocess.Popen([sys.executable, "-c", WAITING_APP, loopback_spark.master_url], env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not active_apps(loopback_spark):
            assert app.poll() is None, (tmp_path / "app.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the application did not register within 180 s"
            time.sleep(1)
        (app_id, state), = active_apps(loopback_spark).items()
        assert state in ("RUNNING", "WAITING")
        ui = loopback_spark.master_json_url.removesuffix("json/")
        page = urllib.request.urlopen(ui, timeout=10).read().decode()
        assert app_id in page and "app/kill" not in page and "csrfToken" not in page
        kill = urllib.request.Request(f"{ui}app/kill/?id={app_id}&terminate=true", data=b"", method="POST")
        try:
            with urllib.request.urlopen(kill, timeout=10) as answer:
                status = answer.status
        except urllib.error.HTTPError as error:
            status = error.code
        assert status == 405  # Spark 4 attaches no /app/kill handler when kills are off
        time.sleep(3)
        assert active_apps(loopback_spark).get(app_id) in ("RUNNING", "WAITING")  # not KILLED, not gone
        # What the spark role checks on the nodes: the master's effective setting, and no secret shown.
        environment = urllib.request.urlopen(f"{ui}environment/", timeout=10).read().decode()
        assert "<td>spark.ui.killEnabled</td><td>false</td>" in environment
        assert loopback_spark.auth_secret not in environment and loopback_spark.auth_secret not in page
    finally:
        tree = [psutil.Process(app.pid)] if app.poll() is None else []
        tree += [child for process in tree for child in process.children(recursive=True)]  # its JVM
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(tree, timeout=30)
        app.wait(timeout=30)
