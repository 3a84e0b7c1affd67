"""The local lab, for real: nodes boot, Ansible and SSH reach them, they talk to each other, torch runs.

Uses the session fixture `lab` (tests/conftest.py): the instance "dtlabtest", brought down at the end.
"""

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import dtlab.lab
from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.lab import access, network, nodes
from dtlab.lab.config import load_config as load_lab_config

pytestmark = pytest.mark.lab

ALLREDUCE_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"ALLREDUCE rank={dist.get_rank()} world={dist.get_world_size()} sum={value.item():.0f}", flush=True)
dist.destroy_process_group()
"""


def on_node(lab, node, command, timeout=60, input_text=None):
    return access.run_on_node(lab, node, command, timeout=timeout, input_text=input_text)


@pytest.mark.core
def test_guard_blackholes_the_whole_lab_range_while_up(lab):
    routes = subprocess.run(["ip", "route", "show", "type", "blackhole"], capture_output=True, text=True,
                            check=True).stdout
    assert f"blackhole {lab.address_range}" in routes
    assert lab.subnet.subnet_of(lab.address_range)
    dtlab.lab.assert_guard(lab.name)  # does not raise


def test_ansible_pings_every_node_over_ssh(lab):
    ansible = Path(sys.executable).parent / "ansible"
    result = subprocess.run([ansible, "all", "-i", lab.inventory_path, "-m", "ping", "-o"],
                            capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for node in lab.node_names:
        assert f"{node} | SUCCESS" in result.stdout


def test_inventory_has_the_reference_groups_under_lab(lab):
    inventory = yaml.safe_load(lab.inventory_path.read_text())
    groups = inventory["lab"]["children"]
    assert list(groups["master"]["hosts"]) == ["node0"]
    assert list(groups["workers"]["hosts"]) == lab.node_names[1:]
    for node in lab.node_names:
        assert inventory["lab"]["hosts"][node]["ansible_host"] == str(lab.node_address(node))


def test_node1_reaches_node0_by_name_and_by_address(lab):
    for target in ("node0", str(lab.node_address("node0"))):
        probe = (f"python3 -c \"import socket; s = socket.create_connection(('{target}', 22), timeout=5);"
                 " print(s.recv(64).decode().strip())\"")
        result = on_node(lab, "node1", probe)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("SSH-2.0-"), (target, result.stdout)


def test_each_node_has_its_address_on_a_nic_named_like_a_kvm_guests(lab):
    assert lab.node_ifname == "enp1s0"
    for node in lab.node_names:
        shown = on_node(lab, node, f"ip -o -4 addr show dev {lab.node_ifname}")
        assert shown.returncode == 0 and f"inet {lab.node_address(node)}/24" in shown.stdout, shown.stderr
        assert on_node(lab, node, "ip link show dev eth0").returncode != 0  # no eth0 to fall back on


@pytest.mark.core
def test_nodes_have_no_way_out_and_no_dns(lab):
    # `ip route get` asks the node's kernel only: no packet is sent.
    result = on_node(lab, "node1", "ip route show default; wc -c < /etc/resolv.conf; ip route get 192.0.2.1")
    assert result.stdout.split() == ["0"], result.stdout  # no default route, empty resolv.conf
    assert "unreachable" in result.stderr


def ask_proxy(lab, url: str) -> str:
    """What the lab's apt proxy answers a node's GET of `url`: an HTTP status, or the error's name."""
    script = ("import urllib.request as u, urllib.error as e\n"
              f"opener = u.build_opener(u.ProxyHandler({{'http': '{lab.apt_proxy_url}'}}))\n"
              f"try: print(opener.open('{url}', timeout=10).status)\n"
              "except e.HTTPError as error: print(error.code)\n"
              "except OSError as error: print(type(error).__name__)")
    return on_node(lab, "node1", f"python3 -c {shlex.quote(script)}").stdout.strip()


