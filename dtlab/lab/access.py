"""How the controller reaches lab nodes: the lab key pair, known_hosts from real host keys, ssh."""

from __future__ import annotations

import subprocess

from dtlab.errors import DtlabError
from dtlab.lab import network, nodes
from dtlab.lab.config import LabConfig
from dtlab.lab.host import run
from dtlab.waiting import wait_until


def ensure_keypair(config: LabConfig) -> str:
    """The lab's ed25519 key pair on the controller (0600, git-ignored); returns the public key line."""
    config.controller_dir.mkdir(parents=True, exist_ok=True)
    config.controller_dir.chmod(0o700)
    key = config.private_key_path
    if not key.exists():
        key.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"dtlab-lab-{config.name}", "-f", str(key)])
    key.chmod(0o600)
    return key.with_suffix(".pub").read_text().strip()


def write_known_hosts(config: LabConfig, host_keys: dict[str, str]) -> None:
    """One line per node, under its name and its address, with the key seeded into its root."""
    lines = [f"{node},{config.node_address(node)} {host_keys[node]}" for node in config.node_names]
    config.known_hosts_path.write_text("\n".join(lines) + "\n")
    config.known_hosts_path.chmod(0o600)


def ssh_options(config: LabConfig) -> list[str]:
    return ["-i", str(config.private_key_path), "-o", f"UserKnownHostsFile={config.known_hosts_path}",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5"]


def ssh_argv(config: LabConfig, node: str, *command: str, tty: bool = False) -> list[str]:
    """`ssh` to root@<node address> with the lab key; checks the guard first (hard safety rule)."""
    network.assert_guard(config)
    return ["ssh", *(["-t"] if tty else []), *ssh_options(config), f"root@{config.node_address(node)}",
            *command]


def run_on_node(config: LabConfig, node: str, command: str, timeout: float = 60,
                input_text: str | None = None) -> subprocess.CompletedProcess:
    """Run a shell command on a node as root; returns the completed process (no check)."""
    return subprocess.run(ssh_argv(config, node, command), capture_output=True, text=True,
                          timeout=timeout, input=input_text)


def node_state(config: LabConfig, node: str) -> str:
    """`systemctl is-system-running` over SSH, or why it could not be asked."""
    try:
        result = run_on_node(config, node, "systemctl is-system-running", timeout=10)
    except subprocess.TimeoutExpired:
        return "ssh-timeout"
    answer = result.stdout.strip()
    return answer if answer else f"ssh-failed ({result.stderr.strip()[:80]})"


def wait_ready(config: LabConfig, node_names: list[str], timeout: float = nodes.READY_TIMEOUT_S) -> None:
    """Until sshd accepts the lab key and systemd reports running/degraded on every node (bounded)."""
    waiting = list(node_names)
    last_state: dict[str, str] = {}

    def all_ready() -> bool:
        for node in list(waiting):
            if not nodes.running_pid(config, node):
                console = nodes.console_tail(config, node)
                raise DtlabError(f"lab {config.name}: {node} stopped while booting ({console});"
                                 f" see {config.node_dir(node)}/console.log")
            last_state[node] = node_state(config, node)
            if last_state[node] in ("running", "degraded"):
                waiting.remove(node)
        return not waiting

    if not wait_until(all_ready, timeout_s=timeout, every_s=0.3):
        node = waiting[0]
        raise DtlabError(f"lab {config.name}: {node} not ready after {timeout:.0f} s (state:"
                         f" {last_state[node]}); see {config.node_dir(node)}/console.log")
