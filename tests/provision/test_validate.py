"""The validation play (ansible/validate.yml) refuses each bad inventory with one clear line."""

import json
import subprocess

import pytest

from dtlab import paths

ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"


def three_nodes(**overrides):
    """The reference layout (node0 master, node1/node2 workers), with host vars overridden."""
    hosts = {
        "node0": {"ansible_host": "192.0.2.10", "gpu_indices": [0]},
        "node1": {"ansible_host": "192.0.2.11", "gpu_indices": [0]},
        "node2": {"ansible_host": "192.0.2.12", "gpu_indices": [0]},
    }
    for host, host_vars in overrides.items():
        hosts[host] = host_vars
    return {"master": ["node0"], "workers": ["node1", "node2"], "hosts": hosts}


def as_inventory(layout):
    hosts = layout["hosts"]
    return {"all": {"children": {
        group: {"hosts": {name: hosts[name] for name in layout[group]}}
        for group in ("master", "workers") if layout.get(group)
    }}}


def validate(tmp_path, layout):
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps(as_inventory(layout)))
    return subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), "ansible/validate.yml"],
                          cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120)


def failure_messages(result):
    return [line for line in result.stdout.splitlines() if line.startswith("fatal:")]


def test_reference_layout_passes(tmp_path):
    result = validate(tmp_path, three_nodes())
    assert result.returncode == 0, result.stdout


def test_example_cluster_inventory_passes():
    result = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "inventory/cluster.example.yml", "ansible/validate.yml"],
        cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout


BAD_INVENTORIES = {
    "missing master group": (
        {**three_nodes(), "master": []},
        "inventory: no host in group 'master'; put exactly one host under master"),
    "two masters": (
        {**three_nodes(), "master": ["node0", "node1"]},
        "inventory: group 'master' has 2 hosts (node0, node1); keep exactly one host under master"),
    "duplicate agent_id": (
        three_nodes(node1={"ansible_host": "192.0.2.11", "determined_agent_id": "agent"},
                    node2={"ansible_host": "192.0.2.12", "determined_agent_id": "agent"}),
        "inventory: determined_agent_id 'agent' is used by node1 and node2; give each worker its own"),
    "worker without an address": (
        three_nodes(node2={"gpu_indices": [0]}),
        "inventory: host node2 has no address; set ansible_host (its IP address) under node2"),
    "GPU index that is not a number": (
        three_nodes(node1={"ansible_host": "192.0.2.11", "gpu_indices": ["first"]}),
        'inventory: host node1: gpu_indices ["first"] is not a list of GPU numbers'),
}


@pytest.mark.parametrize("case", BAD_INVENTORIES)
def test_bad_inventory_fails_with_one_line(tmp_path, case):
    layout, expected = BAD_INVENTORIES[case]
    result = validate(tmp_path, layout)
    assert result.returncode != 0
    messages = failure_messages(result)
    assert len(messages) == 1, result.stdout
    message = json.loads(messages[0].split("=> ", 1)[1])["msg"]
    assert "\n" not in message
    assert message.startswith(expected), message
