"""The firewall role (roles/firewall).

Without a lab: its template, rendered by Ansible for several inventories, is a ruleset that the real
`nft` accepts, and loading it (twice) in a network namespace of the test's own replaces table inet
dtlab and leaves a site's table alone.

On the provisioned test lab: from a network namespace on the lab's bridge that is not a node, every
port that listens on a node is refused while SSH answers; from a node, the cluster's ports on the others
answer; the table comes back after a flush, beside a site's own table, and loads again at boot."""

import contextlib
import json
import os
import subprocess
import textwrap
import time
import uuid

import pytest
import yaml

from dtlab import paths, provision
from dtlab.lab.access import run_on_node
from dtlab.platforms import load_cluster

ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"
ROLE_DEFAULTS = yaml.safe_load((paths.REPO_ROOT / "roles/firewall/defaults/main.yml").read_text())
TABLE = ROLE_DEFAULTS["firewall_table"]
RULES_FILE = ROLE_DEFAULTS["firewall_rules_file"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="nft and network namespaces need root")


def ip(*argv, check=True):
    return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=check)


@contextlib.contextmanager
def scratch_netns(name):
    """A network namespace of this test's own, removed by name however the test ends."""
    ip("netns", "delete", name, check=False)  # a crashed run's leftover of the same name
    ip("netns", "add", name)
    try:
        yield name
    finally:
        ip("netns", "delete", name, check=False)


def nft_in(netns, *argv, stdin=None):
    return subprocess.run(
        ["ip", "netns", "exec", netns, "nft", *argv], input=stdin, capture_output=True, text=True, timeout=30
    )


# --- the template, without a lab ------------------------------------------------------------------------

RENDER_CASES = [
    {
        "name": "lab_like",
        "nodes": ["10.213.77.10", "10.213.77.11", "10.213.77.12"],
        "controller": ["10.213.77.1"],
    },
    {
        "name": "dual_stack",
        "nodes": ["192.168.10.10", "fd00:10::10", "192.168.10.11", "fd00:10::11"],
        "controller": ["2001:db8:ff::5"],
        "trusted": ["10.50.0.0/16", "10.50.3.0/24", "fd00:99::/64"],
        "tcp": [9100, 9100, 443],
        "udp": [161],
        "ssh_port": 2222,
        "interfaces": ["docker0", "br-lab"],
    },
    {
        "name": "silent_no_docker",
        "nodes": ["10.0.0.1", "10.0.0.2"],
        "controller": [],
        "refusal": "drop",
        "interfaces": [],
    },
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{case name: the ruleset the role's template renders for it}."""
    out_dir = tmp_path_factory.mktemp("firewall")
    cases_file = out_dir / "cases.json"
    cases_file.write_text(
        json.dumps({"firewall_render_cases": RENDER_CASES, "firewall_render_dir": str(out_dir)})
    )
    inventory = out_dir / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        "      ansible_python_interpreter: /usr/bin/python3\n"
    )
    result = subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "-i",
            str(inventory),
            "tests/provision/playbooks/firewall_rules.yml",
            "-e",
            f"@{cases_file}",
        ],
        cwd=paths.REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return {case["name"]: (out_dir / f"{case['name']}.nft").read_text() for case in RENDER_CASES}


@needs_root
def test_every_rendered_ruleset_is_one_nft_accepts(rendered):
    with scratch_netns(f"dtlab-fwcheck-{uuid.uuid4().hex[:6]}") as netns:
        for name, rules in rendered.items():
            checked = nft_in(netns, "-c", "-f", "-", stdin=rules)
            assert checked.returncode == 0, f"{name}: {checked.stderr}\n{rules}"


@needs_root
def test_the_sets_and_the_refusal_follow_the_inventory(rendered):
    with scratch_netns(f"dtlab-fwload-{uuid.uuid4().hex[:6]}") as netns:
        assert nft_in(netns, "-f", "-", stdin=rendered["dual_stack"]).returncode == 0
        listed = json.loads(nft_in(netns, "-j", "list", "table", "inet", TABLE).stdout)["nftables"]
    sets = {item["set"]["name"]: item["set"].get("elem", []) for item in listed if "set" in item}
    assert sorted(sets["nodes_ipv4"]) == ["192.168.10.10", "192.168.10.11"]
    assert sorted(sets["nodes_ipv6"]) == ["fd00:10::10", "fd00:10::11"]
    assert sets["controller_ipv4"] == [] and sets["controller_ipv6"] == ["2001:db8:ff::5"]
    # 10.50.3.0/24 lies inside 10.50.0.0/16: auto-merge keeps the wider one.
    assert sets["trusted_ipv4"] == [{"prefix": {"addr": "10.50.0.0", "len": 16}}], sets["trusted_ipv4"]
    chain = rendered["dual_stack"]
    assert "policy drop;" in chain and "tcp dport 2222 accept" in chain
    assert "tcp dport { 9100, 443 } accept" in chain and "udp dport { 161 } accept" in chain
    assert 'iifname { "docker0", "br-lab" } accept' in chain
    assert "reject with tcp reset" in chain
    silent = rendered["silent_no_docker"]
    assert "reject" not in silent.split("chain input")[1]  # the policy drops the rest
    assert "iifname" not in silent and "dport {" not in silent


