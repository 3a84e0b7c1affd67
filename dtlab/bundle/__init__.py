"""The offline bundle: all that site.yml and the trainer would fetch from outside, for an air-gapped cluster.

    invoke bundle.build --out DIR      DIR/{manifest.json, wheels/, apt/, <platform>/, hf/}
    invoke bundle.verify DIR           complete, checksums right, versions equal to the pins
    ansible-playbook site.yml -e dtlab_bundle=DIR      install from it; nothing fetched from outside

A bundle is made for one inventory: its nodes' OS and Python (dtlab_node_os, dtlab_node_python in
group_vars), its torch build, and what its roles install there. Each part says where it came from:

    wheels/      the trainer venv's wheels for the nodes' Python and platform (pip), and those a platform's
                 roles build rather than fetch (Platform.build_offline_wheels: Horovod's), built here
    apt/         every apt package the roles install, with its dependencies down to libc (apt-get, as if
                 nothing were installed), as a flat repository (Packages, Release); the repositories the
                 roles add (Docker's, NVIDIA's container toolkit) are added to the resolver
    <platform>/  the releases a platform's roles download (Platform.offline_releases): Spark's tarball and its
                 published sha512 where it installs from the tarball, Determined's master and agent packages
    hf/          a Hugging Face hub cache holding the profile's models and datasets (none for generated ones)
    images/      the trainer's Docker image (the DDP docker runtime, Determined's trials), built here from the
                 trainer role's Dockerfile and saved with its ID, where the inventory builds it

manifest.json lists every file with its part, name, version, source and sha256. A part this controller
cannot build (Ubuntu's packages from a Debian controller, a download it cannot reach) is refused in one
line before anything is written; docs/offline.md says how to build it where it can be built.

This module holds what this controller can build (refusals), build() and the invoke commands; the plan is
planning.py's, the builders are builders.py's and apt_builder.py's, manifest.json is manifest.py's and the
verification verification.py's. All of their public names are also dtlab.bundle's.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from dtlab.bundle.apt_builder import APT_SOURCE_PARTS, _build_apt
from dtlab.bundle.builders import (
    NODE_PLATFORMS,
    _build_hf,
    _build_images,
    _build_releases,
    _build_wheels,
    _controller_python,
    published_sha512,
    wheel_name_version,
)
from dtlab.bundle.external import APT_TIMEOUT_S, CHUNK, DOWNLOAD_SOCKET_TIMEOUT_S, PIP_TIMEOUT_S, Say
from dtlab.bundle.manifest import BUNDLE_FORMAT, MANIFEST, Entry, file_digest, read_manifest, write_manifest
from dtlab.bundle.planning import (
    ADVANCE_VARS,
    GPU_TASK_FILES,
    Plan,
    apt_packages,
    apt_sources,
    node_facts,
    plan,
)
from dtlab.bundle.verification import verify
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster
from dtlab.platforms import load_cluster

# The names dtlab.bundle had as one module, all still read from here (tasks.py, the inventory check, tests).
__all__ = [
    "ADVANCE_VARS", "APT_SOURCE_PARTS", "APT_TIMEOUT_S", "BUNDLE_FORMAT", "CHUNK",
    "DOWNLOAD_SOCKET_TIMEOUT_S", "GPU_TASK_FILES", "MANIFEST", "NODE_PLATFORMS", "OS_RELEASE", "PARTS",
    "PIP_TIMEOUT_S", "BundleProblems", "Entry", "Plan", "Say", "apt_packages", "apt_sources", "build",
    "build_command", "controller_os", "file_digest", "node_facts", "plan", "published_sha512",
    "read_manifest", "refusals", "verify", "verify_command", "wheel_name_version", "write_manifest",
]

PARTS = ("wheels", "apt", "releases", "hf", "images")
BESIDE_WHEELS = ("apt",)  # built in a thread while the wheels part runs
# Here, beside controller_os which reads it, so that a test's patch of dtlab.bundle.OS_RELEASE holds.
OS_RELEASE = Path("/etc/os-release")


# --- what this controller can build --------------------------------------------------------------------


def controller_os() -> str:
    """This machine's OS as dtlab_node_os spells it: <ID>-<VERSION_CODENAME> from /etc/os-release."""
    fields = {}
    if OS_RELEASE.exists():
        for line in OS_RELEASE.read_text().splitlines():
            key, _, value = line.partition("=")
            fields[key.strip()] = value.strip().strip('"')
    return f"{fields.get('ID', 'unknown')}-{fields.get('VERSION_CODENAME', 'unknown')}"


