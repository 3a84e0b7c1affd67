"""The spark role's offline path on a real lab node: with `dtlab_bundle`, its tarball install fetches the
release and the published .sha512 beside it through file:// URLs (roles/spark/vars/main.yml), checks the one
against the other, unpacks and links it. The test lab runs Spark from pyspark, and no Apache download can be
reached here, so the release is a stand-in with the release's name and layout (bin/spark-class); its .sha512
is in the `HASH  NAME` layout Apache publishes for Spark's releases, which `invoke bundle.build` copies as it
is. The fetch, the check, the unpacking and the link are the role's own tasks, into scratch paths."""

import hashlib
import tarfile
from pathlib import Path

import pytest

from dtlab import provision
from dtlab.lab.access import run_on_node
from dtlab.platforms import load_cluster
from dtlab.roles import role_value

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PLAYBOOK = Path(__file__).parent / "playbooks" / "spark_release.yml"
SCRATCH = "/var/tmp/dtlab-spark-release"  # on the node: a bundle directory, the install dir and SPARK_HOME


def stand_in_release(stage: Path, tarball_name: str, published_sha512: str | None = None) -> Path:
    """<name>.tgz holding <name>/bin/spark-class, and <name>.tgz.sha512 (its own hash, or the one given)."""
    top = stage / "tree" / tarball_name
    (top / "bin").mkdir(parents=True)
    (top / "bin" / "spark-class").write_text("#!/bin/sh\necho stand-in spark-class\n")
    (top / "bin" / "spark-class").chmod(0o755)
    release = stage / "release"
    release.mkdir()
    tarball = release / f"{tarball_name}.tgz"
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(top, arcname=tarball_name)
    digest = published_sha512 or hashlib.sha512(tarball.read_bytes()).hexdigest()
    (release / f"{tarball.name}.sha512").write_text(f"{digest}  {tarball.name}\n")
    return release


def test_the_spark_role_installs_its_release_from_the_bundle_through_file_urls_and_refuses_a_wrong_hash(
        lab, tmp_path):
    cluster = load_cluster(lab.inventory_path)
    node = lab.node_names[-1]  # a worker
    node_os = str(cluster.require("dtlab_node_os"))
    url = role_value(cluster.node(node), "spark", "spark_tarball_url", node_os)
    tarball_name = url.rsplit("/", 1)[-1].removesuffix(".tgz")
    assert cluster.var("dtlab_bundle"), "the test lab is an offline lab: the role takes the bundle's path"

    def install(release: Path):
        return provision.converge(lab.inventory_path, playbook=str(PLAYBOOK), limit=node, extravars={
            "release_stage": str(release), "dtlab_bundle_dir": f"{SCRATCH}/bundle",
            "spark_install_dir": f"{SCRATCH}/opt", "spark_home": f"{SCRATCH}/spark"})

    def on_node(command):
        return run_on_node(lab, node, command, timeout=120)

    on_node(f"rm -rf {SCRATCH} && mkdir -p {SCRATCH}/opt")
    try:
        wrong = install(stand_in_release(tmp_path / "wrong", tarball_name, published_sha512="0" * 128))
        assert not wrong.ok
        assert "checksum" in wrong.output.lower(), wrong.output[-3000:]
        assert on_node(f"test -e {SCRATCH}/spark").returncode == 1  # nothing linked
        assert on_node(f"test -e {SCRATCH}/opt/{tarball_name}").returncode == 1  # nothing unpacked

        first = install(stand_in_release(tmp_path / "right", tarball_name))
        assert first.ok, first.summary() + first.output[-3000:]
        assert "restart spark: notified" in first.output
        ran = on_node(f"{SCRATCH}/spark/bin/spark-class")
        assert ran.stdout.strip() == "stand-in spark-class", ran.stdout + ran.stderr
        linked = on_node(f"readlink {SCRATCH}/spark").stdout.strip()
        assert linked == f"{SCRATCH}/opt/{tarball_name}"
        again = install(tmp_path / "right" / "release")
        assert again.ok and again.count("changed", node) == 0, again.output[-3000:]
    finally:
        on_node(f"rm -rf {SCRATCH}")
