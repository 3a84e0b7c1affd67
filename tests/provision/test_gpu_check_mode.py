"""GPU roles at unit level: with the GPU facts forced on, the nvidia and docker GPU tasks render and run
in check mode (against the controller itself, changing nothing) and say what they would do. Every
download URL points at a loopback HTTP server that serves stand-in keys and a stand-in cuda-keyring
package: no traffic leaves the machine."""

import http.server
import os
import subprocess
import threading

import pytest

from dtlab import paths
from tests.provision.provision_helpers import site_plays

ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"
STAND_IN_KEY = ("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nstand-in key for a check-mode test\n"
                "-----END PGP PUBLIC KEY BLOCK-----\n")


def stand_in_keyring_deb(destination):
    """A tiny package named cuda-keyring, enough for apt's check mode to read; never installed."""
    package = destination.parent / "cuda-keyring-pkg"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN" / "control").write_text(
        "Package: cuda-keyring\nVersion: 1.1-1\nArchitecture: all\nMaintainer: dtlab tests <tests@dtlab>\n"
        "Description: stand-in for a check-mode test\n")
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(package), str(destination)], check=True,
                   capture_output=True)


@pytest.fixture
def key_server(tmp_path):
    """A loopback HTTP server with a stand-in signing key (or cuda-keyring) at every path the roles fetch."""
    root = tmp_path / "www"
    for key_path in ("docker/debian/gpg", "docker/ubuntu/gpg", "libnvidia-container/gpgkey"):
        (root / key_path).parent.mkdir(parents=True, exist_ok=True)
        (root / key_path).write_text(STAND_IN_KEY)
    for distribution in ("debian12", "ubuntu2404"):
        (root / "cuda" / distribution / "x86_64").mkdir(parents=True)
        stand_in_keyring_deb(root / "cuda" / distribution / "x86_64" / "cuda-keyring_1.1-1_all.deb")

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def run_check_mode(inventory, *extra_args):
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(site_plays(inventory.parent, "nvidia", "docker")),
         "--check", *extra_args], cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow  # an ansible-playbook check-mode run: not in `invoke test --fast`
def test_gpu_tasks_run_in_check_mode_with_the_gpu_fact_forced_on(controller_inventory, key_server):
    sources_before = sorted(os.listdir("/etc/apt/sources.list.d"))
    preferences_before = sorted(os.listdir("/etc/apt/preferences.d"))
    result = run_check_mode(
        controller_inventory, "-e", "dtlab_gpu_count=1",
        "-e", "nvidia_install_source=cuda_repo",  # the distribution source asks Ubuntu's archive, not here
        # The controller's running kernel may not be Debian's: ask for the flavour's headers only.
        "-e", '{"nvidia_kernel_header_packages": ["linux-headers-amd64"]}',
        "-e", f"nvidia_cuda_repo_base_url={key_server}/cuda", "-e", "nvidia_cuda_repo_pin_origin=127.0.0.1",
        "-e", f"docker_repo_base_url={key_server}/docker",
        "-e", f"docker_nvidia_toolkit_key_url={key_server}/libnvidia-container/gpgkey",
        "-e", f"docker_nvidia_toolkit_repo_url={key_server}/libnvidia-container/stable/deb/amd64", "--diff")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    out = result.stdout
    # The GPU plan, step by step: what each GPU-only step would do on a fresh node.
    for task in ("Ask whether Secure Boot is on (read-only)", "Blacklist nouveau",
                 "Install NVIDIA's cuda-keyring (the CUDA repository's signing key and source list)",
                 "Pin NVIDIA's driver packages to the branch (apt preferences)",
                 "Install the kernel headers (DKMS builds the module against them)"):
        assert f"TASK [nvidia : {task}]" in out, task
    assert ("nvidia: check mode, CUDA repository not configured yet; would install now: "
            "linux-headers-amd64, cuda-drivers-580, and hold the packages of branch 580 that dpkg lists "
            "after that") in out
    # The pin holds NVIDIA's driver packages to branch 580 (tests/provision/test_gpu_plan.py runs it in apt).
    assert ("+Package: *nvidia* cuda-drivers*\n+Pin: version 580.*\n+Pin-Priority: 600\n" in out
            and "+Package: *nvidia* cuda-drivers*\n+Pin: origin 127.0.0.1\n+Pin-Priority: -1\n" in out), out
    assert ("nvidia: check mode, controller would hold the installed packages of branch 580 after the "
            "install; installed now: none") in out
    assert "nvidia: check mode, controller would reboot to load driver 580; persistence mode and the " \
           "nvidia-smi checks run after that reboot" in out
    assert "TASK [docker : Add NVIDIA's container toolkit repository with its signing key]" in out
    assert "TASK [docker : Register the nvidia runtime with Docker (nvidia-ctk)]" in out
    # GPU containers keep their GPUs across systemctl daemon-reload: the cgroup driver and the udev rule.
    assert '+    "exec-opts": [\n+        "native.cgroupdriver=cgroupfs"\n+    ],' in out, out
    assert ('+ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", RUN+="/usr/bin/nvidia-ctk system '
            'create-dev-char-symlinks --create-all"') in out
    assert "no NVIDIA GPU" not in out
    # Check mode changed nothing on the controller.
    assert sorted(os.listdir("/etc/apt/sources.list.d")) == sources_before
    assert sorted(os.listdir("/etc/apt/preferences.d")) == preferences_before
    assert not os.path.exists("/etc/modprobe.d/dtlab-blacklist-nouveau.conf")
    assert not os.path.exists("/etc/udev/rules.d/71-nvidia-dev-char.rules")


