"""The Ansible side of the GPU plan, on the controller with forced GPU facts (check mode, nothing written):
the trainer role picks torch's CUDA build through dtlab.gpucompat, and the nvidia role asks Ubuntu 24.04
for the package names its README cites."""

import hashlib
import http.server
import json
import os
import re
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from dtlab import paths

ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"
PLAYBOOKS = paths.REPO_ROOT / "tests" / "provision" / "playbooks"
BRANCH = yaml.safe_load((paths.INVENTORY_DIR / "group_vars" / "all.yml").read_text())["nvidia_driver_branch"]


def inventory_with(tmp_path, gpus):
    """Two local hosts (master node0, worker node1) with forced GPU facts: {host: (names, capabilities)}."""
    inventory_dir = tmp_path / "inventory"
    inventory_dir.mkdir()
    os.symlink(paths.INVENTORY_DIR / "group_vars", inventory_dir / "group_vars")
    lines = ["all:", "  children:"]
    for group, host in (("master", "node0"), ("workers", "node1")):
        names, capabilities = gpus.get(host, ([], []))
        lines += [f"    {group}:", "      hosts:", f"        {host}:",
                  "          ansible_connection: local",
                  "          ansible_python_interpreter: /usr/bin/python3",
                  f"          dtlab_gpu_count: {len(names)}",
                  f"          dtlab_gpu_names: {json.dumps(names)}",
                  f"          dtlab_gpu_compute_capabilities: {json.dumps(capabilities)}"]
    (inventory_dir / "hosts.yml").write_text("\n".join(lines) + "\n")
    return inventory_dir / "hosts.yml"


def playbook(tmp_path, inventory, name, *extra):
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"}
    # The inventory is outside the checkout, so dtlab_repo_dir (its parent, by default) is named.
    return subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(PLAYBOOKS / name), "--check",
                           "-e", f"dtlab_torch_build_dir={tmp_path / 'torch-build'}",
                           "-e", f"dtlab_repo_dir={paths.REPO_ROOT}", *extra],
                          cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_the_study_cluster_gets_the_cu126_extra_index(tmp_path):
    gtx = (["NVIDIA GeForce GTX 1060 3GB"], ["6.1"])
    result = playbook(tmp_path, inventory_with(tmp_path, {"node0": gtx, "node1": gtx}), "torch_build.yml")
    assert result.returncode == 0, result.stdout[-3000:]
    assert ("trainer: torch 2.13 cu126 (CUDA 12.6.3, compute capability 5.0-9.0, driver >= 525) "
            "from https://download.pytorch.org/whl/cu126") in result.stdout
    assert not (tmp_path / "torch-build").exists()  # check mode wrote nothing


def test_a_gpu_no_build_runs_fails_the_play_with_one_line(tmp_path):
    inventory = inventory_with(tmp_path, {"node1": (["Tesla K80"], ["3.7"])})
    result = playbook(tmp_path, inventory, "torch_build.yml", "-e", "nvidia_driver_branch=470")
    assert result.returncode != 0
    assert re.search(r'"msg": "trainer: node1: GPU \'Tesla K80\' \(compute capability 3.7, Kepler\) '
                     r'is run by '
                     r'no torch 2.13 CUDA build; options: cu130 .*cu126 .*cu132 [^"]*"', result.stdout)


def test_check_mode_before_the_driver_plans_without_a_capability(tmp_path):
    inventory = inventory_with(tmp_path, {})
    result = playbook(tmp_path, inventory, "torch_build.yml", "-e", "dtlab_gpu_count=1")
    assert result.returncode == 0, result.stdout[-3000:]
    assert ("trainer: check mode, node0, node1: GPU capability not known until the driver answers"
            in result.stdout)


