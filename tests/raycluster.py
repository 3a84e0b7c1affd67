"""A real Ray cluster on 127.0.0.1 for tests: a head with no CPUs (as the lab's master) and N worker
raylets of `cpus_per_worker` CPUs each, with token authentication on.

Each node is a `ray start --block` child of this helper in its own session; ``stop()`` ends it and
everything below it by PID. Never `ray stop`: that ends every Ray process on the machine, the lab
containers' ones included. Ray's temp dir is short (its unix sockets have a 107-byte path limit).

    with RayCluster(workers=2) as cluster:
        cluster.address      # 127.0.0.1:<port>, for ray.init / --address
        cluster.env          # RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH and extra_env, for a driver
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import psutil

from dtlab.waiting import wait_until

LOOPBACK = "127.0.0.1"
RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 100 * 2**20  # the default takes 30 % of memory per node; the tests move kilobytes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


class RayCluster:
    def __init__(self, workers: int = 2, cpus_per_worker: int = 1, startup_timeout_s: float = 120.0,
                 extra_env: dict[str, str] | None = None):
        """extra_env: Ray settings (RAY_... variables) for every node and, through `env`, for a driver."""
        self.workers, self.cpus_per_worker = workers, cpus_per_worker
        self.startup_timeout_s = startup_timeout_s
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.address = f"{LOOPBACK}:{self.gcs_port}"
        self.scratch = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: /tmp/rayXXXXXXXX
        self.token_path = self.scratch / "auth_token"
        self.token_path.touch(mode=0o600)
        self.token_path.write_text(secrets.token_hex(24))
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path),
                    **(extra_env or {})}
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> RayCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        common = ["--block", f"--node-ip-address={LOOPBACK}", f"--temp-dir={self.scratch / 't'}",
                  f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats"]
        try:
            self._spawn("head", "--head", f"--port={self.gcs_port}", f"--dashboard-host={LOOPBACK}",
                        f"--dashboard-port={self.dashboard_port}", f"--ray-client-server-port={free_port()}",
                        f"--dashboard-agent-listen-port={free_port()}", "--num-cpus=0", *common)
            for index in range(self.workers):  # one at a time: on 2 busy cores, two at once can time out
                self._wait_for_nodes(index + 1)
                # One log monitor (the head's) reads the shared session's logs; more would repeat each line.
                self._spawn(f"worker-{index}", f"--address={self.address}", "--include-log-monitor=false",
                            f"--num-cpus={self.cpus_per_worker}",
                            f"--dashboard-agent-listen-port={free_port()}", *common)
            self._wait_for_nodes(self.workers + 1)
        except BaseException:
            self.stop()  # never leave raylets behind when start-up fails
            raise

    def stop(self) -> None:
        """SIGTERM each node's process group (workers first), SIGKILL what is left after 10 s, all by PID."""
        targets: list[psutil.Process] = []
        for process in self.processes:  # Ray's worker processes sit in process groups of their own
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(process.pid)
                targets += [root, *root.children(recursive=True)]
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(targets, timeout=10)  # a GCS may wait longer for its raylets
        for target in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                target.kill()
        psutil.wait_procs(alive, timeout=10)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)  # reap our own children
        self.processes.clear()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def descendants(self) -> list[psutil.Process]:
        """Every process this cluster started: the nodes' daemons and Ray's worker processes."""
        found = []
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                found += psutil.Process(process.pid).children(recursive=True)
        return found

    def log(self, name: str) -> str:
        return (self.scratch / f"{name}.log").read_text(errors="replace")

    def _wait_for_nodes(self, count: int) -> None:
        wait_until(lambda: len(self._alive_nodes()), until=lambda alive: alive >= count, every_s=0.5,
                   timeout_s=self.startup_timeout_s, what=f"{count} alive Ray nodes at {self.address}")

    def _alive_nodes(self) -> list[dict]:
        """The alive nodes, from the dashboard's state API (token-authenticated); [] until it answers."""
        for process, name in zip(self.processes, ["head", *[f"worker-{i}" for i in range(self.workers)]],
                                 strict=False):
            if process.poll() is not None:
                raise RuntimeError(f"ray {name} exited with {process.returncode}:\n{self.log(name)[-3000:]}")
        request = urllib.request.Request(f"http://{LOOPBACK}:{self.dashboard_port}/api/v0/nodes",
                                         headers={"Authorization": f"Bearer {self.token_path.read_text()}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                nodes = json.load(answer)["data"]["result"]["result"]
        except (OSError, ValueError, KeyError):  # the dashboard is not up yet
            return []
        return [node for node in nodes if node["state"] == "ALIVE"]

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.scratch / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the node
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # drivers forward it
        env["RAY_raylet_start_wait_time_s"] = "120"  # Ray's 30 s is tight for a raylet on 2 busy cores
        # Ray's own actors (Ray Train's placement-group cleaner) use the state API without an address, which
        # fails when it finds several clusters among this host's processes (the lab's containers' included).
        env["RAY_ADDRESS"] = self.address
        self.processes.append(subprocess.Popen([RAY, "start", *args], env={**env, **self.env},
                                               cwd=self.scratch, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))
