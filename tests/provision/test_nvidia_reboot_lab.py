"""The nvidia role's reboot on a real lab node: the role's own tasks (roles/nvidia/tasks/reboot.yml), under
the strategy site.yml's nvidia play sets (Ansible's stock `linear`; Mitogen's has an open bug with the
reboot module, mitogen-hq/mitogen#1251), from a converge that asks for Mitogen's as dtlab's own do.

The lab node's systemd really reboots: nspawn exits 133 and the node's supervisor (dtlab/lab/nodes.py)
boots it again, as systemd-nspawn@.service does; Ansible's reboot module waits for a new boot ID."""

import pytest
import yaml

from dtlab import paths, provision
from dtlab.lab import nodes
from dtlab.lab.access import run_on_node

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PLAYBOOK = "tests/provision/playbooks/nvidia_reboot.yml"


def play_strategy(playbook, play_name_start: str) -> str | None:
    plays = yaml.safe_load((paths.REPO_ROOT / playbook).read_text())
    (play,) = [play for play in plays if play.get("name", "").startswith(play_name_start)]
    return play.get("strategy")


def test_the_nvidia_roles_reboot_returns_a_lab_node_under_the_plays_stock_strategy(lab):
    assert play_strategy("site.yml", "NVIDIA driver") == "linear" == play_strategy(PLAYBOOK, "Reboot a node")
    assert provision.CONVERGE_STRATEGY == "mitogen_linear"  # what the play's keyword wins over
    node = lab.node_names[-1]

    def on_node(command: str) -> str:
        done = run_on_node(lab, node, command, timeout=60)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout.strip()

    boot_before = on_node("touch /run/before-reboot && cat /proc/sys/kernel/random/boot_id")
    supervisor = nodes.running_pid(lab, node)
    rebooted = provision.converge(lab.inventory_path, playbook=PLAYBOOK, limit=node)
    assert rebooted.ok, rebooted.summary() + rebooted.output[-3000:]
    assert rebooted.count("changed", node) == 1, rebooted.output[-3000:]  # the reboot, and nothing else

    assert on_node("cat /proc/sys/kernel/random/boot_id") != boot_before
    assert on_node("test -e /run/before-reboot; echo $?") == "1"  # a new /run: the node booted again
    assert on_node("systemctl is-system-running --wait || true") in ("running", "degraded")
    assert nodes.running_pid(lab, node) == supervisor  # the same supervisor booted it: no dtlab restart
    console = (lab.node_dir(node) / "console.log").read_text(errors="replace")
    since_reboot = console.rsplit("\n--- ", 1)[-1]  # the supervisor's line opens each boot's part
    assert since_reboot.startswith(tuple("0123456789")) and "the node rebooted (nspawn exit 133): boot 2" in (
        since_reboot.splitlines()[0])
