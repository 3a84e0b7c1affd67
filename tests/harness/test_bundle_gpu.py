"""A GPU inventory's offline bundle (dtlab.bundle, docs/offline.md "GPU nodes"): what the inventory must say
before the nodes can be asked (their kernel), and the apt part resolved through the repositories the roles
add (Docker's, NVIDIA's container toolkit), each signed by its own key, beside this machine's Debian archive.

Docker's and NVIDIA's repositories cannot be reached here: each is a stand-in on loopback with tiny packages
of the real names, laid out and signed as the real one is (Docker's: dists/ with an armored key; NVIDIA's: a
flat repository under $(ARCH)/ with a binary key). Debian 12's NVIDIA driver is in non-free, which this
machine's sources leave out, so the stand-in NVIDIA repository also serves stand-ins of its four packages.
The kernel headers and every other dependency are Debian's own, fetched from its archive."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from harness_helpers import GPU_CLUSTER_4X2, write_inventory

from dtlab import bundle
from dtlab.errors import DtlabError
from dtlab.platforms import load_cluster

# roles/nvidia/vars/Debian-12.yml's driver packages
GPU_PACKAGES_DEBIAN = ("nvidia-kernel-dkms", "nvidia-smi", "nvidia-persistenced", "libcuda1")
DOCKER_PACKAGES = ("docker-ce", "docker-ce-cli", "containerd.io", "docker-buildx-plugin")
TOOLKIT_PACKAGES = ("nvidia-container-toolkit",)


def gpu_vars(**more: str) -> str:
    base = {"dtlab_torch_build": "cu126", "nvidia_kernel_flavour": "generic"}
    return "".join(f"{key}: {value}\n" for key, value in {**base, **more}.items())


# --- what a GPU inventory must say ----------------------------------------------------------------------


def test_a_gpu_inventory_must_name_its_kernel_line_and_kernel_in_one_line_each(tmp_path):
    def refusal(group_vars: str) -> str:
        cluster = load_cluster(write_inventory(tmp_path / str(len(group_vars)), GPU_CLUSTER_4X2,
                                               group_vars={"all": group_vars}))
        with pytest.raises(DtlabError) as refused:
            bundle.plan(cluster)
        assert "\n" not in str(refused.value)
        return str(refused.value)

    assert "nvidia_kernel_flavour is empty; a GPU node's bundle is built before the node can be asked" in \
        refusal("dtlab_torch_build: cu126\n")
    assert "dtlab_node_kernel is empty" in refusal(gpu_vars())
    assert "`uname -r`" in refusal(gpu_vars())
    # NVIDIA's CUDA repository comes through its cuda-keyring package, fetched by URL: no bundle holds it yet.
    cuda_repo = refusal(gpu_vars(dtlab_node_kernel="6.8.0-60-generic", nvidia_install_source="cuda_repo"))
    assert cuda_repo.startswith("bundle: roles/nvidia/tasks/gpu.yml: head installs cuda-keyring_1.1-1_all.deb"
                                " from https://developer.download.nvidia.com/")


def test_the_gpu_nodes_packages_and_the_roles_repositories_are_planned_for_ubuntu(tmp_path):
    cluster = load_cluster(write_inventory(tmp_path, GPU_CLUSTER_4X2, group_vars={
        "all": gpu_vars(dtlab_node_kernel="6.8.0-60-generic")}))
    the_plan = bundle.plan(cluster)
    assert the_plan.node_kernel == "6.8.0-60-generic"
    assert {"linux-headers-6.8.0-60-generic", "linux-headers-generic", "nvidia-headless-580-server",
            "nvidia-utils-580-server", *DOCKER_PACKAGES, *TOOLKIT_PACKAGES} <= set(the_plan.apt_packages)
    assert the_plan.apt_sources == [
        {"name": "docker", "types": ["deb"], "uris": ["https://download.docker.com/linux/ubuntu"],
         "suites": ["noble"], "components": ["stable"], "signed_by": "https://download.docker.com/linux/ubuntu/gpg"},
        {"name": "nvidia-container-toolkit", "types": ["deb"],
         "uris": ["https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"], "suites": ["/"],
         "components": [], "signed_by": "https://nvidia.github.io/libnvidia-container/gpgkey"}]
    # Canonical's signed modules need no headers, so no kernel: the line's metapackage follows the archive.
    prebuilt = load_cluster(write_inventory(tmp_path / "prebuilt", GPU_CLUSTER_4X2, group_vars={
        "all": gpu_vars(nvidia_kernel_module_source="prebuilt")}))
    packages = bundle.plan(prebuilt).apt_packages
    assert "linux-modules-nvidia-580-server-generic" in packages
    assert not [p for p in packages if p.startswith("linux-headers")]
    # Debian's docker.io needs no repository of Docker's.
    distribution = load_cluster(write_inventory(tmp_path / "distribution", GPU_CLUSTER_4X2, group_vars={
        "all": gpu_vars(dtlab_node_kernel="6.8.0-60-generic", docker_install_source="distribution")}))
    assert [s["name"] for s in bundle.plan(distribution).apt_sources] == ["nvidia-container-toolkit"]


# --- the apt part through signed stand-ins of Docker's and NVIDIA's repositories ---------------------------


def stand_in_deb(pool: Path, name: str, depends: str = "") -> None:
    """A tiny real package of this name (dpkg-deb), depending on `depends`."""
    root = pool.parent / "build" / name
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0-1\nArchitecture: amd64\nMaintainer: dtlab tests <tests@dtlab>\n"
        + (f"Depends: {depends}\n" if depends else "")
        + "Description: stand-in of a package unreachable here\n")
    pool.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root),
                    str(pool / f"{name}_1.0-1_amd64.deb")], check=True, capture_output=True)


def signed_release(directory: Path, gnupg: Path, fields: str, indexes: list[str]) -> None:
    """Release over `indexes` (relative to directory), clear-signed into InRelease as apt reads it."""
    sums = "".join(f" {hashlib.sha256((directory / i).read_bytes()).hexdigest()}"
                   f" {(directory / i).stat().st_size} {i}\n" for i in indexes)
    (directory / "Release").write_text(f"{fields}Date: Sat, 28 Nov 2026 00:00:00 UTC\nSHA256:\n{sums}")
    subprocess.run(["gpg", "--homedir", str(gnupg), "--batch", "--yes", "--clearsign", "-o",
                    str(directory / "InRelease"), str(directory / "Release")],
                   check=True, capture_output=True)


def scan(directory: Path, target: Path, path: str) -> None:
    packages = subprocess.run(["dpkg-scanpackages", "--multiversion", path], cwd=directory, check=True,
                              capture_output=True, text=True).stdout
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(packages)


@pytest.fixture
def vendor_repositories(tmp_path):
    """Docker's (dists/bookworm/stable, armored key) and NVIDIA's toolkit repository (flat, $(ARCH), binary
    key), signed by a key made here, on one loopback HTTP server; yields the inventory variables that point
    there."""
    www, gnupg = tmp_path / "www", tmp_path / "gnupg"
    gnupg.mkdir(mode=0o700)
    subprocess.run(["gpg", "--homedir", str(gnupg), "--batch", "--passphrase", "", "--quick-gen-key",
                    "dtlab stand-in repositories <tests@dtlab>", "rsa2048", "sign", "never"],
                   check=True, capture_output=True, timeout=120)
    docker = www / "docker" / "debian"
    # iptables: one of Debian's, as the real docker-ce depends on it
    stand_in_deb(docker / "pool/stable", "docker-ce", "docker-ce-cli, containerd.io, iptables")
    for name in DOCKER_PACKAGES[1:]:
        stand_in_deb(docker / "pool/stable", name)
    scan(docker, docker / "dists/bookworm/stable/binary-amd64/Packages", "pool")
    signed_release(docker / "dists/bookworm", gnupg,
                   "Origin: Docker\nSuite: bookworm\nCodename: bookworm\nArchitectures: amd64\n"
                   "Components: stable\n",
                   ["stable/binary-amd64/Packages"])
    (docker / "gpg").write_bytes(subprocess.run(["gpg", "--homedir", str(gnupg), "--armor", "--export"],
                                                check=True, capture_output=True).stdout)
    toolkit = www / "nvidia" / "stable/deb"
    stand_in_deb(toolkit / "amd64", "nvidia-container-toolkit", "nvidia-container-toolkit-base")
    stand_in_deb(toolkit / "amd64", "nvidia-container-toolkit-base")
    for name in GPU_PACKAGES_DEBIAN:
        stand_in_deb(toolkit / "amd64", name)
    scan(toolkit / "amd64", toolkit / "amd64/Packages", ".")
    signed_release(toolkit / "amd64", gnupg, "Origin: NVIDIA\nLabel: NVIDIA CONTAINER TOOLKIT\n",
                   ["Packages"])
    (www / "nvidia/gpgkey").write_bytes(subprocess.run(["gpg", "--homedir", str(gnupg), "--export"],
                                                       check=True, capture_output=True).stdout)

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(www), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield {"docker_repo_base_url": f"{base}/docker",
               "docker_nvidia_toolkit_repo_url": f"{base}/nvidia/stable/deb/$(ARCH)",
               "docker_nvidia_toolkit_key_url": f"{base}/nvidia/gpgkey"}
    finally:
        server.shutdown()
        # gpg started an agent for this home directory; it would outlive the test as a daemon.
        subprocess.run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"], capture_output=True,
                       timeout=60)


def debian_kernel(scratch: Path) -> str:
    """The kernel Debian 12's linux-headers-amd64 names now, as a node runs it: asked of Debian's archive
    through lists of the test's own (a fresh machine may have none)."""
    lists = scratch / "lists"
    (lists / "partial").mkdir(parents=True)
    options = ["-o", f"Dir::State::Lists={lists}", "-o", "Debug::NoLocking=true"]
    updated = subprocess.run(["apt-get", *options, "-q", "update"], capture_output=True, text=True,
                             timeout=600)
    assert updated.returncode == 0, updated.stdout + updated.stderr
    depends = subprocess.run(["apt-cache", *options, "depends", "linux-headers-amd64"], capture_output=True,
                             text=True, timeout=60).stdout
    found = [line.split("linux-headers-", 1)[1].strip()
             for line in depends.splitlines() if "Depends:" in line]
    assert found, f"Debian's archive names no linux-headers-amd64 dependency:\n{depends}"
    return found[0]


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the bundle's apt part resolves as root (own lists and cache)")
def test_the_apt_part_of_a_gpu_bundle_comes_through_the_roles_signed_repositories(tmp_path,
                                                                                  vendor_repositories):
    kernel = debian_kernel(tmp_path / "apt")
    cluster = load_cluster(write_inventory(tmp_path / "inv", GPU_CLUSTER_4X2, group_vars={"all": gpu_vars(
        dtlab_node_os="debian-bookworm", dtlab_node_python='"3.11"', nvidia_kernel_flavour="amd64",
        dtlab_node_kernel=kernel, **{key: json.dumps(value) for key, value in vendor_repositories.items()})}))
    the_plan = bundle.plan(cluster)
    # Only the GPU nodes' part: the rest is the lab bundle's, which the lab's converge proves.
    gpu_part = {f"linux-headers-{kernel}", "linux-headers-amd64", *GPU_PACKAGES_DEBIAN, *DOCKER_PACKAGES,
                *TOOLKIT_PACKAGES}
    assert gpu_part <= set(the_plan.apt_packages)
    the_plan = dataclasses.replace(the_plan, apt_packages=sorted(gpu_part))
    out = tmp_path / "bundle"
    out.mkdir()  # as build() makes it
    said = []
    entries = bundle._build_apt(the_plan, out, said.append)

    by_name = {e.name: e for e in entries if e.path.endswith(".deb")}
    assert gpu_part <= set(by_name)
    base = vendor_repositories["docker_repo_base_url"]
    assert by_name["docker-ce"].source == f"{base}/debian/pool/stable/docker-ce_1.0-1_amd64.deb"
    toolkit = vendor_repositories["docker_nvidia_toolkit_repo_url"].replace("$(ARCH)", "amd64")
    assert by_name["nvidia-container-toolkit-base"].source.startswith(toolkit)  # a dependency, from there too
    # The stand-ins' Debian dependencies and the kernel's headers come from Debian's archive.
    common = f"linux-headers-{kernel.removesuffix('-amd64')}-common"
    for debian in ("iptables", f"linux-headers-{kernel}", common):
        assert "debian.org/debian" in by_name[debian].source, (debian, by_name[debian].source)
    assert said[-1].endswith(
        "(debian-bookworm + docker's repository + nvidia-container-toolkit's repository)")
    index = (out / "apt" / "Packages").read_text()
    assert "Package: nvidia-container-toolkit-base\n" in index
    assert f"Package: linux-headers-{kernel}\n" in index


