"""determined_common's offline path on a real lab node: with `dtlab_bundle`, the package of a Determined
component is fetched from the bundle's determined/ through a file:// URL (roles/determined_common/vars),
installed with apt, and its unit started and enabled, as determined_agent imports the role.

No Determined release can be reached here (GitHub), and upstream ships no package that runs without its
master, so the package is a stand-in: a real .deb of the release's name and version that ships the unit the
real one ships (`determined-agent.service`), running `sleep`. The fetch, the install, the unit and a second
run that changes nothing are the role's own tasks. The package and its unit are removed afterwards, so the
shared test lab is left as it was."""

import hashlib
import subprocess
from pathlib import Path

import pytest

from dtlab import provision
from dtlab.lab.access import run_on_node
from dtlab.platforms import load_cluster
from dtlab.roles import role_value

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PLAYBOOK = Path(__file__).parent / "playbooks" / "determined_release.yml"
SCRATCH = "/var/tmp/dtlab-determined-release"  # on the node: a bundle directory, agent.yaml, checkpoints


def stand_in_package(stage: Path, deb_name: str, version: str, service: str) -> Path:
    """<deb_name>: package determined-agent at `version`, with /lib/systemd/system/<service>.service."""
    root = stage / "tree"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: determined-agent\nVersion: {version}\nArchitecture: amd64\n"
        "Maintainer: dtlab tests <tests@dtlab>\nDescription: stand-in of Determined's agent package\n")
    unit = root / "lib" / "systemd" / "system" / f"{service}.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Unit]\nDescription=stand-in of Determined's agent (dtlab test)\n\n"
                    "[Service]\nExecStart=/bin/sleep infinity\n\n[Install]\nWantedBy=multi-user.target\n")
    release = stage / "release"
    release.mkdir()
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(release / deb_name)],
                   check=True, capture_output=True)
    return release


def test_determined_common_installs_the_package_from_the_bundle_and_runs_its_unit(lab, tmp_path):
    cluster = load_cluster(lab.inventory_path)
    node = lab.node_names[-1]  # a worker, where the agent runs
    node_os = str(cluster.require("dtlab_node_os"))
    component = {"determined_common_component": "agent"}
    deb_name = role_value(cluster.node(node), "determined_common", "determined_common_deb", node_os,
                          component)
    version = str(cluster.var("determined_version")).strip()
    service = str(cluster.var("determined_agent_service"))
    assert deb_name == f"determined-agent_{version}_linux_amd64.deb"
    assert cluster.var("dtlab_bundle"), "the test lab is an offline lab: the role takes the bundle's path"
    release = stand_in_package(tmp_path, deb_name, version, service)

    def install():
        return provision.converge(lab.inventory_path, playbook=str(PLAYBOOK), limit=node, extravars={
            "package_stage": str(release), "scratch": SCRATCH, "dtlab_bundle_dir": f"{SCRATCH}/bundle",
            "dtlab_user": "root"})  # the checkpoints' owner: a node not yet converged has no dtlab user

    def on_node(command):
        return run_on_node(lab, node, command, timeout=120)

    assert on_node("dpkg-query -W determined-agent").returncode != 0, "the lab node has no Determined package"
    on_node(f"rm -rf {SCRATCH}")
    try:
        first = install()
        assert first.ok, first.summary() + first.output[-3000:]
        # The role's own handler restarts the (stand-in) unit after the install.
        assert "RUNNING HANDLER [determined_common : Restart determined-agent]" in first.output
        installed = on_node("dpkg-query -W -f '${Version}' determined-agent").stdout.strip()
        assert installed == version
        fetched = on_node(f"sha256sum /var/cache/apt/archives/{deb_name}").stdout.split()[0]
        assert fetched == hashlib.sha256((release / deb_name).read_bytes()).hexdigest()
        assert on_node(f"systemctl is-active {service}").stdout.strip() == "active"
        assert on_node(f"systemctl is-enabled {service}").stdout.strip() == "enabled"
        assert on_node(f"cat {SCRATCH}/etc/agent.yaml").stdout.strip().endswith(f"master_host: {node}")
        again = install()
        assert again.ok and again.count("changed", node) == 0, again.output[-3000:]
    finally:
        on_node(f"systemctl disable --now {service}; dpkg --purge determined-agent;"
                f" rm -rf {SCRATCH} /var/cache/apt/archives/{deb_name}")
    assert on_node("dpkg-query -W determined-agent").returncode != 0