@needs_root
def test_loading_replaces_the_dtlab_table_alone(rendered):
    site_table = textwrap.dedent("""\
        table inet site {
            chain input {
                type filter hook input priority filter + 10; policy accept;
                tcp dport 8443 counter accept
            }
        }
        """)
    with scratch_netns(f"dtlab-fwsite-{uuid.uuid4().hex[:6]}") as netns:
        assert nft_in(netns, "-f", "-", stdin=site_table).returncode == 0
        for rules in (rendered["lab_like"], rendered["dual_stack"]):  # first load, then a changed file
            loaded = nft_in(netns, "-f", "-", stdin=rules)
            assert loaded.returncode == 0, loaded.stderr
        tables = nft_in(netns, "list", "tables").stdout.split("\n")
        assert sorted(line for line in tables if line) == [f"table inet {TABLE}", "table inet site"]
        ours = nft_in(netns, "list", "table", "inet", TABLE).stdout
        assert "192.168.10.10" in ours and "10.213.77.10" not in ours  # replaced, not merged
        assert "tcp dport 8443" in nft_in(netns, "list", "table", "inet", "site").stdout


# --- on the test lab ----------------------------------------------------------------------------------


def lab_test(test):
    """A test on the provisioned test lab (the session's first converge is paid by whichever comes first)."""
    return pytest.mark.lab(pytest.mark.slow(pytest.mark.timeout(3600)(test)))


CONNECT_TIMEOUT_S = 3
# Connects to every (address, port) at once, each bounded, and prints what each answered.
PROBE = (
    textwrap.dedent("""
    import concurrent.futures, errno, json, socket, sys
    def attempt(target):
        address, port = target
        try:
            socket.create_connection((address, port), timeout=%d).close()
            return "open"
        except socket.timeout:
            return "timeout"
        except OSError as error:
            return errno.errorcode.get(error.errno, str(error))
    targets = [tuple(target) for target in json.loads(sys.argv[1])]
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(attempt, targets))
    print(json.dumps({f"{a}:{p}": answer for (a, p), answer in zip(targets, answers)}))
    """)
    % CONNECT_TIMEOUT_S
)


def probe_argv(targets):
    return ["/usr/bin/python3", "-c", PROBE, json.dumps(sorted(targets))]


