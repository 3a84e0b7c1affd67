"""Start and stop one lab's apt proxy (dtlab.aptproxy) on its bridge address, by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.lab import host
from dtlab.lab.config import APT_ARCHIVE_CACHE_DIR, LabConfig
from dtlab.waiting import wait_until

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
    log_path = config.run_dir / "aptproxy.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   cwd=paths.REPO_ROOT, env=environment, start_new_session=True)
    _pid_file(config).write_text(f"{process.pid}\n")

    def listening() -> bool:
        if process.poll() is not None:
            raise DtlabError(f"lab {config.name}: the apt proxy exited at start (port {config.apt_proxy_port}"
                             f" in use?); see {log_path}")
        try:
            with socket.create_connection((str(config.bridge_address), config.apt_proxy_port), timeout=1):
                return True
        except OSError:
            return False

    wait_until(listening, timeout_s=START_TIMEOUT_S, every_s=0.05,
               what=f"lab {config.name}'s apt proxy to listen on {_listen(config)}; see {log_path}")
    return process.pid


def stop(config: LabConfig) -> None:
    pid = running_pid(config)
    if pid:
        os.kill(pid, signal.SIGTERM)

        def exited() -> bool:
            _reap(pid)
            return not running_pid(config)

        if not wait_until(exited, timeout_s=STOP_GRACE_S, every_s=0.05):
            os.kill(pid, signal.SIGKILL)
            _reap(pid)
    _pid_file(config).unlink(missing_ok=True)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child: init reaps it
        os.waitpid(pid, os.WNOHANG)