def test_verify_refuses_a_bundle_built_for_another_kernel(tmp_path):
    def cluster(kernel: str):
        return load_cluster(write_inventory(tmp_path / kernel, GPU_CLUSTER_4X2, group_vars={
            "all": gpu_vars(dtlab_node_kernel=kernel)}))

    out = tmp_path / "bundle"
    out.mkdir()
    bundle.write_manifest(out, "four", bundle.plan(cluster("6.8.0-60-generic")), [])
    assert json.loads((out / bundle.MANIFEST).read_text())["node_kernel"] == "6.8.0-60-generic"
    mismatch = f"bundle {out}: built for node_kernel 6.8.0-60-generic, inventory: 6.8.0-71-generic"
    assert mismatch in bundle.verify(cluster("6.8.0-71-generic"), out)
    assert not [p for p in bundle.verify(cluster("6.8.0-60-generic"), out) if "node_kernel" in p]


def test_a_gpu_bundles_horovod_wheel_is_built_with_nccl_for_the_roles_compute_capabilities(tmp_path):
    """As the horovod role builds it (horovod_gpu_operations auto): NCCL's GPU operations for a CUDA torch,
    for every compute capability of its default list, Pascal's 61 among them; none for a CPU torch, or
    where the inventory says none."""
    from dtlab.platforms.horovod import gpu_build_args

    cluster = load_cluster(write_inventory(tmp_path, GPU_CLUSTER_4X2, group_vars={"all": gpu_vars()}))
    args = gpu_build_args(cluster, "torch==2.13.0+cu126")
    assert args[:3] == ["--gpu-operations", "NCCL", "--cuda-cc-list"]
    assert {"61", "90"} <= set(args[3].split(","))
    assert gpu_build_args(cluster, "torch==2.13.0+cpu") == []
    off = load_cluster(write_inventory(tmp_path / "off", GPU_CLUSTER_4X2, group_vars={
        "all": gpu_vars(horovod_gpu_operations="none")}))
    assert gpu_build_args(off, "torch==2.13.0+cu126") == []
