"""The slurm role's slurmd ordering at unit level: with the GPU facts forced on, check mode on the
controller (as a worker) shows the drop-in that starts slurmd after nvidia-persistenced; without GPUs
there is none. Nothing is written. The lab proves the mechanism with a real unit (test_lab_converge)."""

import os
import subprocess

import pytest

from dtlab import paths

ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"
DROPIN = "/etc/systemd/system/slurmd.service.d/dtlab-after.conf"


def order_slurmd_in_check_mode(inventory, *extra_args):
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "-i",
            str(inventory),
            "tests/provision/playbooks/slurmd_order.yml",
            "--check",
            "--diff",
            *extra_args,
        ],
        cwd=paths.REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.slow  # an ansible-playbook check-mode run: not in `invoke test --fast`
def test_a_gpu_node_gets_slurmd_ordered_after_nvidia_persistenced(controller_inventory):
    result = order_slurmd_in_check_mode(controller_inventory, "-e", "dtlab_gpu_count=1")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    out = result.stdout
    assert f'"path": "{os.path.dirname(DROPIN)}"' in out, out[-3000:]
    rendered = [line[1:] for line in out.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert "[Unit]" in rendered, out[-3000:]
    assert "After=nvidia-persistenced.service" in rendered, out[-3000:]
    assert "Wants=nvidia-persistenced.service" in rendered, out[-3000:]
    assert not [line for line in rendered if line.startswith("Requires=")]  # its restart must not stop slurmd
    assert not os.path.exists(DROPIN)  # check mode wrote nothing


@pytest.mark.slow  # an ansible-playbook check-mode run: not in `invoke test --fast`
def test_a_node_without_gpus_gets_no_drop_in(controller_inventory):
    result = order_slurmd_in_check_mode(controller_inventory, "-e", "dtlab_gpu_count=0")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    out = result.stdout
    assert "+After=" not in out and "+Wants=" not in out, out[-3000:]
    assert "TASK [slurm : Remove the drop-in where slurmd waits for nothing]" in out
    assert "changed=0" in out, out[-1500:]