def test_the_session_lab_is_offline_with_its_bundle_mounted_read_only(lab):
    """The session lab is an offline lab (tests/conftest.py): no apt proxy, the bundle in every node."""
    report = dtlab.lab.status(lab.name)
    assert report["apt_proxy_pid"] is None and report["bundle"]
    assert ask_proxy(lab, "http://deb.debian.org/debian/") == "URLError"  # nothing listens: no way out
    inventory = yaml.safe_load(lab.inventory_path.read_text())
    for node, host in inventory["lab"]["hosts"].items():
        assert (host["dtlab_bundle"], host["dtlab_bundle_push"]) == (report["bundle"], False)
        mounted = on_node(lab, node, f"test -s {lab.bundle_mount}/manifest.json"
                                     f" && touch {lab.bundle_mount}/x")
        assert mounted.returncode != 0 and "Read-only file system" in mounted.stderr, mounted.stderr


def test_a_lab_keeps_the_way_it_was_made(lab, tmp_path):
    with pytest.raises(DtlabError, match=rf"^lab {lab.name}: exists offline from .*; run `invoke lab.down"):
        dtlab.lab.up(lab.name, bundle=tmp_path)
    with pytest.raises(DtlabError, match=r"^lab --bundle .*: no manifest.json there; build one with"):
        dtlab.lab.up(f"{lab.name}n", node_count=2, bundle=tmp_path)
    assert dtlab.lab.leftovers(f"{lab.name}n") == []


