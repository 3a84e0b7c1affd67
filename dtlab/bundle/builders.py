"""The builders of the wheels, releases, images and hf parts (the apt part's: apt_builder.py): each takes
the plan, the bundle's directory and a `Say`, writes its part and returns its manifest entries."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from ansible.template import trust_as_template

from dtlab import paths, platforms, roles
from dtlab.bundle.external import APT_TIMEOUT_S, PIP_TIMEOUT_S, Say, _download, _run
from dtlab.bundle.manifest import Entry, file_digest
from dtlab.bundle.planning import Plan
from dtlab.errors import DtlabError
from dtlab.files import atomic_write_text
from dtlab.inventory import Cluster

# The platforms pip may take wheels for (the trainer role's list, for another Python than the controller's).
NODE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def _controller_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-.+\.whl$")


def wheel_name_version(filename: str) -> tuple[str, str] | None:
    match = _WHEEL.match(filename)
    return (match["name"].lower().replace("_", "-"), match["version"]) if match else None


def _build_wheels(cluster: Cluster, the_plan: Plan, out: Path, say: Say) -> list[Entry]:
    """pip download for the nodes' Python and platform, with the pins; the controller's own is not used."""
    wheels = out / "wheels"
    wheels.mkdir(exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as requirements:
        requirements.write("\n".join(the_plan.requirements) + "\n")
    index = ["--extra-index-url", the_plan.torch_index_url] if the_plan.torch_index_url else []
    pins = ["-r", requirements.name, "-c", str(paths.CONSTRAINTS_FILE)]
    # As the trainer role fills its wheelhouse: the nodes' own Python builds the sdist-only packages (pyspark)
    # into wheels; for another Python only binary wheels can be fetched (pip says which it cannot find).
    if the_plan.node_python == _controller_python():
        argv = ["wheel", "--wheel-dir", str(wheels)]
    else:
        tags = [arg for tag in NODE_PLATFORMS for arg in ("--platform", tag)]
        argv = ["download", "--only-binary=:all:", "--python-version", the_plan.node_python,
                "--implementation", "cp", *tags, "--dest", str(wheels)]
    try:
        _run([sys.executable, "-m", "pip", *argv, "--quiet", "--disable-pip-version-check", *index, *pins],
             f"pip {argv[0]}", PIP_TIMEOUT_S)
    finally:
        os.unlink(requirements.name)
    torch = next(r for r in the_plan.requirements if r.startswith("torch=="))
    for name in the_plan.built_wheels:
        platforms.get(name).build_offline_wheels(cluster, wheels, torch, _run, say)
    entries = []
    for wheel in sorted(wheels.glob("*.whl")):
        name, version = wheel_name_version(wheel.name) or (wheel.name, "")
        built = [builder for builder, names in the_plan.built_wheels.items() if name in names]
        source = (f"built here for {built[0]}" if built
                  else the_plan.torch_index_url if name == "torch" and the_plan.torch_index_url else "PyPI")
        entries.append(Entry(f"wheels/{wheel.name}", "wheels", name, version, source))
    say(f"bundle: wheels: {len(entries)} for Python {the_plan.node_python} ({the_plan.torch_build} torch)")
    return entries


def _build_releases(the_plan: Plan, out: Path, say: Say) -> list[Entry]:
    """Each platform's releases (Platform.offline_releases) into <platform>/, where its roles read them;
    a release with a published sha512 is checked against it before it is kept."""
    if not the_plan.releases:
        say("bundle: releases: none needed (no platform of this inventory downloads one)")
        return []
    entries = []
    for release in the_plan.releases:
        target = out / release["platform"] / release["url"].rsplit("/", 1)[-1]
        relative = str(target.relative_to(out))
        what = f"releases: {release['name']}"
        if release["checksum_url"]:
            checksum = target.with_name(target.name + ".sha512")
            _download(release["checksum_url"], checksum, what)
            expected = published_sha512(checksum.read_text())
            if not (target.exists() and file_digest(target, "sha512") == expected):
                _download(release["url"], target, what)
            if file_digest(target, "sha512") != expected:
                raise DtlabError(f"bundle: {what}: {release['url']} does not match its published sha512")
            entries.append(Entry(f"{relative}.sha512", "releases", f"{release['name']}.sha512",
                                 release["version"], release["checksum_url"]))
        elif not target.exists():
            _download(release["url"], target, what)
        entries.append(Entry(relative, "releases", release["name"], release["version"], release["url"]))
    return entries


def _build_images(cluster: Cluster, the_plan: Plan, out: Path, say: Say) -> list[Entry]:
    """The trainer image, built as the trainer role builds it (its Dockerfile, the plan's requirements, the
    pins), saved to its archive. The image carries a label, the digest of those inputs, also written beside
    the archive (<archive>.inputs): the role knows the image by it, whichever image store a node's Docker
    uses (the image ID of one archive differs between the classic and the containerd store)."""
    entries = []
    node_os = str(cluster.require("dtlab_node_os"))
    for image in the_plan.images:
        archive, inputs_file = out / image["archive"], out / f"{image['archive']}.inputs"
        with tempfile.TemporaryDirectory(prefix="dtlab-bundle-image-") as scratch:
            context = Path(scratch)
            defaults, role_vars = roles.role_layers("trainer", node_os)
            template = trust_as_template((roles.ROLES_DIR / "trainer/templates/Dockerfile.j2").read_text())
            managed = {"ansible_managed": "dtlab bundle (roles/trainer/templates/Dockerfile.j2)"}
            dockerfile = roles.render(cluster.nodes[0], defaults, role_vars, template, managed)
            (context / "Dockerfile").write_text(dockerfile)
            index = [f"--extra-index-url {the_plan.torch_index_url}"] if the_plan.torch_index_url else []
            (context / "requirements.txt").write_text("\n".join(index + the_plan.requirements) + "\n")
            shutil.copy2(paths.CONSTRAINTS_FILE, context / "constraints.txt")
            inputs = build_inputs_digest(context)
            _run(["docker", "build", "--network", "host", "--tag", image["name"],
                  "--label", f"{image['inputs_label']}={inputs}", str(context)],
                 f"images: docker build {image['name']}", PIP_TIMEOUT_S)
        if not (archive.exists() and inputs_file.exists() and inputs_file.read_text().strip() == inputs):
            archive.parent.mkdir(parents=True, exist_ok=True)
            partial = archive.with_name(archive.name + ".partial")
            _run(["docker", "save", "--output", str(partial), image["name"]],
                 f"images: docker save {image['name']}", APT_TIMEOUT_S)
            partial.replace(archive)
            atomic_write_text(inputs_file, inputs + "\n")
        source = f"built here: FROM {image['base']}, the trainer's requirements and constraints.txt"
        entries += [Entry(image["archive"], "images", image["name"], inputs, source),
                    Entry(f"{image['archive']}.inputs", "images", f"{image['name']}.inputs", inputs, source)]
        say(f"bundle: images: {image['name']} (inputs {inputs[:19]}) from {image['base']}")
    return entries


def build_inputs_digest(context: Path) -> str:
    """sha256 over a build context's files (names and bytes, in name order): the same inputs, one digest."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        name, data = path.relative_to(context).as_posix().encode(), path.read_bytes()
        digest.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big") + data)
    return f"sha256:{digest.hexdigest()}"