def probe_from_node(lab, node, targets):
    import shlex

    result = run_on_node(lab, node, shlex.join(probe_argv(targets)), timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@contextlib.contextmanager
def outsider_on_the_bridge(lab):
    """A network namespace that is not a node, on the lab's bridge with a free address of its /24:
    where a host outside the cluster but on its network stands. Removed by name however the test ends."""
    from dtlab.lab.network import assert_guard

    assert_guard(lab)  # nothing is sent to a lab address without the guard route
    netns, veth = f"dtlab-{lab.name}-outsider", f"{lab.ifname_tag}-out"
    address = lab.subnet.network_address + 254  # nodes are .10 up to at most .249, the bridge .1

    def remove():
        ip("netns", "delete", netns, check=False)
        ip("link", "delete", veth, check=False)

    remove()  # a crashed run's leftovers, by name
    try:
        ip("netns", "add", netns)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        ip("link", "set", veth, "master", lab.bridge_ifname, "up")
        ip("-n", netns, "addr", "add", f"{address}/{lab.subnet.prefixlen}", "dev", "eth0")
        ip("-n", netns, "link", "set", "eth0", "up")
        ip("-n", netns, "link", "set", "lo", "up")
        yield netns
    finally:
        remove()


def listening_ports(lab, node):
    """TCP ports the node listens on other than on loopback (ss -ltn)."""
    lines = run_on_node(lab, node, "ss -ltnH").stdout.splitlines()
    local = [line.split()[3] for line in lines if line.strip()]
    return {
        int(endpoint.rsplit(":", 1)[1])
        for endpoint in local
        if not endpoint.startswith(("127.", "[::1]", "[::ffff:127."))
    }


@pytest.fixture(scope="module")
def lab_cluster(provisioned_lab):
    lab, _ = provisioned_lab
    return load_cluster(lab.inventory_path)


@lab_test
def test_every_node_admits_the_nodes_and_the_controller_the_bridge(provisioned_lab, lab_cluster):
    lab, _ = provisioned_lab
    node_addresses = sorted(node.address for node in lab_cluster.nodes)
    for node in lab_cluster.nodes:
        listed = run_on_node(lab, node.name, f"nft -j list table inet {TABLE}")
        assert listed.returncode == 0, f"{node.name}: {listed.stderr}"
        sets = {
            item["set"]["name"]: item["set"].get("elem", [])
            for item in json.loads(listed.stdout)["nftables"]
            if "set" in item
        }
        assert sorted(sets["nodes_ipv4"]) == node_addresses, node.name
        # The address Ansible's SSH connection came from: the lab's bridge, the controller's side.
        assert sets["controller_ipv4"] == [str(lab.bridge_address)], node.name
        assert sets["trusted_ipv4"] == [] and sets["nodes_ipv6"] == [], node.name


@pytest.mark.core
@lab_test
def test_an_outsider_on_the_network_reaches_ssh_and_no_other_port(provisioned_lab, lab_cluster):
    """A host on the cluster's own network, not a node: every port that listens on a node is refused,
    SSH answers. From a node, the same ports of the other nodes answer."""
    lab, _ = provisioned_lab
    listening = {node.name: listening_ports(lab, node.name) for node in lab_cluster.nodes}
    master, worker = lab_cluster.master, lab_cluster.workers[0]
    # The test is not empty: the platforms' daemons listen where the inventory says.
    for port_name in (
        "ray_gcs_port",
        "ray_dashboard_port",
        "spark_master_port",
        "slurm_slurmctld_port",
        "postgresql_port",
        "ray_node_manager_port",
    ):
        assert int(lab_cluster.var(port_name)) in listening[master.name], port_name
    for port_name in (
        "slurm_slurmd_port",
        "ray_node_manager_port",
        "ray_object_manager_port",
        "spark_worker_webui_port",
    ):
        assert int(lab_cluster.var(port_name)) in listening[worker.name], port_name
    ssh_port = {node.name: node.ssh_port for node in lab_cluster.nodes}
    targets = [(node.address, port) for node in lab_cluster.nodes for port in listening[node.name]]

    with outsider_on_the_bridge(lab) as netns:
        started = time.monotonic()
        probed = subprocess.run(
            ["ip", "netns", "exec", netns, *probe_argv(targets)], capture_output=True, text=True, timeout=60
        )
        took = time.monotonic() - started
    assert probed.returncode == 0, probed.stderr
    from_outside = json.loads(probed.stdout)
    answered = {target: answer for target, answer in from_outside.items() if answer == "open"}
    assert sorted(answered) == sorted(f"{node.address}:{ssh_port[node.name]}" for node in lab_cluster.nodes)
    refused = {answer for answer in from_outside.values() if answer != "open"}
    assert refused == {"ECONNREFUSED"}, refused  # firewall_refusal: reject, a TCP reset at once
    assert took < 4 * CONNECT_TIMEOUT_S, took

    # From a node, the others' cluster ports answer (the ones the inventory names; Ray's workers come and go).
    named = {int(master.var(key)) for key in master.hostvars if key.endswith("_port")}
    inside = [
        (node.address, port)
        for node in lab_cluster.nodes
        if node.name != worker.name
        for port in sorted(listening[node.name] & named)
    ]
    from_worker = probe_from_node(lab, worker.name, inside)
    assert inside and all(answer == "open" for answer in from_worker.values()), from_worker


@lab_test
def test_the_table_comes_back_beside_a_site_table_and_at_boot(provisioned_lab, lab_cluster):
    lab, _ = provisioned_lab
    node = lab_cluster.workers[-1].name
    site_table = "add table inet site; add chain inet site input { type filter hook input priority 10; }"
    assert run_on_node(lab, node, f"nft '{site_table}'").returncode == 0
    try:
        # A flushed dtlab table: the next converge finds it missing and loads the file again, alone.
        assert run_on_node(lab, node, f"nft delete table inet {TABLE}").returncode == 0
        again = provision.converge(lab.inventory_path, tags=["firewall"], limit=node)
        assert again.ok, again.summary() + again.output[-3000:]
        assert f"firewall: table inet {TABLE} is not loaded on {node}" in again.output
        tables = run_on_node(lab, node, "nft list tables").stdout.split()
        assert f"{TABLE}" in tables and "site" in tables, tables
        # What a boot does: nftables.service (enabled by the role) loads nftables.conf and its include.
        assert run_on_node(lab, node, "systemctl is-enabled nftables").stdout.strip() == "enabled"
        assert f'include "{RULES_FILE}"' in run_on_node(lab, node, "cat /etc/nftables.conf").stdout
        assert run_on_node(lab, node, f"nft delete table inet {TABLE}").returncode == 0
        booted = run_on_node(lab, node, "systemctl restart nftables")
        assert booted.returncode == 0, booted.stderr
        assert run_on_node(lab, node, f"nft list table inet {TABLE}").returncode == 0
    finally:
        run_on_node(lab, node, "nft delete table inet site")
    assert run_on_node(lab, node, f"nft list table inet {TABLE}").returncode == 0