def test_a_pinned_build_overrides_the_choice(tmp_path):
    turing = (["Tesla T4"], ["7.5"])
    inventory = inventory_with(tmp_path, {"node0": turing, "node1": turing})
    result = playbook(tmp_path, inventory, "torch_build.yml",
                      "-e", "dtlab_torch_build=cu132", "-e", "nvidia_driver_branch=580")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "trainer: torch 2.13 cu132 (CUDA 13.2.1" in result.stdout


def test_the_default_branch_is_580_the_last_for_pascal():
    """group_vars/all.yml: on Ubuntu 24.04 branch 535 installs 580 anyway, and Pascal ends with 580."""
    assert BRANCH == "580"


def test_nvidia_package_names_for_ubuntu_24_04(tmp_path):
    """The names Ubuntu's and NVIDIA's docs give (roles/nvidia/README.md, "Package names")."""
    inventory = tmp_path / "localhost.yml"  # no host is contacted: the play only renders names
    inventory.write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")
    result = playbook(tmp_path, inventory, "nvidia_packages.yml",
                      "-e", "inventory_dir=" + str(paths.INVENTORY_DIR))
    assert result.returncode == 0, result.stdout[-3000:]
    rendered = json.loads(re.search(r"PACKAGES (\{.*\})", result.stdout.replace('\\"', '"')).group(1))
    assert rendered == {
        "dkms": ["nvidia-headless-580-server", "nvidia-utils-580-server"],
        "prebuilt": ["nvidia-headless-no-dkms-580-server", "nvidia-utils-580-server",
                     "linux-modules-nvidia-580-server-generic"],
        # NVIDIA's ubuntu2404 repository names its driver packages by branch up to 580.
        "cuda_repo": ["cuda-drivers-580"],
        "toolkit": ["nvidia-cuda-toolkit"], "cudnn": ["nvidia-cudnn"],
        # Both in NVIDIA's ubuntu2404 repository.
        "toolkit_cuda_repo": ["cuda-toolkit-12-6", "cudnn9-cuda-12"],
    }


# --- the nvidia role's task files on node data: dpkg databases, stand-ins for mokutil and nvidia-smi ---

KERNEL = os.uname().release  # Ansible's ansible_facts['kernel'] on the controller
# A node after `apt install nvidia-headless-535-server nvidia-utils-535-server` on Ubuntu 24.04 today
# (names from packages.ubuntu.com, source nvidia-graphics-drivers-580-server in noble-updates): the 535
# names are transitional and pulled branch 580, with Canonical's prebuilt module for the GA kernel too.
DRIVER_580 = "580.95.05-0ubuntu0.24.04.2"
MODULES_580 = "6.8.0-45.45+1"
UBUNTU_580_NODE = [
    ("nvidia-headless-535-server", "535.274.02-0ubuntu0.24.04.1", "nvidia-headless-580-server"),
    ("nvidia-utils-535-server", "535.274.02-0ubuntu0.24.04.1", "nvidia-utils-580-server"),
    *((name, DRIVER_580, "") for name in (
        "nvidia-headless-580-server", "nvidia-headless-no-dkms-580-server", "nvidia-dkms-580-server",
        "nvidia-kernel-common-580-server", "nvidia-kernel-source-580-server",
        "nvidia-compute-utils-580-server", "nvidia-utils-580-server", "nvidia-firmware-580-server-580.95.05",
        "libnvidia-cfg1-580-server", "libnvidia-common-580-server", "libnvidia-compute-580-server",
        "libnvidia-decode-580-server", "libnvidia-encode-580-server", "libnvidia-extra-580-server",
        "libnvidia-fbc1-580-server", "libnvidia-gl-580-server")),
    ("linux-modules-nvidia-580-server-generic", MODULES_580,
     "linux-modules-nvidia-580-server-6.8.0-45-generic"),
    ("linux-modules-nvidia-580-server-6.8.0-45-generic", MODULES_580, "nvidia-kernel-common-580-server"),
    ("linux-signatures-nvidia-6.8.0-45-generic", MODULES_580, ""),
    ("nvidia-container-toolkit", "1.18.0-1", "libnvidia-container1"),
    ("libnvidia-container1", "1.18.0-1", ""),
    ("dkms", "3.0.11-1ubuntu13", ""),
]
HELD_580 = sorted(name for name, version, _ in UBUNTU_580_NODE
                  if version == DRIVER_580 or name.startswith("linux-modules-nvidia-580"))
