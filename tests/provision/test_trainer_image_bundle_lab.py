"""The trainer role's image from an offline bundle, on a real lab node's Docker: the role loads the bundle's
archive (roles/trainer/tasks/docker_image_bundle.yml) unless the node has the image whose inputs label
equals the `.inputs` beside the archive, loads it again when the bundle holds another image of the same
name, and refuses an archive that is not the image its `.inputs` names, in one line.

`invoke bundle.build` builds the real image with Docker where the base image's registry can be reached;
neither is here, and the lab's nspawn nodes cannot run a build's containers. So the images are small ones
imported on the node itself (`docker import` of a file tree, with the label bundle.build writes), saved with
`docker save` into a scratch bundle directory, as bundle.build saves the trainer's. The load, the label
check and the rerun are the role's own.

Why a label and not the image ID: Docker's containerd image store (docker-ce >= 24 with the
containerd-snapshotter feature, the default of a fresh docker-ce 29) gives an archive saved from the classic
store another ID. The lab's Docker is Debian 12's docker.io 20.10, which has no such store; so the second
test imports the same archive into the node's own containerd (`ctr`), the store that Docker mode uses, and
shows the ID changes while the label, in the image's config, does not."""

import dataclasses
import importlib.util
import json
import re

import pytest

from dtlab import paths, provision
from dtlab.deploy import deploy, require_image
from dtlab.errors import DtlabError
from dtlab.lab.access import run_on_node
from dtlab.platforms import load_cluster

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PLAYBOOK = "tests/provision/playbooks/trainer_image_bundle.yml"
SCRATCH = "/var/tmp/dtlab-trainer-image"  # on the node: the bundle directory and the images' file trees
IMAGE, TAG = "dtlab-test-trainer", "bundle"
ARCHIVE = f"{SCRATCH}/bundle/images/{IMAGE}_{TAG}.tar"  # trainer_docker_image_archive, under the bundle
LABEL = "dtlab.image.inputs"  # roles/trainer/vars/main.yml: trainer_docker_image_inputs_label
CONTAINERD_NAMESPACE = "dtlab-test"  # not Docker's own ("moby"): removed after


