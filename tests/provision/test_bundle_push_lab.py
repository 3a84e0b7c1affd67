"""The common role's push of the offline bundle (`dtlab_bundle_push`, rsync through Ansible's synchronize) to
a real lab node. The test lab's converges never push: its nodes mount the bundle read-only, as a cluster with
a shared mount would (docs/offline.md). A real cluster's converge pushes; this runs that task alone."""

from pathlib import Path

import pytest

from dtlab import bundle, provision
from dtlab.lab.access import run_on_node
from dtlab.platforms import load_cluster

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PLAYBOOK = Path(__file__).parent / "playbooks" / "bundle_push.yml"
PUSHED = "/var/tmp/dtlab-pushed-bundle"  # on the node's own disk, beside its read-only mount of the bundle


def test_the_common_role_pushes_the_bundle_as_its_manifest_lists_it_and_removes_what_it_does_not(lab):
    cluster = load_cluster(lab.inventory_path)
    source = Path(cluster.var("dtlab_bundle"))
    node = lab.node_names[-1]  # a worker

    def push():
        result = provision.converge(lab.inventory_path, playbook=str(PLAYBOOK), limit=node,
                                    extravars={"dtlab_bundle_push": True, "dtlab_bundle_dir": PUSHED})
        assert result.ok, result.summary() + result.output[-3000:]
        return result.count("changed", node)

    def on_node(command, **kwargs):
        return run_on_node(lab, node, command, timeout=300, **kwargs)

    on_node(f"rm -rf {PUSHED}")
    try:
        assert push() == 1
        entries = bundle.read_manifest(source)
        sums = "".join(f"{entry.sha256}  {entry.path}\n" for entry in entries)
        checked = on_node(f"cd {PUSHED} && sha256sum --check --quiet --strict", input_text=sums)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        pushed = on_node(f"cd {PUSHED} && find . -type f -printf '%P\\n'").stdout.split()
        assert sorted(pushed) == sorted([entry.path for entry in entries] + [bundle.MANIFEST])

        on_node(f"touch {PUSHED}/stray-file")  # left by hand, or by an older bundle
        assert push() == 1
        assert on_node(f"test -e {PUSHED}/stray-file").returncode == 1
        assert push() == 0  # nothing left to change
    finally:
        on_node(f"rm -rf {PUSHED}")
