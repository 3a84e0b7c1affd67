"""The inventory checks: one implementation (dtlab.platforms.load_cluster) behind both entry points.

Every `invoke` command reads the cluster with load_cluster; site.yml's first play (tag validate)
runs the same code through plugins/action/dtlab_inventory_check.py. Each bad inventory below is refused
by both with the same one line, naming the file, host or variable and the fix, and a non-zero exit;
nothing is written (no generated secret) and no node is contacted.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.pins import pinned
from dtlab.platforms import load_cluster

ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"
INVOKE = Path(sys.executable).parent / "invoke"
# ansible-playbook here keeps facts in memory: nothing under the repository's .dtlab/.
ANSIBLE_ENV = {**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"}


def three_nodes(**overrides):
    """The reference layout (node0 master, node1/node2 workers); overrides replace a host's vars."""
    hosts = {
        "node0": {"ansible_host": "10.20.0.10", "gpu_indices": [0]},
        "node1": {"ansible_host": "10.20.0.11", "gpu_indices": [0]},
        "node2": {"ansible_host": "10.20.0.12", "gpu_indices": [0]},
        **overrides,
    }
    return {"master": ["node0"], "workers": ["node1", "node2"], "hosts": hosts}


def with_vars(host, **host_vars):
    """The reference layout with some variables of one host changed."""
    layout = three_nodes()
    layout["hosts"][host] = {**layout["hosts"][host], **host_vars}
    return layout


def as_inventory(layout):
    hosts = layout["hosts"]
    return {"all": {"children": {
        group: {"hosts": {name: hosts[name] for name in layout[group]}}
        for group in ("master", "workers") if layout.get(group)
    }}}


def write(directory, layout, files=None, name="hosts.yml"):
    """A user's inventory: <directory>/inventory/<name> beside the repository's group_vars/all.yml,
    constraints.txt one level up (where group_vars/all.yml's spark_version reads the pyspark pin)."""
    inventory_dir = directory / "inventory"
    (inventory_dir / "group_vars").mkdir(parents=True)
    (inventory_dir / "group_vars" / "all.yml").write_text(
        (paths.INVENTORY_DIR / "group_vars" / "all.yml").read_text())
    (directory / "constraints.txt").write_text(paths.CONSTRAINTS_FILE.read_text())
    for relative, text in (files or {}).items():
        (inventory_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (inventory_dir / relative).write_text(text)
    path = inventory_dir / name
    path.write_text(layout if isinstance(layout, str) else yaml.safe_dump(as_inventory(layout)))
    return path


def harness_message(path):
    """What every `invoke` command prints after 'error: ' (None: the inventory passes)."""
    try:
        load_cluster(path)
    except DtlabError as error:
        return str(error)
    return None


def play(path, playbook=None, *extra):
    """ansible-playbook on the inventory: `playbook` with `extra`, or (None) site.yml's first play alone, its
    validation play, as a playbook of its own (what the other plays would do needs nodes)."""
    with tempfile.TemporaryDirectory(prefix="dtlab-validate-") as scratch:
        if playbook is None:
            playbook = str(Path(scratch) / "validate.yml")
            Path(playbook).write_text(yaml.safe_dump([yaml.safe_load(paths.SITE_PLAYBOOK.read_text())[0]]))
        return subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(path), playbook, *extra], cwd=paths.REPO_ROOT,
                              capture_output=True, text=True, timeout=300, env=ANSIBLE_ENV)


def play_message(result):
    """The one failure site.yml reports: an inventory given as one file is refused by the dtlab_inventory
    plugin before any play, as `error: <line>` alone and exit 2; a folder by the validation play (its
    `fatal:` line's msg)."""
    if result.returncode == 2 and not result.stdout and result.stderr.startswith("error: "):
        assert result.stderr.count("\n") == 1, result.stderr  # one line, no Ansible warning around it
        return result.stderr.removeprefix("error: ").rstrip("\n")
    fatal = [line for line in result.stdout.splitlines() if line.startswith("fatal:")]
    assert len(fatal) == 1, result.stdout[-3000:]
    return json.loads(fatal[0].split("=> ", 1)[1])["msg"]


