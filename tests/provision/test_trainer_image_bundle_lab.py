"""The trainer role's image from an offline bundle, on a real lab node's Docker: the role loads the bundle's
archive (roles/trainer/tasks/docker_image_bundle.yml) unless the node has the image of the ID beside it, loads
it again when the bundle holds another image of the same name, and refuses an archive that is not the image
its .id names, in one line.

`invoke bundle.build` builds the real image with Docker where the base image's registry can be reached;
neither is here, and the lab's nspawn nodes cannot run a build's containers. So the images are small ones
imported on the node itself (`docker import` of a file tree), saved with `docker save` into a scratch bundle
directory, as bundle.build saves the trainer's. The load, the ID check and the rerun are the role's own."""

import dataclasses
import re

import pytest

from dtlab import provision
from dtlab.deploy import deploy, require_image
from dtlab.errors import DtlabError
from dtlab.lab.access import run_on_node
from dtlab.platforms import load_cluster

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PLAYBOOK = "tests/provision/playbooks/trainer_image_bundle.yml"
SCRATCH = "/var/tmp/dtlab-trainer-image"  # on the node: the bundle directory and the images' file trees
IMAGE, TAG = "dtlab-test-trainer", "bundle"
ARCHIVE = f"{SCRATCH}/bundle/images/{IMAGE}_{TAG}.tar"  # trainer_docker_image_archive, under the bundle


def test_the_trainer_role_loads_its_image_from_the_bundle_by_its_id(provisioned_lab):
    lab, _ = provisioned_lab
    node = lab.node_names[-1]

    def on_node(command):
        done = run_on_node(lab, node, command, timeout=120)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout.strip()

    def bundle_image(content: str) -> str:
        """An image of one file, saved as the bundle's archive with its ID beside it, and gone from Docker."""
        image_id = on_node(f"mkdir -p {SCRATCH}/tree {SCRATCH}/bundle/images"
                           f" && echo {content} > {SCRATCH}/tree/f"
                           f" && tar -C {SCRATCH}/tree -c . | docker import - {IMAGE}:{TAG}")
        on_node(f"docker save --output {ARCHIVE} {IMAGE}:{TAG} && echo {image_id} > {ARCHIVE}.id"
                f" && docker rmi {IMAGE}:{TAG}")
        return image_id

    def load():
        return provision.converge(lab.inventory_path, playbook=PLAYBOOK, limit=node, extravars={
            "dtlab_bundle_dir": f"{SCRATCH}/bundle", "trainer_docker_image_name": IMAGE,
            "trainer_docker_image_tag": TAG})

    def image_on_node() -> str:
        return on_node(f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}:{TAG}")

    on_node(f"rm -rf {SCRATCH}; docker rmi {IMAGE}:{TAG} >/dev/null 2>&1 || true")
    try:
        first_id = bundle_image("first")
        first = load()
        assert first.ok and first.count("changed", node) >= 1, first.summary() + first.output[-3000:]
        assert image_on_node() == first_id
        again = load()
        assert again.ok and again.count("changed", node) == 0, again.output[-3000:]

        second_id = bundle_image("second")  # a rebuilt bundle: another image under the same name
        assert second_id != first_id
        assert load().ok and image_on_node() == second_id

        on_node(f"echo sha256:{'0' * 64} > {ARCHIVE}.id")  # an archive that is not the image its .id names
        refused = load()
        assert not refused.ok
        said = (f"trainer: {node}: {IMAGE}:{TAG} is {second_id} after loading {ARCHIVE}, whose .id says"
                f" sha256:{'0' * 64}: build the bundle's images part again")
        assert said in refused.output, refused.output[-3000:]

        # trainer.deploy builds nothing offline: it asks each worker for the bundle's image.
        host = load_cluster(lab.inventory_path).node(node)
        require_image(host, f"{IMAGE}:{TAG}")
        on_node(f"docker rmi {IMAGE}:{TAG}")
        with pytest.raises(DtlabError) as missing:
            require_image(host, f"{IMAGE}:{TAG}")
        assert str(missing.value).startswith(f"host {node}: no docker image {IMAGE}:{TAG}; with the offline"
                                             " bundle the trainer role loads it")
        # The whole of trainer.deploy for the docker runtime on this offline lab (dtlab_bundle): it asks the
        # workers for the image (the lab loads none: trainer_docker_image_build is off), and builds nothing.
        lab_cluster = load_cluster(lab.inventory_path)
        docker_runtime = dataclasses.replace(lab_cluster, nodes=tuple(
            dataclasses.replace(n, hostvars={**n.hostvars, "dtlab_trainer_runtime": "docker"})
            for n in lab_cluster.nodes))
        with pytest.raises(DtlabError) as offline:
            deploy(docker_runtime, say=lambda line: None)
        assert re.fullmatch(r"host node\d: no docker image dtlab-trainer:latest; with the offline bundle the"
                            r" trainer role loads it from the bundle's images/ .*", str(offline.value))
    finally:
        on_node(f"rm -rf {SCRATCH}; docker rmi {IMAGE}:{TAG} >/dev/null 2>&1 || true")