def load_filter():
    path = paths.REPO_ROOT / "plugins/filter/dtlab_docker.py"
    spec = importlib.util.spec_from_file_location("dtlab_docker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dtlab_image_label


dtlab_image_label = load_filter()


def node_shell(lab, node):
    def on_node(command):
        done = run_on_node(lab, node, command, timeout=120)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout.strip()

    return on_node


def bundle_image(on_node, content: str) -> str:
    """An image of one file, labelled as bundle.build labels the trainer's, saved as the bundle's archive
    with its inputs beside it, and gone from Docker. Returns its inputs digest."""
    inputs = f"sha256:{content * 64}"[:71]
    on_node(
        f"mkdir -p {SCRATCH}/tree {SCRATCH}/bundle/images && echo {content} > {SCRATCH}/tree/f"
        f" && tar -C {SCRATCH}/tree -c ."
        f" | docker import --change 'LABEL {LABEL}={inputs}' - {IMAGE}:{TAG}"
    )
    on_node(
        f"docker save --output {ARCHIVE} {IMAGE}:{TAG} && echo {inputs} > {ARCHIVE}.inputs"
        f" && docker rmi {IMAGE}:{TAG}"
    )
    return inputs


def test_the_trainer_role_loads_its_image_from_the_bundle_by_its_inputs_label(provisioned_lab):
    lab, _ = provisioned_lab
    node = lab.node_names[-1]
    on_node = node_shell(lab, node)

    def load():
        return provision.converge(
            lab.inventory_path,
            playbook=PLAYBOOK,
            limit=node,
            extravars={
                "dtlab_bundle_dir": f"{SCRATCH}/bundle",
                "trainer_docker_image_name": IMAGE,
                "trainer_docker_image_tag": TAG,
            },
        )

    def label_on_node() -> str:
        template = f'{{{{index .Config.Labels "{LABEL}"}}}}'
        return on_node(f"docker image inspect --format '{template}' {IMAGE}:{TAG}")

    on_node(f"rm -rf {SCRATCH}; docker rmi {IMAGE}:{TAG} >/dev/null 2>&1 || true")
    try:
        first = bundle_image(on_node, "1")
        loaded = load()
        assert loaded.ok and loaded.count("changed", node) >= 1, loaded.summary() + loaded.output[-3000:]
        assert label_on_node() == first
        again = load()
        assert again.ok and again.count("changed", node) == 0, again.output[-3000:]

        second = bundle_image(on_node, "2")  # a rebuilt bundle: another image under the same name
        assert second != first
        assert load().ok and label_on_node() == second

        on_node(f"echo sha256:{'0' * 64} > {ARCHIVE}.inputs")  # an archive that is not the image named
        refused = load()
        assert not refused.ok
        said = (
            f"trainer: {node}: {IMAGE}:{TAG} has {LABEL}={second} after loading {ARCHIVE}, whose .inputs"
            f" says sha256:{'0' * 64}: build the bundle's images part again"
        )
        assert said in refused.output, refused.output[-3000:]

        # trainer.deploy builds nothing offline: it asks each worker for the bundle's image.
        host = load_cluster(lab.inventory_path).node(node)
        require_image(host, f"{IMAGE}:{TAG}")
        on_node(f"docker rmi {IMAGE}:{TAG}")
        with pytest.raises(DtlabError) as missing:
            require_image(host, f"{IMAGE}:{TAG}")
        assert str(missing.value).startswith(
            f"host {node}: no docker image {IMAGE}:{TAG}; with the offline bundle the trainer role loads it"
        )
        # The whole of trainer.deploy for the docker runtime on this offline lab (dtlab_bundle): it asks the
        # workers for the image (the lab loads none: trainer_docker_image_build is off), and builds nothing.
        lab_cluster = load_cluster(lab.inventory_path)
        docker_runtime = dataclasses.replace(
            lab_cluster,
            nodes=tuple(
                dataclasses.replace(n, hostvars={**n.hostvars, "dtlab_trainer_runtime": "docker"})
                for n in lab_cluster.nodes
            ),
        )
        with pytest.raises(DtlabError) as offline:
            deploy(docker_runtime, say=lambda line: None)
        assert re.fullmatch(
            r"host node\d: no docker image dtlab-trainer:latest; with the offline bundle the"
            r" trainer role loads it from the bundle's images/ .*",
            str(offline.value),
        )
    finally:
        on_node(f"rm -rf {SCRATCH}; docker rmi {IMAGE}:{TAG} >/dev/null 2>&1 || true")


def test_the_containerd_store_gives_the_archive_another_id_and_the_same_inputs_label(provisioned_lab):
    lab, _ = provisioned_lab
    node = lab.node_names[-1]
    on_node = node_shell(lab, node)
    ctr = f"ctr --namespace {CONTAINERD_NAMESPACE}"

    def blob(digest: str) -> dict:
        return json.loads(on_node(f"{ctr} content get {digest}"))

    def clean():
        on_node(
            f"rm -rf {SCRATCH}; docker rmi {IMAGE}:{TAG} >/dev/null 2>&1 || true;"
            f' for ref in $({ctr} images ls --quiet); do {ctr} images rm --sync "$ref"; done >/dev/null;'
            f" {ctr} namespaces rm {CONTAINERD_NAMESPACE} >/dev/null 2>&1 || true"
        )

    clean()
    try:
        inputs = bundle_image(on_node, "3")
        on_node(f"docker load --input {ARCHIVE}")
        classic = json.loads(on_node(f"docker image inspect {IMAGE}:{TAG}"))
        on_node(f"{ctr} images import --all-platforms {ARCHIVE}")
        listed = [line.split() for line in on_node(f"{ctr} images ls").splitlines()[1:]]
        assert len(listed) == 1, listed
        target = listed[0][2]  # REF TYPE DIGEST ...: the ID Docker's containerd store reports
        manifest = blob(target)
        if "manifests" in manifest:  # an index: the one image in it
            manifest = blob(manifest["manifests"][0]["digest"])
        config_digest = manifest["config"]["digest"]
        oci_config = blob(config_digest)

        assert target.startswith("sha256:") and target != classic[0]["Id"], (target, classic[0]["Id"])
        assert config_digest == classic[0]["Id"]  # the same config, so the same labels, in both stores
        assert dtlab_image_label(classic, LABEL) == inputs
        # Docker's containerd store answers docker_image_info with this config's "config" as "Config".
        assert dtlab_image_label([{"Config": oci_config["config"]}], LABEL) == inputs
    finally:
        clean()