UNCLOSED_BRACE = """\
all:
  children:
    master:
      hosts:
        node0: {ansible_host: 10.20.0.10
    workers:
      hosts:
        node1: {ansible_host: 10.20.0.11}
"""
BAD_INDENT = """\
all:
  children:
    master:
      hosts:
        node0: {ansible_host: 10.20.0.10}
   workers:
      hosts:
        node1: {ansible_host: 10.20.0.11}
"""
NOT_AN_INVENTORY = "all:\n  hosts: [node0, node1]\n"

# case: (layout or inventory text, extra files beside it, the file the line names, the line after it)
BAD_INVENTORIES = {
    # YAML syntax: the parser's own words and where; Ansible itself only warns and finds no host.
    "YAML: unclosed flow mapping": (
        UNCLOSED_BRACE, {}, "hosts.yml",
        "YAML syntax error at line 6, column 12: did not find expected ',' or '}' (while parsing a flow"
        " mapping that starts at line 5); fix the YAML there"),
    "YAML: bad indentation": (
        BAD_INDENT, {}, "hosts.yml",
        "YAML syntax error at line 6, column 4: did not find expected key (while parsing a block mapping"
        " that starts at line 2); fix the YAML there"),
    "YAML: tab in group_vars": (
        three_nodes(), {"group_vars/workers.yml": "dtlab_socket_ifname: eth0\n\tgpu_indices: [0]\n"},
        "group_vars/workers.yml",
        "YAML syntax error at line 2, column 1: found a tab character that violates indentation (while"
        " scanning a plain scalar that starts at line 1); fix the YAML there"),
    "not an inventory": (
        NOT_AN_INVENTORY, {}, "hosts.yml",
        "not an Ansible inventory: Invalid \"hosts\" entry for \"all\" group, requires a dictionary"),
    # The groups.
    "no master": (
        {**three_nodes(), "master": []}, {}, "hosts.yml",
        "no host in group 'master'; put exactly one host under master (see inventory/cluster.example.yml)"),
    "two masters": (
        {**three_nodes(), "master": ["node0", "node1"]}, {}, "hosts.yml",
        "group 'master' has 2 hosts (node0, node1); keep exactly one host under master"),
    "no worker": (
        {**three_nodes(), "workers": []}, {}, "hosts.yml",
        "no host in group 'workers'; put the training nodes under workers"),
    # Addresses.
    "worker without an address": (
        three_nodes(node2={"gpu_indices": [0]}), {}, "hosts.yml",
        "host node2: no ansible_host; set ansible_host: <its IP address> under node2"),
    "duplicate address": (
        with_vars("node2", ansible_host="10.20.0.11"), {}, "hosts.yml",
        "hosts node1 and node2 share ansible_host 10.20.0.11; give each node its own address"),
    **{
        f"placeholder address {address}": (
            with_vars("node1", ansible_host=address), {}, "hosts.yml",
            f"host node1: ansible_host {address} is a documentation placeholder (from"
            " inventory/cluster.example.yml); set the node's real address")
        for address in ("192.0.2.11", "198.51.100.7", "203.0.113.200", "2001:db8::11")
    },
    # GPU indices: distinct non-negative integers.
    "gpu_indices repeated": (
        with_vars("node1", gpu_indices=[0, 1, 0]), {}, "hosts.yml",
        "host node1: gpu_indices [0, 1, 0] lists GPU 0 more than once; list each GPU once"),
    "gpu_indices negative": (
        with_vars("node1", gpu_indices=[-1]), {}, "hosts.yml",
        "host node1: gpu_indices entry -1 is not a GPU number; use non-negative integers,"
        " e.g. gpu_indices: [0, 1]"),
    "gpu_indices word": (
        with_vars("node1", gpu_indices=["first"]), {}, "hosts.yml",
        "host node1: gpu_indices entry 'first' is not a GPU number; use non-negative integers,"
        " e.g. gpu_indices: [0, 1]"),
    "gpu_indices quoted number": (
        with_vars("node1", gpu_indices=["0"]), {}, "hosts.yml",
        "host node1: gpu_indices entry '0' is not a GPU number; use non-negative integers,"
        " e.g. gpu_indices: [0, 1]"),
    "gpu_indices bool": (
        with_vars("node1", gpu_indices=[True]), {}, "hosts.yml",
        "host node1: gpu_indices entry True is not a GPU number; use non-negative integers,"
        " e.g. gpu_indices: [0, 1]"),
    "gpu_indices string": (
        with_vars("node1", gpu_indices="0,1"), {}, "hosts.yml",
        "host node1: gpu_indices '0,1' is not a list; write a list of GPU numbers, e.g. gpu_indices: [0, 1]"
        " ([] for none)"),
    # Ports: every *_port a whole number from 1 to 65535.
    "ansible_port 0": (
        with_vars("node2", ansible_port=0), {}, "hosts.yml",
        "host node2: ansible_port 0 is not a port; use a whole number from 1 to 65535"),
    "ansible_port too big": (
        with_vars("node2", ansible_port=70022), {}, "hosts.yml",
        "host node2: ansible_port 70022 is not a port; use a whole number from 1 to 65535"),
    "spark port a word": (
        with_vars("node0", spark_master_port="spark"), {}, "hosts.yml",
        "host node0: spark_master_port 'spark' is not a port; use a whole number from 1 to 65535"),
    "determined port a bool": (
        with_vars("node0", determined_master_port=True), {}, "hosts.yml",
        "host node0: determined_master_port True is not a port; use a whole number from 1 to 65535"),
    "postgresql port a fraction": (
        with_vars("node0", postgresql_port=5432.5), {}, "hosts.yml",
        "host node0: postgresql_port 5432.5 is not a port; use a whole number from 1 to 65535"),
    "rendezvous port negative in group_vars": (
        three_nodes(), {"group_vars/workers.yml": "dtlab_rendezvous_port: -29500\n"}, "hosts.yml",
        "host node1: dtlab_rendezvous_port -29500 is not a port; use a whole number from 1 to 65535"),
    # Two services on one port: refused before any secret or node (issue 51's case: Slurm on Spark's 7077).
    "two services on one port": (
        with_vars("node0", slurm_slurmctld_port=7077), {}, "hosts.yml",
        "host node0: slurm_slurmctld_port and spark_master_port are both 7077; give each service a port of "
        "its own"),
    "a port inside Ray's worker range": (
        with_vars("node0", spark_master_port=10500), {}, "hosts.yml",
        "host node0: spark_master_port 10500 is inside ray_min_worker_port..ray_max_worker_port "
        "(10002-10999); move it out of that range"),
    # Spark: the cluster's release must be the pyspark pin's (the nodes' driver).
    "spark_version off the pin": (
        three_nodes(), {"group_vars/workers.yml": "spark_version: 3.5.1\n"}, "hosts.yml",
        "host node1: spark_version 3.5.1 does not match pyspark=={pin} in constraints.txt (the nodes'"
        " Spark driver); remove the spark_version override, or pin pyspark==3.5.1 in"
        " dtlab/platforms/spark/pins.txt"),
    # The rest.
    "duplicate agent_id": (
        three_nodes(node1={"ansible_host": "10.20.0.11", "determined_agent_id": "agent"},
                    node2={"ansible_host": "10.20.0.12", "determined_agent_id": "agent"}), {}, "hosts.yml",
        "determined_agent_id 'agent' is used by node1 and node2; give each worker its own"
        " determined_agent_id"),
    "unknown device": (
        with_vars("node2", dtlab_device="tpu"), {}, "hosts.yml",
        "host node2: dtlab_device must be cuda or cpu, got 'tpu'"),
    "unknown spark session": (
        three_nodes(), {"group_vars/all/site.yml": "spark_session: server\n"}, "hosts.yml",
        "host node0: spark_session must be application or connect, got 'server'"),
}


