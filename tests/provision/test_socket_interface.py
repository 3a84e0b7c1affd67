"""The socket interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME) found per node from its facts: the filter
on this machine's real facts, and the common role's tasks run for real against the controller (writing
to a temporary file). The lab exercises the same path on KVM-style interface names (enp1s0) on every run:
tests/provision/test_lab_converge.py."""

import importlib.util
import json
import os
import subprocess

import pytest
from ansible.errors import AnsibleFilterError

from dtlab import paths
from tests.provision.provision_helpers import site_plays

ANSIBLE = paths.REPO_ROOT / ".venv" / "bin" / "ansible"
ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"
ENV = {
    **os.environ,
    "ANSIBLE_CONFIG": str(paths.ANSIBLE_CFG),
    "ANSIBLE_CACHE_PLUGIN": "memory",
    "ANSIBLE_NOCOLOR": "1",
}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role's tasks write root-owned files")


def load_filter():
    spec = importlib.util.spec_from_file_location(
        "dtlab_net", paths.REPO_ROOT / "plugins/filter/dtlab_net.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dtlab_interface_holding


@pytest.fixture(scope="module")
def real_facts():
    """This machine's network facts, as the setup module gathers them on a node."""
    answer = subprocess.run(
        [str(ANSIBLE), "localhost", "-c", "local", "-m", "setup", "-a", "gather_subset=!all,!min,network"],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        cwd=paths.REPO_ROOT,
    )
    assert answer.returncode == 0, answer.stdout[-2000:] + answer.stderr[-2000:]
    return json.loads("{" + answer.stdout.split("=>", 1)[1].split("{", 1)[1])["ansible_facts"]


def ipv4_by_interface() -> dict[str, list[str]]:
    """The same machine's IPv4 addresses as iproute2 lists them: the independent answer."""
    links = json.loads(
        subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    )
    return {link["ifname"]: [a["local"] for a in link.get("addr_info", [])] for link in links}


def test_the_filter_names_the_interface_holding_each_address_as_iproute2_does(real_facts):
    holding = load_filter()
    listed = ipv4_by_interface()
    owners: dict[str, set[str]] = {}
    for name, addresses in listed.items():
        for address in addresses:
            owners.setdefault(address, set()).add(name)
    checked = [(address, next(iter(names))) for address, names in owners.items() if len(names) == 1]
    assert ("127.0.0.1", "lo") in checked
    for address, name in checked:
        # Names come from the facts' `device`, not the mangled fact keys (dtlab-br is ansible_dtlab_br).
        assert holding(real_facts, address) == name, address


def test_an_address_no_interface_holds_is_refused_with_one_line_naming_the_interfaces(real_facts):
    holding = load_filter()
    with pytest.raises(AnsibleFilterError) as refused:
        holding(real_facts, "198.51.100.77")
    message = str(refused.value)
    assert "no interface holds ansible_host 198.51.100.77" in message and "\n" not in message
    assert "lo 127.0.0.1" in message and "set dtlab_socket_ifname for this host" in message
    with pytest.raises(AnsibleFilterError, match="ansible_host node7 is a name, not an address"):
        holding(real_facts, "node7")


def converge_socket_tasks(tmp_path, host_vars: str) -> subprocess.CompletedProcess:
    """The common role's socket interface tasks on the controller, with the repository's group_vars."""
    inventory_dir = tmp_path / "inventory"
    inventory_dir.mkdir(parents=True)
    os.symlink(paths.INVENTORY_DIR / "group_vars", inventory_dir / "group_vars")
    (inventory_dir / "hosts.yml").write_text(
        "all:\n  children:\n    master:\n      hosts:\n        controller:\n"
        "          ansible_host: 127.0.0.1\n          ansible_connection: local\n"
        "          ansible_python_interpreter: /usr/bin/python3\n" + host_vars
    )
    playbook = tmp_path / "socket.yml"
    playbook.write_text(
        "- hosts: controller\n  gather_subset: [network]\n  tasks:\n"
        "    - ansible.builtin.include_role: {name: common, tasks_from: socket_interface}\n"
    )
    return subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "-i",
            str(inventory_dir / "hosts.yml"),
            str(playbook),
            "-e",
            f"dtlab_socket_env_file={tmp_path}/etc/socket.env",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        cwd=paths.REPO_ROOT,
    )


@pytest.mark.slow  # three ansible-playbook runs
def test_the_common_role_writes_the_discovered_interface_or_the_inventorys(tmp_path):
    found = converge_socket_tasks(tmp_path / "a", "")
    env_file = tmp_path / "a" / "etc" / "socket.env"
    assert found.returncode == 0, found.stdout[-3000:]
    assert env_file.read_text() == "GLOO_SOCKET_IFNAME=lo\nNCCL_SOCKET_IFNAME=lo\n"  # it holds 127.0.0.1
    assert "gloo and NCCL use lo (it holds ansible_host 127.0.0.1)" in found.stdout

    named = converge_socket_tasks(tmp_path / "b", "          dtlab_socket_ifname: lo\n")
    assert named.returncode == 0 and "gloo and NCCL use lo (dtlab_socket_ifname)" in named.stdout

    missing = converge_socket_tasks(tmp_path / "c", "          dtlab_socket_ifname: ib7\n")
    assert missing.returncode != 0
    assert (
        "common: controller has no interface ib7 (dtlab_socket_ifname); its interfaces are" in missing.stdout
    )
    assert not (tmp_path / "c" / "etc" / "socket.env").exists()


def test_a_run_with_tags_that_skip_fact_gathering_does_not_need_the_interface(tmp_path):
    """`site.yml --tags spark` skips the common play's facts but not its argument validation (tagged
    always): nothing that validation renders may need the facts, or every tagged run fails there."""
    inventory_dir = tmp_path / "inventory"
    inventory_dir.mkdir()
    os.symlink(paths.INVENTORY_DIR / "group_vars", inventory_dir / "group_vars")
    (inventory_dir / "hosts.yml").write_text(
        "all:\n  children:\n    master:\n      hosts:\n        controller:\n"
        "          ansible_host: 127.0.0.1\n          ansible_connection: local\n"
        "          ansible_python_interpreter: /usr/bin/python3\n"
    )
    result = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inventory_dir / "hosts.yml"), str(site_plays(tmp_path, "common")),
         "--check", "--tags", "no-such-component"],
        capture_output=True, text=True, timeout=300, env=ENV, cwd=paths.REPO_ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "TASK [common : Validating arguments against arg spec 'main'" in result.stdout
    assert "Gathering Facts" not in result.stdout