# Debian 12's driver: one branch (535), whatever nvidia_driver_branch says.
DEBIAN_535_NODE = [("nvidia-kernel-dkms", "535.247.01-1~deb12u1", ""),
                   ("nvidia-smi", "535.247.01-1~deb12u1", "")]


def kernel_packages(metapackages):
    """linux-image metapackages {name: the kernel release it depends on}, and those kernels' images."""
    images = set(metapackages.values()) | {KERNEL}
    return ([(f"linux-image-{release}", "1", "") for release in sorted(images)]
            + [(name, "1", f"linux-image-{release}, linux-firmware")
               for name, release in metapackages.items()])


def dpkg_database(directory, packages):
    """A dpkg database (DPKG_ADMINDIR) with these (name, version, Depends) installed."""
    for sub in ("updates", "info"):
        (directory / sub).mkdir(parents=True)
    (directory / "status").write_text("".join(
        f"Package: {name}\nStatus: install ok installed\nMaintainer: dtlab tests <tests@dtlab>\n"
        f"Architecture: amd64\nVersion: {version}\n" + (f"Depends: {depends}\n" if depends else "")
        + "Description: test package\n\n" for name, version, depends in packages))
    return directory


def stand_in(directory, command, output):
    """A stand-in for a command that cannot run here (no UEFI, no GPU): prints output, exits 0."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / command).write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\n")
    (directory / command).chmod(0o755)
    return directory


PLAN_HOSTS = {  # host: (linux-image metapackages, host vars, Secure Boot state)
    "ga": ({"linux-image-generic": KERNEL}, {}, "SecureBoot disabled"),
    # HWE: the GA metapackage stays installed, with its older kernel; the HWE one boots the running kernel.
    "hwe": ({"linux-image-generic": "6.8.0-45-generic", "linux-image-generic-hwe-24.04": KERNEL}, {},
            "SecureBoot disabled"),
    # An update installed a newer kernel, not booted yet: the one metapackage still names the line.
    "pending": ({"linux-image-virtual-hwe-24.04": "6.14.0-99-generic"}, {}, "SecureBoot disabled"),
    "bare": ({}, {}, "SecureBoot disabled"),
    "override": ({}, {"nvidia_kernel_flavour": "virtual"}, "SecureBoot disabled"),
    "secure_boot": ({"linux-image-generic": KERNEL}, {}, "SecureBoot enabled"),
    # An offline bundle holds the headers of dtlab_node_kernel only (docs/offline.md).
    "bundle_kernel": ({"linux-image-generic": KERNEL},
                      {"dtlab_bundle": "/srv/b", "dtlab_node_kernel": KERNEL}, "SecureBoot disabled"),
    "bundle_other_kernel": ({"linux-image-generic": KERNEL},
                            {"dtlab_bundle": "/srv/b", "dtlab_node_kernel": "6.8.0-99-generic"},
                            "SecureBoot disabled"),
}
HOLD_HOSTS = {"ubuntu_node": UBUNTU_580_NODE, "debian_node": DEBIAN_535_NODE}
GTX_1060 = ("NVIDIA GeForce GTX 1060 3GB", "6.1")
# host: (nvidia-smi's answer to check_gpus.yml's query, the GPU's name and compute capability). gpu_h200's
# answer is a real machine's (tests/fixtures/gpu-h200); the GTX 1060 lines are written in its format.
GPU_HOSTS = {"gpu_580": ("NVIDIA GeForce GTX 1060 3GB, 580.95.05, Enabled, 6.1", *GTX_1060),
             "gpu_535": ("NVIDIA GeForce GTX 1060 3GB, 535.247.01, Enabled, 6.1", *GTX_1060),
             "gpu_h200": ((Path(__file__).resolve().parents[1] / "fixtures" / "gpu-h200"
                           / "nvidia-smi-query-gpus.csv").read_text().strip(), "NVIDIA H200", "9.0")}


def local_host(name, host_vars):
    lines = [f"        {name}:", "          ansible_connection: local",
             "          ansible_python_interpreter: /usr/bin/python3"]
    return lines + [f"          {key}: {json.dumps(value)}" for key, value in host_vars.items()]


@pytest.fixture(scope="module")
def role_parts(tmp_path_factory):
    """One ansible-playbook run of tests/provision/playbooks/nvidia_role_parts.yml over every scenario:
    its JSON output by task name and host, the hosts' dpkg databases and the rendered apt pin."""
    tmp = tmp_path_factory.mktemp("nvidia-role-parts")
    inventory_dir = tmp / "inventory"
    inventory_dir.mkdir()
    os.symlink(paths.INVENTORY_DIR / "group_vars", inventory_dir / "group_vars")
    groups = {"plan": [], "hold": [], "gpus": [], "pin": []}
    for host, (metapackages, host_vars, secure_boot) in PLAN_HOSTS.items():
        admindir = dpkg_database(tmp / host / "dpkg", kernel_packages(metapackages))
        groups["plan"] += local_host(host, {
            **host_vars, "dpkg_admindir": str(admindir),
            "stand_in_bin": str(stand_in(tmp / host / "bin", "mokutil", secure_boot))})
    for host, packages in HOLD_HOSTS.items():
        admindir = dpkg_database(tmp / host / "dpkg", packages)
        groups["hold"] += local_host(host, {"dpkg_admindir": str(admindir)})
    for host, (answer, gpu_name, capability) in GPU_HOSTS.items():
        groups["gpus"] += local_host(host, {
            "stand_in_bin": str(stand_in(tmp / host / "bin", "nvidia-smi", answer)), "dtlab_gpu_count": 1,
            "dtlab_gpu_facts": {"nvidia_count": 1}, "dtlab_gpu_names": [gpu_name],
            "dtlab_gpu_compute_capabilities": [capability]})
    groups["pin"] += local_host("renderer", {"pin_dest": str(tmp / "pin")})
    lines = ["all:", "  children:"]
    for group, host_lines in groups.items():
        lines += [f"    {group}:", "      hosts:", *host_lines]
    (inventory_dir / "hosts.yml").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_STDOUT_CALLBACK": "json"}
    result = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inventory_dir / "hosts.yml"),
         str(PLAYBOOKS / "nvidia_role_parts.yml"),
         "-e", "nvidia_cuda_repo_pin_origin=127.0.0.1"],  # the test's NVIDIA repository, on loopback
        cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.stdout.lstrip().startswith("{"), result.stdout[-3000:] + result.stderr[-3000:]
    by_task = {}
    for play in json.loads(result.stdout)["plays"]:
        for task in play["tasks"]:
            by_task.setdefault(task["task"]["name"].removeprefix("nvidia : "), {}).update(task["hosts"])
    return by_task, tmp


