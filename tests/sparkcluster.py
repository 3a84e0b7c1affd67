"""A real Spark standalone cluster on 127.0.0.1 for tests and benchmarks: one master, N workers.

The pyspark wheel ships no start-master.sh, so the Master and Worker classes run through
``$SPARK_HOME/bin/spark-class`` with SPARK_HOME = the pyspark package directory. Every daemon is
a child process of this helper; ``stop()`` ends each one, and any executor it left behind, by PID.

    with SparkStandaloneCluster(workers=2, auth_secret="s3cret") as cluster:
        cluster.master_url    # spark://127.0.0.1:<port>

The daemons' spark-defaults.conf is rendered from the spark role's own template and defaults
(roles/spark), so the test cluster runs with the settings the nodes get: spark.ui.killEnabled,
spark.master.rest.enabled, spark.authenticate.

Used as a module-scoped fixture by tests/trainer/test_spark_launcher.py and by
benchmarks/launcher_overhead.py.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import jinja2
import psutil
import pyspark
import yaml

from dtlab.waiting import wait_until

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_ROLE = Path(__file__).resolve().parent.parent / "roles" / "spark"
LOOPBACK = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"  # what bin/spark-submit execs
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def role_defaults() -> dict:
    """roles/spark/defaults/main.yml: the one place for settings such as spark_ui_kill_enabled."""
    return yaml.safe_load((SPARK_ROLE / "defaults" / "main.yml").read_text())


def render_spark_defaults(master_port: int, auth_secret: str | None, extra: dict[str, str],
                          **role_variables) -> str:
    """spark-defaults.conf from the spark role's template, as Ansible renders it (trim_blocks), for a
    loopback master and CPU-only workers; `role_variables` override the role's defaults."""
    variables = {
        **role_defaults(),
        **role_variables,
        "ansible_managed": "rendered by tests/sparkcluster.py from roles/spark",
        "dtlab_master_address": LOOPBACK,
        "spark_master_port": master_port,
        "spark_authenticate": bool(auth_secret),
        "spark_auth_secret": auth_secret or "",
        "dtlab_venv_dir": sys.prefix,
        "spark_gpu_worker": False,
        "spark_extra_defaults": extra,
    }
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True,
                                     keep_trailing_newline=True)
    template = environment.from_string((SPARK_ROLE / "templates" / "spark-defaults.conf.j2").read_text())
    return template.render(variables)


def connect_server_conf(processes: int, threads: int = 1) -> dict[str, str]:
    """A Spark Connect server's application conf for runs of `processes` x `threads`: what a standalone
    run sets for itself (the launcher's spark_conf), with the spark role's JVM options, as on the nodes."""
    from trainer.launchers._spark import spark_conf

    jvm_options = role_defaults()["spark_jvm_options"]
    return spark_conf(SimpleNamespace(threads=threads, device="cpu"), SimpleNamespace(
        num_processes=processes, secret_file=None,
        spark_conf=[f"spark.{side}.extraJavaOptions={jvm_options}" for side in ("driver", "executor")]))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