@pytest.mark.slow
def test_torchrun_allreduce_across_the_two_workers(lab, lab_torch_python):
    workers = lab.node_names[1:3]
    socket_ifname = lab.node_ifname
    runs = []
    for rank, node in enumerate(workers):
        assert on_node(lab, node, "cat > /tmp/allreduce.py", input_text=ALLREDUCE_SCRIPT).returncode == 0
        command = (f"GLOO_SOCKET_IFNAME={socket_ifname} OMP_NUM_THREADS=1"
                   f" {lab_torch_python} -m torch.distributed.run"
                   f" --nnodes=2 --nproc-per-node=1 --node-rank={rank} --master-addr={workers[0]}"
                   " --master-port=29500 /tmp/allreduce.py")
        runs.append(subprocess.Popen(dtlab.lab.ssh_argv(node, command, name=lab.name), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    for rank, (run, output) in enumerate(zip(runs, outputs, strict=True)):
        assert run.returncode == 0, output[-2000:]
        assert f"ALLREDUCE rank={rank} world=2 sum=3" in output


def test_restart_node1_alone_and_it_comes_back(lab):
    on_node(lab, "node1", "touch /run/before-restart /root/before-restart")
    others_before = {node: nodes.running_pid(lab, node) for node in lab.node_names if node != "node1"}
    dtlab.lab.restart_node("node1", lab.name)
    assert on_node(lab, "node1", "systemctl is-system-running").stdout.strip() in ("running", "degraded")
    exists = "for f in /run/before-restart /root/before-restart; do test -e $f; echo $?; done"
    after = on_node(lab, "node1", exists)
    assert after.stdout.split() == ["1", "0"]  # /run is fresh (it really rebooted), the disk is kept
    assert {node: nodes.running_pid(lab, node) for node in others_before} == others_before


def test_second_up_changes_nothing(lab):
    pids = {node: nodes.running_pid(lab, node) for node in lab.node_names}
    inventory_before = lab.inventory_path.read_text()
    started = time.monotonic()
    dtlab.lab.up(lab.name)
    assert time.monotonic() - started < 10
    assert {node: nodes.running_pid(lab, node) for node in lab.node_names} == pids
    assert lab.inventory_path.read_text() == inventory_before


def test_up_recovers_a_node_whose_nspawn_was_killed(lab):
    pid = nodes.running_pid(lab, "node2")
    node_processes = nodes.cgroup_pids(lab, "node2") - {pid}  # the node's systemd, sshd, ...
    assert node_processes
    nodes._signal(pid, signal.SIGKILL)  # a crash: no clean shutdown, stale PID file left behind
    deadline = time.monotonic() + 10
    while nodes.running_pid(lab, "node2") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert nodes.running_pid(lab, "node2") is None
    dtlab.lab.up(lab.name)
    assert nodes.running_pid(lab, "node2") not in (None, pid)
    # The orphaned node (nspawn's death does not end it) was killed, not left beside the new one.
    assert node_processes.isdisjoint(nodes.cgroup_pids(lab, "node2"))
    assert on_node(lab, "node2", "hostname").stdout.strip() == "node2"


def test_status_reports_guard_and_running_nodes(lab):
    report = dtlab.lab.status(lab.name)
    assert report["guard"] == f"blackhole {lab.address_range}"
    assert {info["systemd"] for info in report["nodes"].values()} <= {"running", "degraded"}
    json.dumps(report)  # plain data, printable by tasks and tools


def test_a_second_lab_comes_up_beside_keeps_node_files_and_goes_down_without_leftovers(lab):
    name = f"{lab.name}x"
    try:
        other = dtlab.lab.up(name, node_count=2)
        assert other.subnet != lab.subnet and not other.subnet.overlaps(lab.subnet)
        assert on_node(other, "node1", "hostname").stdout.strip() == "node1"
        # An online lab: apt reaches Debian through its proxy, which refuses every other host.
        result = on_node(other, "node1", "apt-get -q update", timeout=180)
        assert result.returncode == 0, result.stdout[-500:] + result.stderr[-500:]
        assert ask_proxy(other, "http://example.org/") == "403"  # refused, never forwarded
        # /etc/hosts belongs to Ansible after creation: a later up must not rewrite it.
        on_node(other, "node1", "echo '10.213.1.1 managed-by-ansible' >> /etc/hosts")
        dtlab.lab.down(name)
        assert dtlab.lab.leftovers(name) == []
        dtlab.lab.up(name)
        assert "managed-by-ansible" in on_node(other, "node1", "cat /etc/hosts").stdout
        on_node(other, "node1", f"touch {other.shared_checkpoint_mount}/checkpoint-of-a-cell")
        assert (other.shared_dir / "checkpoint-of-a-cell").exists()
    finally:
        dtlab.lab.down(name, wipe=True)
    assert dtlab.lab.leftovers(name) == []
    assert not other.run_dir.exists(), "a wipe leaves nothing of the lab, its shared disk neither"
    assert not network.link_exists(other.bridge_ifname)
    assert network.guard_present(lab.address_range)  # shared, never removed
    assert nodes.running_pid(lab, "node0")  # the session lab is untouched


def test_a_second_lab_on_a_taken_subnet_is_refused(lab):
    name = f"{lab.name}c"
    with pytest.raises(DtlabError, match="already in use"):
        dtlab.lab.up(name, node_count=2, subnet=str(lab.subnet))
    dtlab.lab.down(name, wipe=True)
    assert dtlab.lab.leftovers(name) == []


def test_lab_ssh_task_runs_a_command_on_a_node(lab):
    invoke = Path(sys.executable).parent / "invoke"
    result = subprocess.run([invoke, "lab.ssh", "node0", "--name", lab.name, "--command", "hostname"],
                            capture_output=True, text=True, timeout=60, cwd=paths.REPO_ROOT)
    assert result.stdout.strip() == "node0", result.stderr


def test_down_never_touches_an_interface_the_lab_did_not_create(lab):
    name = f"{lab.name[:5]}zz"  # its bridge name fits 15 chars and is predictable: "<name>-br"
    foreign = load_lab_config(name).bridge_ifname
    subprocess.run(["ip", "link", "add", foreign, "type", "bridge"], check=True)  # someone else's
    try:
        with pytest.raises(DtlabError, match="did not create it"):
            dtlab.lab.up(name, node_count=2)
        dtlab.lab.down(name, wipe=True)
        assert network.link_exists(foreign)  # still there: not ours to delete
    finally:
        subprocess.run(["ip", "link", "delete", foreign], check=False)