@pytest.mark.slow
def test_the_running_kernels_metapackage_names_the_headers_ga_and_hwe(role_parts):
    by_task, _ = role_parts
    plans = {host: json.loads(result["msg"].removeprefix("PLAN "))
             for host, result in by_task["Print it as JSON"].items()}
    assert plans["ga"] == {"flavour": "generic",
                           "headers": [f"linux-headers-{KERNEL}", "linux-headers-generic"],
                           "prebuilt": ["nvidia-headless-no-dkms-580-server", "nvidia-utils-580-server",
                                        "linux-modules-nvidia-580-server-generic"]}
    assert plans["hwe"]["headers"] == [f"linux-headers-{KERNEL}", "linux-headers-generic-hwe-24.04"]
    assert plans["hwe"]["prebuilt"][-1] == "linux-modules-nvidia-580-server-generic-hwe-24.04"
    assert plans["pending"]["headers"][-1] == "linux-headers-virtual-hwe-24.04"
    assert plans["override"]["headers"] == [f"linux-headers-{KERNEL}", "linux-headers-virtual"]
    assert {"bare", "secure_boot", "bundle_other_kernel"}.isdisjoint(plans)  # refused, below


def test_a_node_without_a_kernel_metapackage_is_refused_in_one_line(role_parts):
    by_task, _ = role_parts
    refusal = by_task["Refuse a node whose kernel line is unknown (headers or prebuilt modules follow it)"]
    assert refusal["bare"]["failed"]
    assert refusal["bare"]["msg"] == (
        f"nvidia: bare: no installed linux-image metapackage depends on the running kernel {KERNEL} "
        "(installed metapackages: none), so the kernel headers for DKMS cannot follow its later kernels; "
        "set nvidia_kernel_flavour to the node's kernel line (e.g. generic, generic-hwe-24.04)")
    assert refusal["hwe"].get("skipped")