def expected_line(tmp_path, case):
    _, _, named_file, tail = BAD_INVENTORIES[case]
    tail = tail.replace("{pin}", pinned("pyspark"))
    return f"inventory {tmp_path / 'inventory' / named_file}: {tail}"


@pytest.mark.parametrize("case", BAD_INVENTORIES)
def test_the_harness_refuses_a_bad_inventory_with_one_line(tmp_path, case):
    layout, files, _, _ = BAD_INVENTORIES[case]
    message = harness_message(write(tmp_path, layout, files))
    assert message is not None and "\n" not in message
    assert message.startswith(expected_line(tmp_path, case)), message


@pytest.mark.core
@pytest.mark.slow  # an ansible-playbook run per case (2 s each, a minute in all)
@pytest.mark.parametrize("case", BAD_INVENTORIES)
def test_both_entry_points_refuse_a_bad_inventory_with_the_same_line(tmp_path, case):
    layout, files, _, _ = BAD_INVENTORIES[case]
    path = write(tmp_path, layout, files)
    message = harness_message(path)
    assert message is not None and message.startswith(expected_line(tmp_path, case)), message
    result = play(path)
    assert result.returncode != 0
    assert play_message(result) == message
    # ansible.cfg's strategy is Ansible's own: no deprecation warning around the line
    assert "deprecat" not in (result.stdout + result.stderr).lower()


