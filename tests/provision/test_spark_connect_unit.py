"""The spark role's Spark Connect server unit (roles/spark/templates/dtlab-spark-connect.service.j2),
rendered as the role renders it: its application conf must be what a standalone spark cell sets for
itself (the launcher's spark_conf for N processes, and the platform's executor env), so that a cell's
training processes run the same way in both setups."""

import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pytest

from dtlab import paths
from dtlab.platforms import load_cluster
from dtlab.platforms.spark import executor_env, master_port
from trainer.launchers._spark import CONNECT_TOKEN_ENV, spark_conf

TEMPLATE = paths.REPO_ROOT / "roles" / "spark" / "templates" / "dtlab-spark-connect.service.j2"
WAIT_TEMPLATE = paths.REPO_ROOT / "roles" / "spark" / "templates" / "connect-wait-workers.py.j2"
SERVER_ONLY = {"spark.connect.grpc.binding.address", "spark.connect.grpc.binding.port"}


def render(cluster, threads: int, slots: int, gpu_cells: bool) -> str:
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True,
                                     extensions=["jinja2.ext.do"])
    environment.filters["bool"] = bool
    names = ("dtlab_user", "dtlab_code_dir", "dtlab_data_dir", "dtlab_venv_dir", "spark_home",
             "spark_conf_dir", "spark_master_port", "spark_master_service", "spark_connect_port",
             "spark_connect_service", "spark_connect_env_file")
    variables = {name: cluster.master.var(name) for name in names}
    variables["dtlab_master_address"] = cluster.master.address  # Ansible's hostvars lookup, resolved
    return environment.from_string(TEMPLATE.read_text()).render(
        ansible_managed="rendered by the test", dtlab_threads_per_worker=threads, spark_connect_slots=slots,
        spark_gpu_cells=gpu_cells, spark_connect_wait_script="/etc/spark/connect-wait-workers.py",
        spark_connect_workers_wait_s=150, **variables)


def exec_start(unit: str) -> list[str]:
    [line] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(paths.INVENTORY_DIR / "lab.yml")


@pytest.mark.parametrize(("threads", "slots", "device"), [(1, 2, "cpu"), (2, 3, "cpu"), (1, 2, "cuda")])
def test_the_servers_conf_is_what_a_standalone_cell_sets_for_itself(cluster, threads, slots, device):
    argv = exec_start(render(cluster, threads, slots, gpu_cells=device == "cuda"))
    conf = dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--conf")
    cell = spark_conf(SimpleNamespace(threads=threads, device=device),
                      SimpleNamespace(num_processes=slots, secret_file=None, spark_conf=[]))
    cell |= {f"spark.executorEnv.{key}": value for key, value in executor_env(cluster).items()}
    cell.pop("spark.app.name")  # the server's application is named as its unit (--name)
    assert {key: value for key, value in conf.items() if key not in SERVER_ONLY} == cell
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"  # pyspark sends its token only there
    assert conf["spark.connect.grpc.binding.port"] == str(cluster.var("spark_connect_port"))
    assert argv[argv.index("--name") + 1] == cluster.var("spark_connect_service")
    assert argv[argv.index("--master") + 1] == f"spark://{cluster.master.address}:{master_port(cluster)}"


def test_the_token_comes_from_the_env_file_and_never_from_argv(cluster):
    unit = render(cluster, 1, 2, gpu_cells=False)
    assert f"EnvironmentFile={cluster.var('spark_connect_env_file')}" in unit
    assert CONNECT_TOKEN_ENV not in " ".join(exec_start(unit))
    assert f"User={cluster.user}" in unit


def test_the_server_starts_once_every_worker_is_alive_and_systemd_waits_long_enough(cluster):
    unit = render(cluster, 1, 2, gpu_cells=False)
    assert "ExecStartPre=/etc/spark/connect-wait-workers.py" in unit
    assert "TimeoutStartSec=180" in unit  # the script's 150 s, then the server's own start


def wait_script(tmp_path, port: int, expected: int, wait_s: int) -> Path:
    text = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(WAIT_TEMPLATE.read_text()).render(
        ansible_managed="rendered by the test", dtlab_venv_dir=str(Path(sys.executable).parent.parent),
        dtlab_master_address="127.0.0.1", spark_master_webui_port=port, spark_expected_workers=expected,
        spark_connect_workers_wait_s=wait_s)
    script = tmp_path / "connect-wait-workers.py"
    script.write_text(text)
    return script


@pytest.mark.slow  # a real Spark master and two workers (about 15 s)
def test_the_wait_ends_once_every_worker_is_alive_and_is_bounded_otherwise(tmp_path, loopback_spark):
    port = loopback_spark.master_webui_port
    started = time.monotonic()
    every = subprocess.run([sys.executable, str(wait_script(tmp_path, port, expected=2, wait_s=60))],
                           capture_output=True, text=True, timeout=120)
    assert (every.returncode, every.stderr) == (0, "") and time.monotonic() - started < 30
    started = time.monotonic()
    short = subprocess.run([sys.executable, str(wait_script(tmp_path, port, expected=3, wait_s=4))],
                           capture_output=True, text=True, timeout=120)
    assert short.returncode == 0 and 4 <= time.monotonic() - started < 60  # it waited, then started anyway
    assert short.stderr.strip() == (f"spark connect: 2 of 3 workers alive at http://127.0.0.1:{port}/json/ "
                                    "after 4 s; starting anyway")