def test_with_a_bundle_a_node_on_another_kernel_than_its_headers_is_refused(role_parts):
    by_task, _ = role_parts
    refusal = by_task["Refuse a node that runs another kernel than the offline bundle's headers"]
    assert refusal["bundle_other_kernel"]["failed"]
    assert refusal["bundle_other_kernel"]["msg"] == (
        f"nvidia: bundle_other_kernel runs kernel {KERNEL}, and the offline bundle /srv/b holds the headers"
        " of 6.8.0-99-generic (dtlab_node_kernel), which DKMS builds the driver against: set"
        " dtlab_node_kernel to the node's `uname -r` and build the bundle again (docs/offline.md),"
        " or boot that kernel")
    assert refusal["bundle_kernel"].get("skipped") and refusal["ga"].get("skipped")  # ga: no bundle
    plans = {host: json.loads(result["msg"].removeprefix("PLAN "))
             for host, result in by_task["Print it as JSON"].items()}
    assert plans["bundle_kernel"]["headers"] == [f"linux-headers-{KERNEL}", "linux-headers-generic"]


def test_secure_boot_on_is_refused_naming_every_way_out(role_parts):
    by_task, _ = role_parts
    refusal = by_task["Refuse a DKMS module that Secure Boot would block"]
    message = refusal["secure_boot"]["msg"]
    assert refusal["secure_boot"]["failed"] and "\n" not in message
    assert message.startswith("nvidia: Secure Boot is on on secure_boot (mokutil --sb-state) and would block "
                              "the unsigned DKMS module of driver branch 580.")
    for way_out in ("OVMF_CODE_4M.fd", "Device Manager > Secure Boot Configuration",
                    "nvidia_install_source: distribution", "nvidia_kernel_module_source: prebuilt",
                    "enroll a MOK for DKMS", "nvidia_secure_boot_check: false"):
        assert way_out in message, way_out
    assert refusal["ga"].get("skipped")


def dpkg_selections(admindir):
    result = subprocess.run(["dpkg", "--get-selections"], env={**os.environ, "DPKG_ADMINDIR": str(admindir)},
                            capture_output=True, text=True, check=True)
    return sorted(line.split()[0] for line in result.stdout.splitlines() if line.split()[-1] == "hold")


@pytest.mark.skipif(os.geteuid() != 0, reason="dpkg --set-selections (on the test's own database) needs root")
def test_the_hold_covers_the_branchs_real_packages_not_the_transitional_names(role_parts):
    by_task, tmp = role_parts
    assert dpkg_selections(tmp / "ubuntu_node" / "dpkg") == HELD_580
    assert {"nvidia-dkms-580-server", "linux-modules-nvidia-580-server-6.8.0-45-generic"} <= set(HELD_580)
    said = by_task["Say which packages of the branch are held"]["ubuntu_node"]["msg"]
    assert said == "nvidia: ubuntu_node: branch 580 held: " + ", ".join(HELD_580)


