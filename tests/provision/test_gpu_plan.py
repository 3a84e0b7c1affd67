"""The Ansible side of the GPU plan, on the controller with forced GPU facts (check mode, nothing written):
the trainer role picks torch's CUDA build through dtlab.gpucompat, and the nvidia role asks Ubuntu 24.04
for the package names its README cites."""

import json
import os
import re
import subprocess

import pytest

from dtlab import paths

ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"
PLAYBOOKS = paths.REPO_ROOT / "tests" / "provision" / "playbooks"


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
    return subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(PLAYBOOKS / name), "--check",
                           "-e", f"dtlab_torch_build_dir={tmp_path / 'torch-build'}", *extra],
                          cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)


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


@pytest.mark.parametrize("branch", ["535"])
def test_nvidia_package_names_for_ubuntu_24_04(tmp_path, branch):
    """The names Ubuntu's and NVIDIA's docs give (roles/nvidia/README.md, "Package names")."""
    result = playbook(tmp_path, "localhost,", "nvidia_packages.yml", "-e", f"nvidia_driver_branch={branch}",
                      "-e", "inventory_dir=" + str(paths.INVENTORY_DIR))
    assert result.returncode == 0, result.stdout[-3000:]
    rendered = json.loads(re.search(r"PACKAGES (\{.*\})", result.stdout.replace('\\"', '"')).group(1))
    assert rendered == {
        "dkms": [f"nvidia-headless-{branch}-server", f"nvidia-utils-{branch}-server"],
        "prebuilt": [f"nvidia-headless-no-dkms-{branch}-server", f"nvidia-utils-{branch}-server",
                     f"linux-modules-nvidia-{branch}-server-generic"],
        "cuda_repo": [f"cuda-drivers-{branch}"],
        "headers_meta": "linux-headers-generic",
        "toolkit": ["nvidia-cuda-toolkit"], "cudnn": ["nvidia-cudnn"],
        # Both in NVIDIA's ubuntu2404 repository.
        "toolkit_cuda_repo": ["cuda-toolkit-12-6", "cudnn9-cuda-12"],
    }
