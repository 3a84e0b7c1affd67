"""The lab's pure parts, no root needed: its shape, the host's apt sources, the inventory, the apt proxy."""

import contextlib
import dataclasses
import http.server
import ipaddress
import threading
import urllib.error
import urllib.request

import pytest
import yaml

from dtlab import aptproxy
from dtlab.errors import DtlabError
from dtlab.lab import config, host, inventory, network


def test_default_lab_shape_comes_from_group_vars():
    lab = config.load_config("dtlab")
    lab_vars = yaml.safe_load(config.LAB_VARS_FILE.read_text())
    assert lab.node_names == [f"node{index}" for index in range(lab_vars["lab_node_count"])]
    assert str(lab.subnet) == lab_vars["lab_default_subnet"]
    assert lab.inventory_path.name == "lab.yml"
    first_address = lab.subnet.network_address + lab_vars["lab_node_address_offset"]
    assert lab.node_address("node0") == first_address


@pytest.mark.parametrize("name", ["dtlab", "dtlabtest", "harness", "averylonglabnamexyz1"])
def test_every_lab_fits_linux_ifnames_and_the_guarded_range(name):
    lab = config.load_config(name, node_count=200)
    assert lab.subnet.subnet_of(lab.address_range)
    assert lab.bridge_address in lab.subnet
    names = [lab.bridge_ifname, *(lab.veth_host_ifname(node) for node in lab.node_names)]
    assert all(len(ifname) <= 15 for ifname in names)
    assert len(set(names)) == len(names)


def test_other_labs_get_their_own_subnet_and_inventory():
    default, other = config.load_config("dtlab"), config.load_config("dtlabtest")
    assert not other.subnet.overlaps(default.subnet)
    assert other.inventory_path.name == "lab-dtlabtest.yml"
    assert config.load_config("dtlabtest").subnet == other.subnet  # deterministic
    assert other.bridge_ifname != default.bridge_ifname


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "Bad_Name"}, "lowercase"),
    ({"name": "dtlab", "subnet": "192.168.1.0/24"}, "inside 10.213.0.0/16"),
    ({"name": "dtlab", "subnet": "10.213.4.0/23"}, "must be a /24"),
    ({"name": "dtlab", "node_count": 1}, "lab_node_count"),
])
def test_bad_lab_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(DtlabError, match=message) as error:
        config.load_config(**kwargs)
    assert "\n" not in str(error.value)


ONE_LINE_SOURCES = """\
deb [arch=amd64 signed-by=/k] http://mirror.invalid/debian bookworm main
# deb http://commented.invalid/debian bookworm main
deb-src http://src.invalid/debian bookworm main
"""
DEB822_SOURCES = """\
Types: deb
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
Enabled: no
URIs: http://off.invalid/debian
Suites: bookworm
Components: main
"""


def test_apt_sources_are_read_from_both_formats():
    assert host._parse_one_line(ONE_LINE_SOURCES) == [
        host.AptSource("http://mirror.invalid/debian", "bookworm", ("main",))]
    deb822 = host._parse_deb822(DEB822_SOURCES)
    assert [(source.host, source.suite) for source in deb822] == [("mirror.invalid", "bookworm"),
                                                                  ("mirror.invalid", "bookworm-updates")]


def test_an_image_build_without_a_plain_http_source_is_refused_before_it_starts(tmp_path, monkeypatch):
    from dtlab.lab import image

    sources_dir = tmp_path / "sources.list.d"
    sources_dir.mkdir()
    (tmp_path / "sources.list").write_text("deb https://mirror.invalid/debian bookworm main\n")
    monkeypatch.setattr(host, "APT_SOURCES_LIST", tmp_path / "sources.list")
    monkeypatch.setattr(host, "APT_SOURCES_DIR", sources_dir)
    monkeypatch.setattr(image, "IMAGE_CACHE_DIR", tmp_path / "images")
    with pytest.raises(DtlabError) as error:
        image.ensure_image(config.load_config("dtlab"))
    assert str(error.value) == ("lab: no plain-http `deb` source for bookworm in /etc/apt/sources*: the image"
                                " and the nodes' apt proxy need one (http://, not https://)")
    assert not list((tmp_path / "images").glob(".build-*"))


def test_inventory_uses_the_reference_groups_and_portable_paths():
    lab = config.load_config("dtlab", node_count=4)
    rendered = yaml.safe_load(inventory.render(lab))["lab"]
    assert list(rendered["children"]) == ["master", "workers"]
    assert list(rendered["children"]["workers"]["hosts"]) == ["node1", "node2", "node3"]
    assert rendered["hosts"]["node3"] == {"ansible_host": str(lab.node_address("node3")), "gpu_indices": [],
                                          "dtlab_cluster_name": "lab", "dtlab_lab_name": "dtlab"}
    key_file = rendered["vars"]["ansible_ssh_private_key_file"]
    assert key_file.startswith("{{ inventory_dir }}/../.dtlab/lab/dtlab/")
    assert "StrictHostKeyChecking=yes" in rendered["vars"]["ansible_ssh_common_args"]