def refusals(the_plan: Plan, parts: Iterable[str]) -> list[str]:
    """Why a wanted part cannot be built on this controller (each one line); empty when all can."""
    found = []
    if "apt" in parts and the_plan.apt_packages and controller_os() != the_plan.node_os:
        found.append(
            f"bundle: apt: the nodes run {the_plan.node_os} (dtlab_node_os) and this controller"
            f" {controller_os()}: their packages can only be resolved on a {the_plan.node_os} machine; run"
            " `invoke bundle.build --parts apt --out DIR` there, copy DIR here and run `invoke bundle.build"
            " --out DIR` (docs/offline.md)"
        )
    if "apt" in parts and the_plan.apt_packages and shutil.which("dpkg-scanpackages") is None:
        found.append("bundle: apt: dpkg-scanpackages is missing (it writes the repository's index);"
                     " apt-get install dpkg-dev")
    if "apt" in parts and the_plan.apt_packages and os.geteuid() != 0:
        found.append("bundle: apt: apt-get resolves the packages as root (its own lists and cache, the"
                     " system's untouched); run as root")
    if "images" in parts and the_plan.images and not _docker_answers():
        found.append("bundle: images: the trainer image (trainer_docker_image_build) is built and saved here"
                     " with Docker, and this controller has no Docker daemon (docker info); build this part"
                     " where Docker and the base image's registry can be reached (`invoke bundle.build"
                     " --parts images --out DIR`), or set trainer_docker_image_build: false"
                     " (docs/offline.md)")
    controller_python = _controller_python()
    for name in the_plan.built_wheels if "wheels" in parts else ():
        if controller_python != the_plan.node_python:
            found.append(f"bundle: wheels: {name}'s wheels are built here against the nodes' Python"
                         f" {the_plan.node_python}, but this controller runs {controller_python}; build the"
                         f" bundle with a Python {the_plan.node_python} venv (scripts/setup.sh there)")
    return found


def _docker_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# --- building ------------------------------------------------------------------------------------------


def build(cluster: Cluster, out: Path, parts: Iterable[str] = PARTS, profiles: Iterable[str] | None = None,
          say: Say = print) -> list[Entry]:
    """Write (or complete) the bundle at `out`; returns the manifest's entries. Refuses before writing."""
    wanted = [p for p in PARTS if p in set(parts)]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise DtlabError(f"bundle: unknown part {', '.join(unknown)}; parts are {', '.join(PARTS)}")
    the_plan = plan(cluster, profiles)
    problems = refusals(the_plan, wanted)
    if problems:
        raise DtlabError(problems[0])
    out.mkdir(parents=True, exist_ok=True)
    previous = {e.path: e for e in read_manifest(out)} if (out / MANIFEST).exists() else {}
    entries: dict[str, Entry] = {path: e for path, e in previous.items() if e.part not in wanted}
    builders = {"wheels": functools.partial(_build_wheels, cluster), "apt": _build_apt,
                "releases": _build_releases, "hf": _build_hf,
                "images": functools.partial(_build_images, cluster)}
    # The apt part waits on the network, the wheels part mostly on the compiler (Horovod's build): side by
    # side, the bundle takes the longer of the two, not their sum.
    beside_wheels = [part for part in BESIDE_WHEELS if part in wanted] if "wheels" in wanted else []
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as background:
        started = {part: background.submit(_build_part, builders[part], part, the_plan, out, say)
                   for part in beside_wheels}
        for part in wanted:
            built = started[part].result() if part in started else _build_part(builders[part], part, the_plan,
                                                                                  out, say)
            entries.update((entry.path, entry) for entry in built)
    write_manifest(out, cluster.name, the_plan, list(entries.values()))
    total = sum(e.bytes for e in entries.values())
    say(f"bundle: {out}: {len(entries)} files, {total / 2**30:.2f} GiB; check it: invoke bundle.verify {out}")
    return list(entries.values())


def _build_part(builder, part: str, the_plan: Plan, out: Path, say: Say) -> list[Entry]:
    say(f"bundle: {part} ...")
    return builder(the_plan, out, say)


# --- the invoke commands -------------------------------------------------------------------------------


class BundleProblems(DtlabError):
    """bundle.verify found problems: each was printed on its own line; exit 1, as a failed check."""

    exit_code = 1


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def build_command(out: str, inventory: str | None, parts: str = "", profiles: str = "",
                  say: Say = print) -> Path:
    """invoke bundle.build: the bundle for the inventory's nodes at `out`, then its verification."""
    cluster = load_cluster(inventory)
    target = Path(out).resolve()
    build(cluster, target, parts=_split(parts) or PARTS, profiles=_split(profiles) or None, say=say)
    if not _split(parts):
        verify_command(str(target), inventory, say=say)
    return target


def verify_command(path: str, inventory: str | None, say: Say = print) -> None:
    """invoke bundle.verify: one line per problem and exit 1, or one line saying what the bundle holds."""
    cluster = load_cluster(inventory)
    problems = verify(cluster, Path(path))
    for problem in problems:
        say(problem)
    if problems:
        raise BundleProblems(f"bundle {path}: {len(problems)} problem(s); it cannot provision {cluster.name}")
    entries = read_manifest(Path(path))
    parts = sorted({e.part for e in entries})
    say(f"bundle {path}: complete for {cluster.name}: {len(entries)} files ({', '.join(parts)}),"
        " checksums and pins right")