class SparkStandaloneCluster:
    """Master + ``workers`` workers, each offering ``cores_per_worker`` task slots, all on loopback."""

    def __init__(self, workers: int = 2, cores_per_worker: int = 1, worker_memory: str = "2g",
                 auth_secret: str | None = None, startup_timeout_s: float = 90.0):
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.worker_memory = worker_memory
        self.auth_secret = auth_secret
        self.startup_timeout_s = startup_timeout_s
        self.master_port = free_port()
        self.master_webui_port = free_port()
        self.master_url = f"spark://{LOOPBACK}:{self.master_port}"
        self.master_json_url = f"http://{LOOPBACK}:{self.master_webui_port}/json/"
        self.scratch = Path(tempfile.mkdtemp(prefix="dtlab-spark-"))
        self.processes: list[subprocess.Popen] = []
        self.connect_server: subprocess.Popen | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> SparkStandaloneCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._spawn("master", MASTER_CLASS, "--host", LOOPBACK, "--port", str(self.master_port),
                        "--webui-port", str(self.master_webui_port))
            for index in range(self.workers):
                work_dir = self.scratch / f"worker-{index}"
                work_dir.mkdir()
                self._spawn(f"worker-{index}", WORKER_CLASS, self.master_url, "--host", LOOPBACK,
                            "--cores", str(self.cores_per_worker), "--memory", self.worker_memory,
                            "--webui-port", str(free_port()), "--work-dir", str(work_dir))
            self._wait_for_alive_workers()
        except BaseException:
            self.stop()  # never leave daemons behind when start-up fails
            raise

    def stop(self) -> None:
        """SIGTERM each daemon and all below it (executors, Python workers) by PID; delete the scratch dir."""
        targets: list[psutil.Process] = []
        for process in self.processes:
            try:
                parent = psutil.Process(process.pid)
                targets += [parent, *parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        for target in targets:
            with contextlib.suppress(psutil.NoSuchProcess):
                target.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(targets, timeout=15)
        for target in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                target.kill()
        psutil.wait_procs(alive, timeout=5)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)  # reap our own children
        self.processes.clear()
        shutil.rmtree(self.scratch, ignore_errors=True)  # logs, work dirs, the secret's conf file

    def start_connect_server(self, token: str, conf: dict[str, str], slots: int) -> str:
        """A Spark Connect server on this cluster, as `start-connect-server.sh` runs it: one long-lived
        application whose driver and executors stay up between sessions. It listens on loopback with
        `token` (from the environment, never argv); `conf` is its application's conf (executor cores,
        slots, JVM options; the auth secret comes from the cluster's spark-defaults.conf). Returns once
        the master has granted it `slots` cores, i.e. its executors are up: the sc:// URL for --remote."""
        if self.connect_server is not None:
            raise RuntimeError("a Spark Connect server is already running on this cluster")
        port = free_port()
        conf = {"spark.connect.grpc.binding.address": LOOPBACK, "spark.connect.grpc.binding.port": str(port),
                **conf}
        argv = ["--master", self.master_url, "--class", CONNECT_SERVER_CLASS]
        argv += [item for key, value in conf.items() for item in ("--conf", f"{key}={value}")]
        self.connect_server = self._spawn("connect-server", SUBMIT_CLASS, *argv, "spark-internal",
                                          extra_env={"SPARK_CONNECT_AUTHENTICATE_TOKEN": token,
                                                     "PYSPARK_PYTHON": sys.executable})

        def not_ready_because() -> str | None:
            if self.connect_server.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited with {self.connect_server.returncode}:\n"
                                   f"{self.log('connect-server')[-3000:]}")
            try:
                socket.create_connection((LOOPBACK, port), timeout=1).close()
                granted = sum(app.get("cores", 0) for app in self.status().get("activeapps", []))
            except (OSError, json.JSONDecodeError, http.client.HTTPException) as error:
                return f"not answering yet ({type(error).__name__})"
            return None if granted >= slots else f"{granted} of {slots} cores granted"

        last_reason = wait_until(not_ready_because, until=lambda reason: reason is None,
                                 timeout_s=self.startup_timeout_s, every_s=0.5)
        if last_reason is not None:
            self.stop_connect_server()
            raise TimeoutError(f"Spark Connect server not ready after {self.startup_timeout_s:.0f} s: "
                               f"{last_reason}")
        return f"sc://localhost:{port}"  # "localhost": pyspark sends a token without TLS only there

    def stop_connect_server(self) -> None:
        """SIGTERM the Connect server by PID (its application ends, the master frees its executors)."""
        server, self.connect_server = self.connect_server, None
        if server is None:
            return
        with contextlib.suppress(ProcessLookupError):
            server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=30)
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)
        self.processes.remove(server)

    # --- what tests read -------------------------------------------------------------------
    def status(self) -> dict:
        with urllib.request.urlopen(self.master_json_url, timeout=5) as response:
            return json.load(response)

    def alive_workers(self) -> int:
        return sum(1 for worker in self.status().get("workers", []) if worker.get("state") == "ALIVE")

    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def log(self, name: str) -> str:
        return (self.scratch / f"{name}.log").read_text(errors="replace")

    # --- internals -------------------------------------------------------------------------
    def _environment(self) -> dict[str, str]:
        env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP=LOOPBACK,
                   SPARK_LOG_DIR=str(self.scratch), SPARK_CONF_DIR=str(self._conf_dir()))
        env.pop("SPARK_MASTER_HOST", None)
        return env

    def _conf_dir(self) -> Path:
        """The daemons' spark-defaults.conf, from the spark role's template: the shared secret when
        auth is on (0600, never argv), kill links off as on the nodes."""
        conf_dir = self.scratch / "conf"
        if not conf_dir.exists():
            conf_dir.mkdir()
            defaults = conf_dir / "spark-defaults.conf"
            defaults.touch(mode=0o600)
            defaults.write_text(render_spark_defaults(self.master_port, self.auth_secret,
                                                      {"spark.ui.showConsoleProgress": "false"}))
        return conf_dir

    @property
    def spark_defaults_path(self) -> Path:
        return self._conf_dir() / "spark-defaults.conf"

    def _spawn(self, name: str, java_class: str, *args: str,
               extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.scratch / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the daemon
        command = [str(SPARK_HOME / "bin" / "spark-class"), java_class, *args]
        # spark-class execs java, so this PID is the daemon's own PID.
        process = subprocess.Popen(command, env={**self._environment(), **(extra_env or {})}, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def _wait_for_alive_workers(self) -> None:
        """Until the master lists every worker ALIVE, within startup_timeout_s. While the master starts,
        its /json/ may refuse or drop the connection, or answer with an empty or partial body: all are
        retried until the deadline, and the last one is named if it passes."""
        names = ["master", *[f"worker-{index}" for index in range(self.workers)]]

        def not_ready_because() -> str | None:
            """None once every worker is ALIVE; until then, why not yet."""
            for process, name in zip(self.processes, names, strict=True):
                if process.poll() is not None:
                    log_tail = self.log(name)[-3000:]
                    raise RuntimeError(f"spark {name} exited with {process.returncode}:\n{log_tail}")
            try:
                alive = self.alive_workers()
            except json.JSONDecodeError as error:
                return f"the master's /json/ answered with an empty or partial body ({error})"
            except (OSError, http.client.HTTPException) as error:  # refused, reset, HTTP errors, cut short
                return f"the master's /json/ did not answer ({type(error).__name__}: {error})"
            return None if alive == self.workers else f"{alive} of {self.workers} workers ALIVE"

        last_reason = wait_until(not_ready_because, until=lambda reason: reason is None,
                                 timeout_s=self.startup_timeout_s, every_s=0.5)
        if last_reason is not None:
            raise TimeoutError(f"spark standalone cluster not ready after {self.startup_timeout_s:.0f} s"
                               f" ({self.master_json_url}): {last_reason}")