def test_a_mistyped_inventory_path_is_one_line_from_both(tmp_path):
    path = write(tmp_path, three_nodes())
    typo = path.with_name("host.yml")
    expected = (f"inventory {typo}: no such file; check the path given to -i/--inventory or ansible.cfg's"
                " `inventory =` line")
    assert harness_message(typo) == expected
    result = play(typo)
    # Refused before any play, in that one line alone: no warnings from Ansible's inventory plugins.
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"error: {expected}\n")
    assert play_message(result) == expected


@pytest.mark.parametrize("case", ["YAML: unclosed flow mapping", "YAML: tab in group_vars"])
def test_ansible_playbook_says_a_yaml_error_in_one_line_before_any_play(tmp_path, case):
    layout, files, _, _ = BAD_INVENTORIES[case]
    path = write(tmp_path, layout, files)
    result = play(path, "site.yml")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"error: {harness_message(path)}\n"


def test_the_reference_layout_passes_both(tmp_path):
    path = write(tmp_path, three_nodes())
    assert harness_message(path) is None
    result = play(path)
    assert result.returncode == 0, result.stdout[-3000:]


def test_the_example_inventory_is_refused_until_its_addresses_are_real(tmp_path):
    example = paths.INVENTORY_DIR / "cluster.example.yml"
    refused = harness_message(example)
    assert refused == (f"inventory {example}: host node0: ansible_host 192.0.2.10 is a documentation"
                       " placeholder (from inventory/cluster.example.yml); set the node's real address")
    result = play(example)
    assert result.returncode != 0 and play_message(result) == refused
    # What the user does: copy it, put in the real addresses. Then it passes (group `cluster` and all).
    copy = write(tmp_path, example.read_text().replace("192.0.2.", "10.20.0."), name="cluster.yml")
    assert harness_message(copy) is None
    assert play(copy).returncode == 0


@pytest.mark.parametrize("extra", [[], ["--limit", "node1"]], ids=["all", "limit"])
def test_site_yml_generates_no_secret_for_a_bad_inventory(tmp_path, extra):
    path = write(tmp_path, with_vars("node1", gpu_indices=[0, 0]))
    result = play(path, "site.yml", *extra)
    assert result.returncode != 0
    assert "lists GPU 0 more than once" in play_message(result)
    assert "Generate the cluster secrets" not in result.stdout
    assert not (tmp_path / ".dtlab").exists()  # dtlab_secrets_dir is <inventory>/../.dtlab/secrets/


@pytest.mark.parametrize("case", ["YAML: unclosed flow mapping", "placeholder address 192.0.2.11",
                                  "spark_version off the pin"])
def test_invoke_prints_the_same_line_and_exits_2(tmp_path, case):
    layout, files, _, _ = BAD_INVENTORIES[case]
    path = write(tmp_path, layout, files)
    answer = subprocess.run([str(INVOKE), "cluster.check", "-i", str(path)], cwd=paths.REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert answer.returncode == 2
    assert answer.stderr == f"error: {harness_message(path)}\n"
    assert answer.stderr.startswith(f"error: {expected_line(tmp_path, case)}")