def test_an_install_that_brought_another_branch_is_refused(role_parts):
    by_task, tmp = role_parts
    refusal = by_task["Refuse an install that left no package of the branch to hold"]["debian_node"]
    assert refusal["failed"]
    assert refusal["msg"] == (
        "nvidia: debian_node: dpkg lists no installed package of driver branch 580 after installing "
        "nvidia-headless-580-server, nvidia-utils-580-server; they belong to another branch (Debian 12's "
        "driver is branch 535): set nvidia_driver_branch to it")
    assert dpkg_selections(tmp / "debian_node" / "dpkg") == []


def test_nvidia_smi_names_the_branch_it_found_and_the_one_expected(role_parts):
    by_task, _ = role_parts
    branch_check = by_task["Require the driver on the inventory's branch"]
    assert branch_check["gpu_580"]["msg"] == (
        "nvidia: gpu_580: driver 580.95.05 (branch 580) found, expected branch 580")
    assert branch_check["gpu_535"]["failed"]
    assert branch_check["gpu_535"]["msg"].startswith(
        "nvidia: gpu_535: driver 535.247.01 (branch 535) found, expected branch 580 (nvidia_driver_branch);")
    # Pascal on 580 runs torch's CUDA 12.6 build (dtlab/data/gpu_compat.yml).
    assert by_task["Report the torch build this node's GPUs take"]["gpu_580"]["msg"].startswith(
        "nvidia: gpu_580: torch 2.13 cu126 (CUDA 12.6.3")
    # A real H200's answer (tests/fixtures/gpu-h200): Hopper on 580 takes the CUDA 13.0 build.
    assert branch_check["gpu_h200"]["msg"] == (
        "nvidia: gpu_h200: driver 580.159.04 (branch 580) found, expected branch 580")
    assert by_task["Report the torch build this node's GPUs take"]["gpu_h200"]["msg"].startswith(
        "nvidia: gpu_h200: torch 2.13 cu130 (CUDA 13.0.2")


# --- the cuda_repo pin, read by a real apt -------------------------------------------------------

def apt_repository(directory, packages):
    """A flat apt repository (Packages and Release; the .debs themselves are never fetched)."""
    directory.mkdir(parents=True)
    stanzas = "\n".join(
        f"Package: {name}\nVersion: {version}\nArchitecture: amd64\nMaintainer: dtlab tests <tests@dtlab>\n"
        f"Filename: pool/{name}_{version}_amd64.deb\nSize: 1\nSHA256: {'0' * 64}\nDescription: test package\n"
        + (f"Depends: {depends}\n" if depends else "") for name, version, depends in packages).encode()
    (directory / "Packages").write_bytes(stanzas)
    (directory / "Release").write_text(
        f"Origin: {directory.name}\nLabel: {directory.name}\nSuite: stable\nCodename: stable\n"
        "Date: Thu, 01 Jan 2026 00:00:00 UTC\nArchitectures: amd64\n"
        f"SHA256:\n {hashlib.sha256(stanzas).hexdigest()} {len(stanzas)} Packages\n")


@pytest.fixture
def apt_sources(tmp_path):
    """NVIDIA's repository (every branch, and the container toolkit) at 127.0.0.1 and the distribution's
    archive at localhost: two apt origins on one loopback HTTP server."""
    www = tmp_path / "www"
    apt_repository(www / "nvidia", [
        ("cuda-drivers-580", "580.95.05-0ubuntu1",
         "nvidia-dkms-580 (= 580.95.05-0ubuntu1), libnvidia-compute-580 (= 580.95.05-0ubuntu1)"),
        ("nvidia-dkms-580", "580.95.05-0ubuntu1", ""), ("libnvidia-compute-580", "580.95.05-0ubuntu1", ""),
        # From 590 on NVIDIA's names carry no branch; cuda-drivers and nvidia-open follow the newest.
        ("cuda-drivers", "590.44.01-0ubuntu1", "nvidia-dkms (= 590.44.01-0ubuntu1)"),
        ("nvidia-dkms", "590.44.01-0ubuntu1", ""), ("nvidia-open", "590.44.01-0ubuntu1", "nvidia-dkms"),
        ("nvidia-container-toolkit", "1.18.0-1", ""), ("cuda-toolkit-12-6", "12.6.3-1", "")])
    apt_repository(www / "archive", [("nvidia-dkms-580", "580.82.07-0ubuntu0.24.04.1", ""),
                                     ("nvidia-container-toolkit", "1.18.0-1", "")])

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(www), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    yield [f"deb [trusted=yes] http://127.0.0.1:{port}/nvidia ./",
           f"deb [trusted=yes] http://localhost:{port}/archive ./"]
    server.shutdown()


