"""The docker role's daemon.json merge, converged for real on the controller (the file in a temporary
directory): a file as nvidia-ctk writes it gets dtlab's keys once, then a second converge changes nothing,
and a file that already holds the same data in another layout is left as it is.

nvidia-ctk's layout (nvidia-container-toolkit, pkg/config/engine/docker: Config.Save) is Go's
json.MarshalIndent(config, "", "    ") written without a final newline: keys sorted, 4-space indents;
`nvidia-ctk runtime configure --runtime=docker` adds "runtimes": {"nvidia": {"args": [], "path":
"nvidia-container-runtime"}}.
"""

import json
import os
import re

import pytest

from dtlab import provision

NVIDIA_RUNTIME = {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the role writes a root-owned file"),
    pytest.mark.slow,
]  # ansible-playbook runs


def nvidia_ctk_layout(data: dict) -> str:
    """What nvidia-ctk's Config.Save writes: Go's MarshalIndent with 4 spaces, sorted keys, no newline."""
    return json.dumps(data, indent=4, sort_keys=True)


@pytest.fixture
def converge_daemon_json(tmp_path):
    """Converge the docker role's daemon.json tasks on the controller against tmp_path/daemon.json."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    master:\n      hosts:\n        controller:\n"
        "          ansible_host: 127.0.0.1\n          ansible_connection: local\n"
        "          ansible_python_interpreter: /usr/bin/python3\n"
        "    workers:\n      hosts:\n        controller:\n"
    )
    playbook = tmp_path / "daemon-json.yml"
    playbook.write_text(
        "- hosts: controller\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role: {name: docker, tasks_from: daemon_json}\n"
    )
    daemon_json = tmp_path / "docker" / "daemon.json"

    def converge():
        result = provision.converge(
            inventory,
            playbook=str(playbook),
            extravars={"docker_daemon_json_path": str(daemon_json), "docker_service_manage": False},
        )
        assert result.ok, result.summary() + result.output[-3000:]
        return result

    return daemon_json, converge


def test_a_file_nvidia_ctk_wrote_gets_our_keys_once_then_a_second_converge_changes_nothing(
    converge_daemon_json,
):
    daemon_json, converge = converge_daemon_json
    daemon_json.parent.mkdir()
    daemon_json.write_text(nvidia_ctk_layout(NVIDIA_RUNTIME))  # a GPU node after nvidia-ctk

    first = converge()
    assert first.count("changed", "controller") == 1
    merged = json.loads(daemon_json.read_text())
    assert merged["runtimes"] == NVIDIA_RUNTIME["runtimes"]  # kept
    assert merged["log-driver"] == "json-file" and merged["log-opts"] == {"max-size": "50m", "max-file": "3"}
    # Written in nvidia-ctk's own layout, so nvidia-ctk rewriting it changes no byte either.
    assert daemon_json.read_text() == nvidia_ctk_layout(merged)

    written = daemon_json.stat().st_mtime_ns
    second = converge()
    assert second.count("changed", "controller") == 0, second.summary()
    assert daemon_json.stat().st_mtime_ns == written
    assert not re.search(r"RUNNING HANDLER \[docker : Restart docker\]", second.output)


def test_the_same_data_in_another_layout_is_left_alone(converge_daemon_json):
    daemon_json, converge = converge_daemon_json
    daemon_json.parent.mkdir()
    data = {"log-opts": {"max-file": "3", "max-size": "50m"}, "log-driver": "json-file", **NVIDIA_RUNTIME}
    text = json.dumps(data, indent=2) + "\n"  # unsorted, 2-space indents, a final newline
    daemon_json.write_text(text)
    result = converge()
    assert result.count("changed", "controller") == 0, result.summary()
    assert daemon_json.read_text() == text