def test_ansible_sees_each_labs_own_cluster_name(tmp_path):
    """Host vars in the inventory beat group_vars/all.yml's default cluster name."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig
    from ansible.vars.manager import VariableManager

    if not AnsibleCollectionConfig.collection_finder:  # as ansible's CLI does; another test may have done it
        init_plugin_loader()
    (tmp_path / "group_vars").symlink_to(config.paths.INVENTORY_DIR / "group_vars")  # as beside the real ones
    inventory_file = tmp_path / "lab-dtlabtest.yml"
    inventory_file.write_text(inventory.render(config.load_config("dtlabtest")))
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(inventory_file)])
    variables = VariableManager(loader=loader, inventory=manager).get_vars(host=manager.get_host("node1"))
    assert variables["dtlab_cluster_name"] == "lab-dtlabtest"
    assert variables["dtlab_device"] == "cpu"  # group_vars/lab.yml applies (group `lab`)


def test_an_inventory_variant_sets_its_host_vars_over_group_vars_and_leaves_the_original(tmp_path):
    from dtlab.platforms import load_cluster

    inventory_dir = tmp_path / "inventory"  # as the repository lays it out (../constraints.txt)
    inventory_dir.mkdir()
    (inventory_dir / "group_vars").symlink_to(config.paths.INVENTORY_DIR / "group_vars")
    (tmp_path / "constraints.txt").write_text(config.paths.CONSTRAINTS_FILE.read_text())
    original = inventory_dir / "lab-dtlabtest.yml"
    original.write_text(inventory.render(config.load_config("dtlabtest")))
    before = original.read_text()
    variant = inventory.variant(original, "application", spark_session="application")
    assert variant == inventory_dir / "lab-dtlabtest-application.yml" and original.read_text() == before
    varied, plain = load_cluster(variant), load_cluster(original)
    assert [node.var("spark_session") for node in varied.nodes] == ["application"] * len(varied.nodes)
    assert plain.master.var("spark_session") == "connect"  # group_vars/lab.yml's, over all.yml's
    assert [n.address for n in varied.nodes] == [n.address for n in plain.nodes]


def test_an_offline_labs_inventory_names_its_bundle_for_every_node():
    lab = config.load_config("dtlabtest")
    hosts = yaml.safe_load(inventory.render(lab, bundle="/srv/bundle"))["lab"]["hosts"]
    assert {name: (host["dtlab_bundle"], host["dtlab_bundle_push"]) for name, host in hosts.items()} == {
        name: ("/srv/bundle", False) for name in lab.node_names}
    assert lab.bundle_mount == "/opt/dtlab/bundle"  # dtlab_bundle_dir, read from group_vars/all.yml
    online = yaml.safe_load(inventory.render(lab))["lab"]["hosts"]
    assert not any("dtlab_bundle" in host for host in online.values())


@pytest.mark.skipif(config.paths.STATE_DIR.resolve() != (config.paths.REPO_ROOT / ".dtlab").resolve(),
                    reason="DTLAB_STATE_DIR moves the key paths the committed inventory names")
def test_committed_default_inventory_is_the_current_rendering():
    lab = config.load_config("dtlab")
    assert lab.inventory_path.read_text() == inventory.render(lab)


def test_assert_guard_refuses_a_range_without_blackhole():
    unguarded_range = ipaddress.IPv4Network("10.214.0.0/16")
    unguarded = dataclasses.replace(config.load_config("dtlab"), address_range=unguarded_range)
    with pytest.raises(DtlabError, match="guard route"):
        network.assert_guard(unguarded)


def test_not_root_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(host.os, "geteuid", lambda: 1000)
    with pytest.raises(DtlabError, match="needs root"):
        host.require_root()


def test_too_little_disk_is_a_one_line_error(tmp_path):
    with pytest.raises(DtlabError, match="GiB free"):
        host.require_free_disk(tmp_path / "not" / "yet", 2**60)


# --- the apt proxy, on loopback only ------------------------------------------------------------------

class _Origin(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = b"package bytes" if self.path.endswith(".deb") else b"Release file"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def proxy_and_origin(tmp_path):
    origin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    handler = type("Handler", (aptproxy.AptProxyHandler,), {"allowed_hosts": frozenset({"127.0.0.1"}),
                                                            "cache_dir": tmp_path / "debs"})
    proxy = aptproxy.AptProxyServer(("127.0.0.1", 0), handler)
    for server in (origin, proxy):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{proxy.server_port}", f"http://127.0.0.1:{origin.server_port}", origin
    proxy.shutdown()
    proxy.server_close()
    with contextlib.suppress(OSError):
        origin.shutdown()
        origin.server_close()


def _via_proxy(proxy_url, url, method="GET"):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    try:
        with opener.open(urllib.request.Request(url, method=method), timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


def test_apt_proxy_forwards_get_to_allowed_hosts_only(proxy_and_origin):
    proxy_url, origin_url, _ = proxy_and_origin
    assert _via_proxy(proxy_url, f"{origin_url}/debian/dists/bookworm/Release") == (200, b"Release file")
    assert _via_proxy(proxy_url, "http://localhost:9/")[0] == 403  # not in the allowlist: never contacted
    assert _via_proxy(proxy_url, f"{origin_url}/x", method="POST")[0] == 405


def test_apt_proxy_serves_a_fetched_deb_again_without_the_origin(proxy_and_origin):
    proxy_url, origin_url, origin = proxy_and_origin
    deb_url = f"{origin_url}/debian/pool/main/h/hello/hello_2.10-3_amd64.deb"
    assert _via_proxy(proxy_url, deb_url) == (200, b"package bytes")
    origin.shutdown()
    origin.server_close()
    assert _via_proxy(proxy_url, deb_url) == (200, b"package bytes")  # from the cache
    assert _via_proxy(proxy_url, f"{origin_url}/debian/dists/bookworm/InRelease")[0] == 502  # never cached


def test_cgroup_walk_survives_directories_that_vanish_mid_walk(tmp_path):
    # A node's systemd creates and removes session scopes while kill_remnants walks its cgroups.
    import shutil
    import threading

    from dtlab.lab.nodes import _cgroup_tree

    root = tmp_path / "dtlab-node1"
    (root / "payload" / "keep").mkdir(parents=True)
    stop = threading.Event()

    def churn():
        for index in range(100_000):
            if stop.is_set():
                return
            scope = root / "payload" / f"session-{index % 7}.scope" / "inner"
            scope.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(scope.parent, ignore_errors=True)

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        for _ in range(300):
            walked = _cgroup_tree(root)
            assert walked[-1] == root and root / "payload" / "keep" in walked  # deepest first, root last
    finally:
        stop.set()
        churner.join(timeout=10)
    assert _cgroup_tree(tmp_path / "gone") == []


def test_a_node_process_started_here_is_running_until_it_exits_whatever_its_command_line_reads(tmp_path):
    # While a node's PID execs ip netns exec -> sh -> nspawn its /proc cmdline can read empty for an
    # instant; the boot wait took such a node for a dead one ("stopped while booting, no console output").
    import subprocess

    from dtlab.lab import nodes

    root = tmp_path / "node1" / "root"
    # A child whose command line never names systemd-nspawn: only its exit status can say it runs.
    child = subprocess.Popen(["sh", "-c", "sleep 30", "sh", "-D", str(root)])
    nodes._children[child.pid] = child
    try:
        assert nodes._is_node_process(child.pid, root)
        assert not nodes._is_node_process(child.pid, tmp_path / "node2" / "root")  # another node's root
        child.kill()
        child.wait(timeout=10)
        assert not nodes._is_node_process(child.pid, root)
    finally:
        child.kill()
        nodes._children.pop(child.pid, None)


def test_a_created_node_whose_root_lost_its_host_key_is_one_line_saying_how_to_start_over(tmp_path):
    from dtlab.lab import nodes

    lab = config.load_config("dtlab")
    root = tmp_path / "root"
    (root / "etc/ssh").mkdir(parents=True)
    with pytest.raises(DtlabError) as refused:
        nodes.host_public_key(lab, "node1", root)
    message = str(refused.value)
    assert message.startswith("lab dtlab: node1 was created but its root has no host key")
    assert "\n" not in message
    assert "invoke lab.down --wipe --name dtlab" in message
    (root / "etc/ssh/ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAAkey root@node1\n")
    assert nodes.host_public_key(lab, "node1", root) == "ssh-ed25519 AAAAkey"


def test_a_node_enters_its_cgroups_from_a_shell_that_then_becomes_nspawn(tmp_path):
    """dtlab.lab.nodes.ENTER_CGROUPS, the start of every node's command line: the shell writes its own PID
    into each cgroup's cgroup.procs (plain files here; the lab tests boot nodes in real cgroups), then execs
    the command, which so keeps that PID and the cgroups. No Python runs between fork and exec."""
    import subprocess

    from dtlab.lab.nodes import ENTER_CGROUPS

    cgroups = [tmp_path / "payload", tmp_path / "supervisor"]
    for cgroup in cgroups:
        cgroup.mkdir()
    done = subprocess.run(["sh", "-c", ENTER_CGROUPS, "sh", *map(str, cgroups), "--", "sh", "-c", "echo $$"],
                          capture_output=True, text=True, timeout=30, check=True)
    pid = done.stdout.strip()
    assert pid.isdigit() and [(c / "cgroup.procs").read_text().strip() for c in cgroups] == [pid, pid]
    missing = subprocess.run(["sh", "-c", ENTER_CGROUPS, "sh", str(tmp_path / "gone"), "--", "true"],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 1  # a cgroup it cannot enter: the node does not start outside it