@pytest.mark.skipif(os.geteuid() != 0, reason="apt-get update, even into a private directory, runs as root")
def test_the_cuda_repo_pin_keeps_the_branch_and_lets_the_container_toolkit_in(role_parts, apt_sources,
                                                                               tmp_path):
    """The role's rendered pin under a real apt, in a private apt directory: branch 580's packages come from
    NVIDIA's repository, no other branch can come from it, and the container toolkit still installs."""
    _, parts = role_parts
    apt_root = tmp_path / "apt"
    for sub in ("etc/preferences.d", "etc/sources.list.d", "state/lists/partial", "cache/archives/partial"):
        (apt_root / sub).mkdir(parents=True)
    (apt_root / "etc" / "sources.list").write_text("\n".join(apt_sources) + "\n")
    (apt_root / "etc" / "preferences.d" / "dtlab-cuda-repository").write_text((parts / "pin").read_text())
    (apt_root / "state" / "status").write_text("")
    options = [f"-oDir::Etc={apt_root / 'etc'}", "-oDir::Etc::parts=/nonexistent",
               f"-oDir::State={apt_root / 'state'}", f"-oDir::State::status={apt_root / 'state' / 'status'}",
               f"-oDir::Cache={apt_root / 'cache'}",
               "-oAPT::Architecture=amd64", "-oAPT::Architectures=amd64", "-oAcquire::http::Proxy=DIRECT",
               "-oAPT::Sandbox::User=root", "-oDebug::NoLocking=1"]

    def apt(*argv):
        return subprocess.run([argv[0], *options, *argv[1:]], capture_output=True, text=True, timeout=120)

    update = apt("apt-get", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    policy = apt("apt-cache", "policy", "cuda-drivers-580", "nvidia-dkms-580", "cuda-drivers", "nvidia-open",
                 "nvidia-dkms", "nvidia-container-toolkit", "cuda-toolkit-12-6").stdout
    candidates = dict(re.findall(r"^(\S+):\n\s+Installed: .*\n\s+Candidate: (\S+)", policy, re.MULTILINE))
    assert candidates == {
        "cuda-drivers-580": "580.95.05-0ubuntu1", "nvidia-dkms-580": "580.95.05-0ubuntu1",  # NVIDIA's 580
        "cuda-drivers": "(none)", "nvidia-open": "(none)", "nvidia-dkms": "(none)",          # no 590
        "nvidia-container-toolkit": "1.18.0-1", "cuda-toolkit-12-6": "12.6.3-1"}, policy
    install = apt("apt-get", "install", "--simulate", "cuda-drivers-580")
    assert install.returncode == 0, install.stdout + install.stderr
    assert sorted(re.findall(r"^Inst (\S+) \((\S+)", install.stdout, re.MULTILINE)) == [
        ("cuda-drivers-580", "580.95.05-0ubuntu1"), ("libnvidia-compute-580", "580.95.05-0ubuntu1"),
        ("nvidia-dkms-580", "580.95.05-0ubuntu1")]
    assert apt("apt-get", "install", "--simulate", "cuda-drivers").returncode != 0  # 590 has no candidate
