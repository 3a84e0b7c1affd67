"""Start and stop one lab's apt proxy (dtlab.aptproxy) on its bridge address, by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.lab import host
from dtlab.lab.config import APT_ARCHIVE_CACHE_DIR, LabConfig

START_TIMEOUT_S = 10
STOP_GRACE_S = 3


def _pid_file(config: LabConfig) -> Path:
    return config.run_dir / "aptproxy.pid"


def _listen(config: LabConfig) -> str:
    return f"{config.bridge_address}:{config.apt_proxy_port}"


def running_pid(config: LabConfig) -> int | None:
    try:
        pid = int(_pid_file(config).read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError):
        return None
    is_ours = b"dtlab.aptproxy" in argv and _listen(config).encode() in argv and status != "Z"
    return pid if is_ours else None


def ensure_running(config: LabConfig) -> int:
    pid = running_pid(config)
    if pid:
        return pid
    allowed = sorted({source.host for source in host.host_apt_sources() if source.host})
    argv = [sys.executable, "-m", "dtlab.aptproxy", "--listen", _listen(config),
            "--cache-dir", str(APT_ARCHIVE_CACHE_DIR)]
    argv += [option for name in allowed for option in ("--allow", name)]
    environment = {**os.environ, "PYTHONPATH": str(paths.REPO_ROOT)}
    with open(config.run_dir / "aptproxy.log", "ab") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   cwd=paths.REPO_ROOT, env=environment, start_new_session=True)
    _pid_file(config).write_text(f"{process.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DtlabError(f"lab {config.name}: the apt proxy exited at start (port {config.apt_proxy_port}"
                             f" in use?); see {config.run_dir / 'aptproxy.log'}")
        try:
            with socket.create_connection((str(config.bridge_address), config.apt_proxy_port), timeout=1):
                return process.pid
        except OSError:
            time.sleep(0.05)
    raise DtlabError(f"lab {config.name}: the apt proxy did not listen within {START_TIMEOUT_S} s;"
                     f" see {config.run_dir / 'aptproxy.log'}")


def stop(config: LabConfig) -> None:
    pid = running_pid(config)
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while running_pid(config) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if running_pid(config):
            os.kill(pid, signal.SIGKILL)
            _reap(pid)
    _pid_file(config).unlink(missing_ok=True)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child: init reaps it
        os.waitpid(pid, os.WNOHANG)