def published_sha512(text: str) -> str:
    """The hash of an Apache .sha512 file, in either of its layouts: `HASH  NAME` (sha512sum) or the older
    `NAME: 3A6D 91F2 ...` (gpg --print-md, upper case in groups over several lines)."""
    text = text.strip()
    if ":" in text.split("\n", 1)[0]:
        text = text.split(":", 1)[1]
        return "".join(text.split()).lower()
    return text.split()[0].lower() if text else ""


def _build_hf(the_plan: Plan, out: Path, say: Say) -> list[Entry]:
    """The profiles' hub models and datasets as a hub cache (HF_HUB_CACHE); generated ones need nothing."""
    if not the_plan.hf_models and not the_plan.hf_datasets:
        say(f"bundle: hf: none needed (profile {', '.join(the_plan.profiles)} generates its model and data)")
        return []
    from huggingface_hub import snapshot_download

    cache = out / "hf" / "hub"
    entries = []
    wanted = [(m, "model") for m in the_plan.hf_models] + [(d, "dataset") for d in the_plan.hf_datasets]
    for repo_id, repo_type in wanted:
        try:
            snapshot = Path(snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache))
        except Exception as error:  # noqa: BLE001 (the hub client raises many kinds; each becomes one line)
            raise DtlabError(f"bundle: hf: cannot fetch {repo_type} {repo_id} from the hub"
                             f" ({type(error).__name__}); build this part where the hub can be reached"
                             " (docs/offline.md)") from None
        for file in sorted(p for p in snapshot.rglob("*") if p.is_file()):
            real = file.resolve()
            page = f"https://huggingface.co/{'datasets/' if repo_type == 'dataset' else ''}{repo_id}"
            entries.append(Entry(str(real.relative_to(out)), "hf", f"{repo_type}:{repo_id}", snapshot.name,
                                 page))
    return entries
