"""The common role's /etc/hosts: a node's own name resolves to its cluster address first.

Ubuntu's installer and cloud images write `127.0.1.1 <hostname>`; with it first, Slurm's daemons (bound to
what their host name resolves to: CommunicationParameters=NoInAddrAny) would listen on 127.0.1.1 and the slurm
role refuses the node. The role's tasks run for real on a copy of such a file (its path is the role's
common_etc_hosts_path), and glibc's own resolver reads the result (getent, through a private mount namespace
whose /etc/hosts is the copy)."""

import os
import shutil
import subprocess

import pytest

from dtlab import paths

ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"
PLAYBOOK = paths.REPO_ROOT / "tests" / "provision" / "playbooks" / "etc_hosts.yml"
UBUNTU_INSTALLER_HOSTS = """127.0.0.1 localhost
127.0.1.1 node1

# The following lines are desirable for IPv6 capable hosts
::1     ip6-localhost ip6-loopback
"""


def converge(tmp_path, hosts_file):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  hosts:\n"
        "    node0: {ansible_host: 10.20.0.10}\n"
        "    node1: {ansible_host: 10.20.0.11, ansible_connection: local}\n"
        "    node2: {ansible_host: 10.20.0.12}\n")
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(PLAYBOOK), "--limit", "node1",
         "-e", f"common_etc_hosts_path={hosts_file}"],
        cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"})


def resolve(hosts_file, name):
    """getent ahostsv4 NAME as glibc answers with hosts_file as /etc/hosts (a private mount namespace)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a private /etc/hosts")
    answer = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f"mount --bind {hosts_file} /etc/hosts && getent ahostsv4 {name}"],
        capture_output=True, text=True, timeout=30, check=True)
    return answer.stdout.split()[0]


@pytest.mark.slow
def test_the_node_name_resolves_to_its_cluster_address_not_127_0_1_1(tmp_path):
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(UBUNTU_INSTALLER_HOSTS)
    assert resolve(hosts_file, "node1") == "127.0.1.1"  # what Slurm would bind to without the role

    first = converge(tmp_path, hosts_file)
    assert first.returncode == 0, first.stdout[-3000:]
    text = hosts_file.read_text()
    assert "127.0.1.1" not in text
    assert text.splitlines()[:4] == ["# BEGIN dtlab cluster hosts (managed by Ansible)", "10.20.0.10 node0",
                                     "10.20.0.11 node1", "10.20.0.12 node2"]
    assert "127.0.0.1 localhost" in text and "::1     ip6-localhost ip6-loopback" in text
    assert resolve(hosts_file, "node1") == "10.20.0.11"

    again = converge(tmp_path, hosts_file)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
    assert hosts_file.read_text() == text


def test_a_127_0_1_1_line_that_names_another_host_stays(tmp_path):
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n127.0.1.1 builder.example builder\n")
    assert converge(tmp_path, hosts_file).returncode == 0
    assert "127.0.1.1 builder.example builder" in hosts_file.read_text()
