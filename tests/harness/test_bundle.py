"""The offline bundle (dtlab.bundle; docs/offline.md): what it must hold for an inventory, what this
controller refuses to build, and how bundle.verify and site.yml's first play judge a bundle. The real
build, and a converge from it with the lab's egress blocked, is the session lab's own converge
(tests/conftest.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from harness_helpers import CPU_CLUSTER_3, CPU_SITE_VARS, invoke, write_inventory

from dtlab import bundle, paths, roles
from dtlab.errors import DtlabError
from dtlab.pins import pinned
from dtlab.platforms import load_cluster

LAB_ROLE_PACKAGES = {"docker.io", "postgresql", "python3-psycopg2", "munge", "slurm-client", "slurmctld",
                     "slurmd", "openjdk-17-jre-headless", "nftables", "cmake", "g++", "python3-dev",
                     "python3-venv", "rsync"}


@pytest.fixture
def lab_cluster():
    return load_cluster(paths.INVENTORY_DIR / "lab.yml")


@pytest.fixture
def debian_controller(monkeypatch, tmp_path):
    """This controller as Debian 12, whatever the test machine runs."""
    os_release = tmp_path / "os-release"
    os_release.write_text('PRETTY_NAME="Debian GNU/Linux 12"\nID=debian\nVERSION_CODENAME=bookworm\n')
    monkeypatch.setattr(bundle, "OS_RELEASE", os_release)


# --- what a bundle holds ----------------------------------------------------------------------------------


def test_every_apt_task_of_the_roles_is_read():
    """Counted apart from the YAML reader: each `ansible.builtin.apt:` whose argument lines hold `name:`."""
    counted = 0
    for task_file in (paths.REPO_ROOT / "roles").glob("*/tasks/*.yml"):
        blocks = re.split(r"^\s*ansible\.builtin\.apt:\s*$", task_file.read_text(), flags=re.MULTILINE)[1:]
        counted += sum(1 for block in blocks if re.match(r"(\s+(?!name:)\w+:.*\n)*\s+name:", block))
    found = roles.apt_tasks()
    assert len(found) == counted >= 8
    assert ("postgresql/tasks/main.yml", "{{ __postgresql_packages }}") in [(t.task_file, str(t.arguments))
                                                                          for t in found]


def test_the_lab_bundle_holds_every_package_its_roles_install_and_no_gpu_ones(lab_cluster):
    the_plan = bundle.plan(lab_cluster)
    assert set(the_plan.apt_packages) >= LAB_ROLE_PACKAGES
    assert not [p for p in the_plan.apt_packages if "nvidia" in p or p.startswith("linux-headers")]
    assert (the_plan.node_os, the_plan.node_python) == ("debian-bookworm", "3.11")
    assert the_plan.torch_build == "pypi" and f"torch=={pinned('torch')}" in the_plan.requirements
    assert "ray[default,train,serve]" in the_plan.requirements
    assert the_plan.built_wheels == {"horovod": ["horovod", "cloudpickle"]}  # the lab runs Horovod
    # The lab installs Spark from pyspark and no Determined binaries; smoke generates its model and data.
    assert the_plan.releases == [] and the_plan.images == []  # the lab builds no trainer image
    assert (the_plan.hf_models, the_plan.hf_datasets) == ([], [])


def test_a_cluster_bundle_names_the_releases_the_roles_download(tmp_path):
    cluster = load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": CPU_SITE_VARS}))
    the_plan = bundle.plan(cluster, profiles=["study"])
    spark, determined = pinned("pyspark"), pinned("determined")
    tarball = f"https://archive.apache.org/dist/spark/spark-{spark}/spark-{spark}-bin-hadoop3.tgz"
    releases = "https://github.com/determined-ai/determined/releases/download"
    assert the_plan.releases == [  # from the platforms' offline_releases, in the registry's order
        *({"platform": "determined", "name": f"determined-{component}", "version": determined,
           "url": f"{releases}/v{determined}/determined-{component}_{determined}_linux_amd64.deb",
           "checksum_url": None} for component in ("master", "agent")),
        {"platform": "spark", "name": "spark", "version": spark, "url": tarball,
         "checksum_url": f"{tarball}.sha512"}]
    assert (the_plan.hf_models, the_plan.hf_datasets) == (["prajjwal1/bert-tiny"], ["stanfordnlp/imdb"])
    assert (the_plan.node_os, the_plan.node_python) == ("ubuntu-noble", "3.12")
    # The trainer image, by the names the trainer role loads it by (trainer_docker_image_archive) and the
    # label it checks (trainer_docker_image_inputs_label).
    assert the_plan.images == [{"name": "dtlab-trainer:latest", "archive": "images/dtlab-trainer_latest.tar",
                                "base": "python:3.11-slim-bookworm", "inputs_label": "dtlab.image.inputs"}]


def test_a_url_the_inventory_sets_over_a_role_default_is_the_one_fetched(tmp_path):
    """As Ansible layers them: the inventory's spark_tarball_url beats the spark role's default."""
    mirror = "https://mirror.lab.example/spark/spark-bin.tgz"
    cluster = load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={
        "all": CPU_SITE_VARS + f"spark_tarball_url: {mirror}\n"}))
    spark = [r for r in bundle.plan(cluster).releases if r["platform"] == "spark"]
    assert [(r["url"], r["checksum_url"]) for r in spark] == [(mirror, f"{mirror}.sha512")]


def test_the_trainer_image_is_refused_in_one_line_where_no_docker_daemon_answers(tmp_path):
    if bundle._docker_answers():
        pytest.skip("this machine runs a Docker daemon: the images part would be built")
    cluster = load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": CPU_SITE_VARS}))
    out = tmp_path / "bundle"
    with pytest.raises(DtlabError) as refused:
        bundle.build(cluster, out, parts=["images"], say=lambda line: None)
    assert str(refused.value).startswith("bundle: images: the trainer image (trainer_docker_image_build) is"
                                         " built and saved here with Docker, and this controller has no")
    assert "\n" not in str(refused.value) and not out.exists()
    without = load_cluster(write_inventory(tmp_path / "off", CPU_CLUSTER_3, group_vars={
        "all": CPU_SITE_VARS + "trainer_docker_image_build: false\n"}))
    assert bundle.plan(without).images == []


def test_a_gpu_inventory_must_pin_its_torch_build_in_one_line(gpu_cluster):
    """What else a GPU inventory must say, and its bundle: tests/harness/test_bundle_gpu.py."""
    with pytest.raises(DtlabError, match="dtlab_torch_build is auto") as auto:
        bundle.plan(gpu_cluster)
    assert "\n" not in str(auto.value)


def test_published_sha512_reads_both_of_apaches_layouts():
    digest = "ab" * 64
    assert bundle.published_sha512(f"{digest}  spark-4.0.0-bin-hadoop3.tgz\n") == digest
    grouped = " ".join(digest.upper()[i:i + 8] for i in range(0, 128, 8))
    old_layout = f"spark-3.5.1-bin-hadoop3.tgz: {grouped[:90]}\n                             {grouped[90:]}\n"
    assert bundle.published_sha512(old_layout) == digest


# --- what this controller refuses, before anything is written ---------------------------------------------


def test_ubuntu_packages_from_a_debian_controller_are_refused_before_anything_is_written(tmp_path,
                                                                                       debian_controller):
    cluster = load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": CPU_SITE_VARS}))
    out = tmp_path / "bundle"
    with pytest.raises(DtlabError) as refused:
        bundle.build(cluster, out, parts=["apt"], say=lambda line: None)
    assert str(refused.value).startswith("bundle: apt: the nodes run ubuntu-noble (dtlab_node_os) and this"
                                         " controller debian-bookworm")
    assert "\n" not in str(refused.value) and not out.exists()


def test_bad_parts_and_a_missing_bundle_are_one_line_with_exit_codes(tmp_path):
    made = invoke("bundle.build", "--out", str(tmp_path / "b"), "--parts", "wheels,debs")
    assert made.returncode == 2 and not (tmp_path / "b").exists()
    assert made.stderr.strip() == ("error: bundle: unknown part debs;"
                                   " parts are wheels, apt, releases, hf, images")
    missing = invoke("bundle.verify", str(tmp_path / "none"))
    assert missing.returncode == 1
    assert missing.stdout.strip() == f"bundle {tmp_path / 'none'}: no such directory"


# --- verifying: a bundle made by hand, complete, then broken one way at a time -----------------------------


def _complete_bundle(cluster, out: Path) -> bundle.Plan:
    """Every file the plan asks for, with stand-in contents (verify reads names, versions and checksums)."""
    the_plan = bundle.plan(cluster)
    entries = []
    for requirement in the_plan.requirements:
        name = re.split(r"[=\[]", requirement, maxsplit=1)[0]
        filename = f"{name.replace('-', '_')}-{pinned(name)}-py3-none-any.whl"
        entries.append(bundle.Entry(f"wheels/{filename}", "wheels", name, str(pinned(name)), "PyPI"))
    for package in the_plan.apt_packages:
        entries.append(bundle.Entry(f"apt/{package}_1.0_amd64.deb", "apt", package, "1.0", the_plan.node_os))
    for release in the_plan.releases:
        entries.append(bundle.Entry(f"{release['platform']}/{release['url'].rsplit('/', 1)[-1]}", "releases",
                                    release["name"], release["version"], release["url"]))
    for image in the_plan.images:
        entries.append(bundle.Entry(image["archive"], "images", image["name"], "sha256:0", image["base"]))
    for entry in entries:
        (out / entry.path).parent.mkdir(parents=True, exist_ok=True)
        (out / entry.path).write_text(f"stand-in for {entry.name}\n")
    bundle.write_manifest(out, cluster.name, the_plan, entries)
    return the_plan


@pytest.fixture
def made_bundle(tmp_path):
    cluster = load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": CPU_SITE_VARS}))
    out = tmp_path / "bundle"
    _complete_bundle(cluster, out)
    return cluster, out


def test_a_complete_bundle_passes_and_says_what_it_holds(made_bundle):
    cluster, out = made_bundle
    assert bundle.verify(cluster, out) == []
    checked = invoke("bundle.verify", str(out), "--inventory", str(cluster.inventory_path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert re.fullmatch(rf"bundle {out}: complete for three: \d+ files \(apt, images, releases, wheels\),"
                        " checksums and pins right", checked.stdout.strip())


def test_each_kind_of_damage_is_its_own_line(made_bundle):
    cluster, out = made_bundle
    torch = next(out.glob("wheels/torch-*.whl"))
    torch.write_text("changed after the build\n")
    (out / "wheels/stray-1.0-py3-none-any.whl").write_text("not listed\n")
    next(out.glob("apt/slurmd_*.deb")).unlink()
    problems = bundle.verify(cluster, out)
    assert problems == [
        f"bundle {out}: apt/slurmd_1.0_amd64.deb is listed but missing",
        f"bundle {out}: {torch.relative_to(out)} does not match its sha256 in manifest.json",
        f"bundle {out}: wheels/stray-1.0-py3-none-any.whl is not in manifest.json",
    ]
    checked = invoke("bundle.verify", str(out), "--inventory", str(cluster.inventory_path))
    assert checked.returncode == 1
    assert checked.stdout.splitlines() == problems
    assert checked.stderr.strip() == f"error: bundle {out}: 3 problem(s); it cannot provision three"


def test_versions_off_the_pins_and_another_node_os_are_refused(made_bundle):
    cluster, out = made_bundle
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["node_os"] = "debian-bookworm"
    for item in manifest["files"]:
        if item["name"] == "pandas":
            item["version"] = "0.1"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert bundle.verify(cluster, out) == [
        f"bundle {out}: built for node_os debian-bookworm, inventory: ubuntu-noble",
        f"bundle {out}: wheels: pandas 0.1, constraints.txt pins {pinned('pandas')}",
    ]


def test_a_missing_part_is_named(made_bundle):
    cluster, out = made_bundle
    manifest = json.loads((out / "manifest.json").read_text())
    gone = ("postgresql", "datasets", "dtlab-trainer:latest")
    manifest["files"] = [item for item in manifest["files"] if item["name"] not in gone]
    (out / "manifest.json").write_text(json.dumps(manifest))
    for leftover in [*out.glob("apt/postgresql_*.deb"), *out.glob("wheels/datasets-*.whl"),
                     *out.glob("images/*")]:
        leftover.unlink()
    assert bundle.verify(cluster, out) == [
        f"bundle {out}: wheels: no datasets (the trainer venv needs it)",
        f"bundle {out}: apt: no postgresql (the roles install them)",
        f"bundle {out}: images: no dtlab-trainer:latest (the trainer role loads it;"
        " trainer_docker_image_build)",
    ]


@pytest.mark.core
@pytest.mark.slow  # ansible-playbook: about 5 s
def test_site_yml_refuses_a_damaged_or_relative_bundle_in_its_first_play(made_bundle):
    cluster, out = made_bundle
    next(out.glob("wheels/torch-*.whl")).write_text("changed\n")

    def first_play(bundle_path: str) -> str:
        run = subprocess.run([str(Path(invoke.__globals__["INVOKE"]).parent / "ansible-playbook"), "site.yml",
                              "-i", str(cluster.inventory_path), "--tags", "validate",
                              "-e", f"dtlab_bundle={bundle_path}"],
                             cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode != 0
        return run.stdout

    assert re.search(rf'"msg": "bundle {out}: wheels/torch-\S+ does not match its sha256 in manifest.json"',
                     first_play(str(out)))
    assert "dtlab_bundle bundle: give the bundle's absolute path" in first_play("bundle")


# --- the releases: fetched over real HTTP (a server on loopback standing in for Apache's and GitHub's) ------


@pytest.fixture
def release_server(tmp_path):
    """An HTTP server on 127.0.0.1 serving tmp_path/www, laid out as Apache's archive and GitHub's."""
    import functools
    import http.server
    import threading

    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


# Determined's packages left out, so that Spark's tarball is the release these tests break.
SPARK_RELEASE_ONLY = "determined_install_binaries: false\n"


def _release_cluster(tmp_path, url, extra: str = ""):
    site = CPU_SITE_VARS + (f"spark_download_base_url: {url}/dist/spark\n"
                            f"determined_common_release_base_url: {url}/releases\n") + extra
    return load_cluster(write_inventory(tmp_path / "site", CPU_CLUSTER_3, group_vars={"all": site}))


def test_the_platforms_releases_are_fetched_checked_and_listed(tmp_path, release_server):
    import hashlib

    root, url = release_server
    spark, determined = pinned("pyspark"), pinned("determined")
    tarball = root / f"dist/spark/spark-{spark}/spark-{spark}-bin-hadoop3.tgz"
    tarball.parent.mkdir(parents=True)
    tarball.write_bytes(b"a stand-in release tarball")
    digest = hashlib.sha512(tarball.read_bytes()).hexdigest()
    (tarball.parent / (tarball.name + ".sha512")).write_text(f"{digest}  {tarball.name}\n")
    for component in ("master", "agent"):
        deb = root / f"releases/v{determined}/determined-{component}_{determined}_linux_amd64.deb"
        deb.parent.mkdir(parents=True, exist_ok=True)
        deb.write_bytes(f"a stand-in {component} package".encode())
    cluster = _release_cluster(tmp_path, url)
    out = tmp_path / "bundle"
    entries = bundle.build(cluster, out, parts=["releases"], say=lambda line: None)
    assert sorted(e.path for e in entries) == sorted([
        f"spark/{tarball.name}", f"spark/{tarball.name}.sha512",
        f"determined/determined-master_{determined}_linux_amd64.deb",
        f"determined/determined-agent_{determined}_linux_amd64.deb"])
    assert (out / "spark" / tarball.name).read_bytes() == tarball.read_bytes()
    problems = bundle.verify(cluster, out)
    # Only wheels, apt and images are missing: those parts were not asked for.
    assert not [p for p in problems if ": releases: " in p], problems
    assert problems and all(re.search(": (wheels|apt|images): ", p) for p in problems), problems


def test_a_tarball_that_is_not_its_published_sha512_is_refused(tmp_path, release_server):
    root, url = release_server
    spark = pinned("pyspark")
    tarball = root / f"dist/spark/spark-{spark}/spark-{spark}-bin-hadoop3.tgz"
    tarball.parent.mkdir(parents=True)
    tarball.write_bytes(b"a tampered tarball")
    (tarball.parent / (tarball.name + ".sha512")).write_text(f"{'0' * 128}  {tarball.name}\n")
    cluster = _release_cluster(tmp_path, url, SPARK_RELEASE_ONLY)
    with pytest.raises(DtlabError, match=r"^bundle: releases: spark: http://127\.0\.0\.1:\d+/dist/spark/"
                                         ".* does not match its published sha512$"):
        bundle.build(cluster, tmp_path / "bundle", parts=["releases"], say=lambda line: None)


def test_an_unreachable_release_is_one_line_naming_its_url(tmp_path, release_server):
    _root, url = release_server  # serves nothing: every path is a 404
    cluster = _release_cluster(tmp_path, url, SPARK_RELEASE_ONLY)
    with pytest.raises(DtlabError, match=r"^bundle: releases: spark: cannot fetch http://127\.0\.0\.1:\d+/dist/spark/"
                                         r"\S+\.sha512 \(HTTP Error 404: File not found\); build this part"):
        bundle.build(cluster, tmp_path / "bundle", parts=["releases"], say=lambda line: None)


def test_the_trainer_images_inputs_digest_changes_with_any_input_and_only_then(tmp_path):
    """The label the trainer role knows the bundle's image by (docker_image_bundle.yml): a digest of the build
    context, the same for the same files whatever their timestamps, another for any change of name or
    bytes."""
    from dtlab.bundle.builders import build_inputs_digest

    def context(name: str, files: dict[str, str]) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        for filename, text in files.items():
            (directory / filename).write_text(text)
        return directory

    inputs = {"Dockerfile": "FROM base\n", "requirements.txt": "torch==2.13.0\n", "constraints.txt": "x==1\n"}
    first = build_inputs_digest(context("a", inputs))
    assert first.startswith("sha256:") and len(first) == 71
    assert build_inputs_digest(context("b", inputs)) == first
    assert build_inputs_digest(context("c", {**inputs, "constraints.txt": "x==2\n"})) != first
    assert build_inputs_digest(context("d", {**inputs, "Dockerfile": "FROM base\n\n"})) != first
    moved = {"Dockerfile": "FROM base\ntorch==2.13.0\n", "requirements.txt": "", "constraints.txt": "x==1\n"}
    assert build_inputs_digest(context("e", moved)) != first  # bytes moved from one file to another