@pytest.mark.slow  # an ansible-playbook check-mode run: not in `invoke test --fast`
def test_a_deferred_reboot_skips_the_checks_saying_so(controller_inventory):
    """The distribution source, the driver "installed" but not loaded, the reboot left to the operator."""
    result = run_check_mode(
        controller_inventory, "-e", "dtlab_gpu_count=1", "-e", '{"nvidia_reboot_skip": true}',
        "-e", '{"nvidia_driver_packages_distribution": ["pciutils"], '
              '"nvidia_kernel_header_packages": ["linux-headers-amd64"]}',
        "--tags", "nvidia")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    out = result.stdout
    assert "TASK [nvidia : Hold the branch's packages against upgrades (apt-mark hold)]" in out
    assert ("nvidia: controller must reboot to load driver 580, and nvidia_reboot_skip is set: persistence "
            "mode and the nvidia-smi checks are skipped") in out
    assert "TASK [nvidia : Reboot to load the NVIDIA driver]" in out  # listed, skipped
    assert "TASK [nvidia : Query the GPUs with nvidia-smi (read-only)]" not in out


@pytest.mark.slow  # an ansible-playbook check-mode run: not in `invoke test --fast`
def test_gpu_tasks_skip_with_their_message_without_a_gpu(controller_inventory):
    result = run_check_mode(controller_inventory, "-e", "dtlab_gpu_count=0",
                            "-e", "docker_install_source=distribution", "--diff")
    assert result.returncode == 0, result.stdout[-4000:]
    out = result.stdout
    assert ("nvidia: no NVIDIA GPU on controller (lspci); "
            "skipping driver, CUDA, cuDNN and persistence mode") in out
    assert "docker: no NVIDIA GPU on controller (lspci); skipping the NVIDIA container toolkit" in out
    assert "TASK [nvidia : Add NVIDIA's CUDA apt repository" not in result.stdout
    assert '+    "log-driver": "json-file",' in out  # daemon.json's diff is shown...
    assert "native.cgroupdriver" not in out  # ...and Docker keeps its cgroup driver where no GPU is


@pytest.mark.slow  # ansible-playbook check-mode runs: not in `invoke test --fast`
def test_the_horovod_role_plans_nccls_gpu_operations_for_a_cuda_torch_in_check_mode(controller_inventory):
    """GPU nodes need Horovod's NCCL operations (roles/horovod, horovod_gpu_operations auto): in check mode
    on a fresh node (no venv yet) the role goes by the torch build the trainer role chose, and says what it
    would build; nothing is built."""
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"}

    def check(*extra):
        done = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(controller_inventory),
                               "tests/provision/playbooks/horovod_check_mode.yml", "--check", *extra],
                              cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        (said,) = [line for line in done.stdout.splitlines() if "horovod: check mode:" in line]
        return said

    gpu = check("-e", '{"trainer_torch_build": {"name": "cu126"}}')
    assert ("with GPU operations NCCL for compute capabilities 60,61,70,75,80,86,89,90, which needs the CUDA"
            " toolkit (nvcc) there") in gpu
    assert "CPU operations only (Gloo)" in check("-e", '{"trainer_torch_build": {"name": "pypi"}}')
    assert "CPU operations only (Gloo)" in check("-e", '{"trainer_torch_build": {"name": "cu126"}}',
                                                 "-e", "horovod_gpu_operations=none")
