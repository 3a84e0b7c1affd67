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
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from ansible.template import trust_as_template

from dtlab import gpucompat, paths, platforms, roles
from dtlab.errors import DtlabError
from dtlab.files import atomic_write_text
from dtlab.inventory import Cluster, Node, load_cluster
from dtlab.pins import pinned

BUNDLE_FORMAT = 1
MANIFEST = "manifest.json"
PARTS = ("wheels", "apt", "releases", "hf", "images")
# The task files whose packages only a GPU node installs (the nvidia role; Docker's NVIDIA toolkit):
# left out of a cpu inventory's bundle, as the roles skip them there.
GPU_TASK_FILES = ("nvidia/tasks/gpu.yml", "docker/tasks/nvidia_toolkit.yml")
# The platforms pip may take wheels for (the trainer role's list, for another Python than the controller's).
NODE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")
OS_RELEASE = Path("/etc/os-release")
APT_SOURCE_PARTS = Path("/etc/apt/sources.list.d")  # this controller's own, which the resolver keeps
DOWNLOAD_SOCKET_TIMEOUT_S = 60  # no byte for this long: the download fails (a whole release may take minutes)
PIP_TIMEOUT_S = 3600
APT_TIMEOUT_S = 1800
CHUNK = 1 << 20

Say = Callable[[str], None]


@dataclass
class Entry:
    """One file of the bundle, as manifest.json lists it."""

    path: str  # relative to the bundle
    part: str
    name: str
    version: str
    source: str
    sha256: str = ""
    bytes: int = 0


# What a GPU node's roles read from the node itself, which a bundle built in advance must be told in the
# inventory: (role, variable, the role's condition for needing it, why).
ADVANCE_VARS = (
    ("nvidia", "nvidia_kernel_flavour", "true",
     "the kernel line (generic, generic-hwe-24.04, virtual) the nvidia role otherwise reads from the node's"
     " dpkg, which the headers' and the prebuilt modules' metapackages follow"),
    ("nvidia", "dtlab_node_kernel", "nvidia_module_is_dkms",
     "the nodes' running kernel (`uname -r`), whose headers DKMS builds the driver against"),
)


@dataclass
class Plan:
    """What a bundle for this inventory holds, worked out before anything is fetched or written."""

    node_os: str
    node_python: str
    torch_build: str  # 'pypi' or a CUDA build name (cu126, ...)
    torch_index_url: str | None
    requirements: list[str]
    built_wheels: dict[str, list[str]]  # platform -> the wheels it builds (Platform.offline_wheels)
    apt_packages: list[str]
    releases: list[dict[str, str | None]]  # each platform's (Platform.offline_releases), with its name
    apt_sources: list[dict[str, Any]] = field(default_factory=list)  # the roles' repositories, rendered
    node_kernel: str = ""  # a GPU inventory's dtlab_node_kernel (its DKMS headers); "" otherwise
    images: list[dict[str, str]] = field(default_factory=list)  # the trainer image: name, archive, base
    hf_models: list[str] = field(default_factory=list)
    hf_datasets: list[str] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)


# --- planning: what the inventory needs ----------------------------------------------------------------


def plan(cluster: Cluster, profiles: Iterable[str] | None = None) -> Plan:
    """The bundle's contents for this inventory and these matrix profiles (default: the matrix's default)."""
    from dtlab import matrix

    where = f"inventory {cluster.inventory_path}"
    node_os = str(cluster.require("dtlab_node_os"))
    node_python = str(cluster.require("dtlab_node_python"))
    if not re.fullmatch(r"3\.\d+", node_python):
        raise DtlabError(f"{where}: dtlab_node_python must be a version like 3.12, got {node_python!r}")
    build_name, index_url = _torch_build(cluster, where)
    chosen = list(profiles) if profiles else [matrix.load(None).profile]
    models: set[str] = set()
    data: set[str] = set()
    for name in chosen:
        loaded = matrix.load(name, max_gpus=cluster.max_gpus, device=cluster.device)
        for cell in loaded.cells:
            models.add(str(cell.trainer_config.get("model", "")))
            data.add(str(cell.trainer_config.get("dataset", "")))
    return Plan(
        node_os=node_os,
        node_python=node_python,
        torch_build=build_name,
        torch_index_url=index_url,
        requirements=_trainer_requirements(build_name),
        built_wheels={p.name: p.offline_wheels(cluster) for p in platforms.ALL if p.offline_wheels(cluster)},
        apt_packages=apt_packages(cluster),
        apt_sources=apt_sources(cluster),
        node_kernel=str(cluster.var("dtlab_node_kernel", "") or "") if cluster.device != "cpu" else "",
        images=_trainer_images(cluster),
        releases=[{"platform": platform.name, **asdict(release)}
                  for platform in platforms.ALL for release in platform.offline_releases(cluster)],
        hf_models=sorted(m for m in models if m and not m.startswith("generated")),
        hf_datasets=sorted(d for d in data if d and not d.startswith("generated")),
        profiles=chosen,
    )


def _torch_build(cluster: Cluster, where: str) -> tuple[str, str | None]:
    """The torch build every node gets (the trainer role's choice), which a bundle must fix in advance."""
    wanted = str(cluster.var("dtlab_torch_build", "auto"))
    if wanted == gpucompat.PYPI or (wanted == "auto" and cluster.device == "cpu"):
        return gpucompat.PYPI, None
    if wanted == "auto":
        raise DtlabError(
            f"{where}: dtlab_torch_build is auto, which the trainer role decides from the GPUs it finds; a"
            " bundle is built before that: set it to the build your GPUs need (e.g. cu126 for Pascal;"
            " docs/gpu-nodes.md)"
        )
    build = gpucompat.load().build(wanted)
    return build.name, build.index_url


def _trainer_requirements(build_name: str) -> list[str]:
    """The trainer role's package list (its defaults), torch labelled with the build, as the role does."""
    defaults = yaml.safe_load((roles.ROLES_DIR / "trainer/defaults/main.yml").read_text())
    torch = f"torch=={pinned('torch')}" + ("" if build_name == gpucompat.PYPI else f"+{build_name}")
    return [torch if package == "torch" else str(package) for package in defaults["trainer_python_packages"]]


def _trainer_images(cluster: Cluster) -> list[dict[str, str]]:
    """The trainer role's image, where some node builds it (trainer_docker_image_build): its name:tag, the
    archive the role loads it from (trainer_docker_image_archive) and its base image."""
    node_os = str(cluster.require("dtlab_node_os"))
    for node in cluster.nodes:
        if str(roles.role_value(node, "trainer", "trainer_docker_image_build", node_os)).lower() == "true":
            def value(key: str, node=node) -> str:
                return roles.role_value(node, "trainer", key, node_os)

            return [{"name": f"{value('trainer_docker_image_name')}:{value('trainer_docker_image_tag')}",
                     "archive": value("trainer_docker_image_archive"),
                     "base": value("trainer_docker_base_image")}]
    return []


def node_facts(cluster: Cluster) -> dict[str, Any]:
    """The node's own facts the roles read, as far as the inventory says them before the node exists."""
    node_os = str(cluster.require("dtlab_node_os"))
    distribution, _, major = roles.DISTRIBUTION_VARS.get(node_os, "-").partition("-")
    facts = {"distribution": distribution, "distribution_major_version": major,
             "distribution_release": node_os.partition("-")[2], "architecture": "x86_64"}
    if cluster.var("dtlab_node_kernel", ""):
        facts["kernel"] = str(cluster.var("dtlab_node_kernel"))
    return {"ansible_facts": facts}


def _role_tasks_on_nodes(cluster: Cluster, tasks: Iterable[roles.RoleTask]) -> Iterable[tuple[Any, ...]]:
    """(task, node, layers) for each task on each node where its `when:` may hold, with the role's layers:
    defaults, vars, and its set_fact expressions over the node's facts (node_facts). A cpu inventory leaves
    out the GPU task files (GPU_TASK_FILES), as the roles skip them there."""
    layers: dict[str, tuple[dict, dict, dict]] = {}
    for task in tasks:
        if cluster.device == "cpu" and task.task_file in GPU_TASK_FILES:
            continue
        role = task.task_file.split("/", 1)[0]
        if role not in layers:
            layers[role] = _role_layers(cluster, role)
        for node in cluster.nodes:
            if roles.holds(node, *layers[role][:2], task.when, layers[role][2]) is not False:
                yield task, node, layers[role]


def apt_packages(cluster: Cluster) -> list[str]:
    """Every apt package the roles' apt tasks name, rendered for each node with the role's variables.

    The union over roles and nodes: a package some node does not install costs only disk. A task whose
    `when:` is false on a node (another install source, a DKMS-free module) is left out there."""
    _require_advance_vars(cluster)
    packages: set[str] = set()
    for task, node, layers in _role_tasks_on_nodes(cluster, roles.apt_tasks()):
        names = _render(node, layers, task.arguments, f"roles/{task.task_file}", "the packages")
        names = [names] if isinstance(names, str) else list(names)
        packages.update(str(name) for name in names if str(name))
    # A .deb from a path is fetched by an earlier task (a platform's release); one from a URL is refused.
    for task, node, layers in _role_tasks_on_nodes(cluster, roles.apt_deb_tasks()):
        if not re.match(r"[a-z+]+://|\{\{", str(task.arguments)):
            continue
        url = str(_render(node, layers, task.arguments, f"roles/{task.task_file}", "the package"))
        if "://" in url and not url.startswith("file://"):
            raise DtlabError(f"bundle: roles/{task.task_file}: {node.name} installs {url.rsplit('/', 1)[-1]}"
                             f" from {url}, which no repository holds, so a bundle cannot; choose the role's"
                             f" install from a repository (roles/{task.task_file.split('/')[0]}/README.md)")
    return sorted(packages)


def apt_sources(cluster: Cluster) -> list[dict[str, Any]]:
    """The apt repositories the roles add (deb822_repository), rendered for the nodes, by name: the bundle's
    resolver adds them to this controller's own sources, as the roles add them to the node's."""
    found: dict[str, dict[str, Any]] = {}
    for task, node, layers in _role_tasks_on_nodes(cluster, roles.repository_tasks()):
        arguments = _render(node, layers, task.arguments, f"roles/{task.task_file}", "the repository")
        found.setdefault(str(arguments["name"]), {
            "name": str(arguments["name"]),
            "types": [str(t) for t in arguments.get("types", ["deb"])],
            "uris": [str(u) for u in arguments["uris"]],
            "suites": [str(s) for s in arguments["suites"]],
            "components": [str(c) for c in arguments.get("components", [])],
            "signed_by": str(arguments.get("signed_by", "")),
        })
    return [found[name] for name in sorted(found)]


def _role_layers(cluster: Cluster, role: str) -> tuple[dict, dict, dict]:
    """A role's defaults, its vars, and its set_fact expressions over the node's facts (node_facts)."""
    defaults, role_vars = roles.role_layers(role, str(cluster.require("dtlab_node_os")))
    # dtlab_bundle "": what the roles fetch without a bundle, which is what the bundle must hold.
    return defaults, role_vars, {**roles.role_facts(role), **node_facts(cluster), "dtlab_bundle": ""}


def _require_advance_vars(cluster: Cluster) -> None:
    """A GPU inventory names what its roles would otherwise ask the node (ADVANCE_VARS), or is refused."""
    if cluster.device == "cpu":
        return
    node = cluster.nodes[0]
    for role, name, condition, why in ADVANCE_VARS:
        defaults, role_vars, facts = _role_layers(cluster, role)
        if not roles.holds(node, defaults, role_vars, [trust_as_template(condition)], facts):
            continue
        value = trust_as_template(f"{{{{ {name} | default('') }}}}")
        if not roles.render(node, defaults, role_vars, value, facts):
            raise DtlabError(f"bundle: inventory {cluster.inventory_path}: {name} is empty; a GPU node's"
                             f" bundle is built before the node can be asked, so set it: {why}"
                             f" (roles/{role}/README.md, docs/offline.md)")


def _render(node: Node, layers: tuple[dict, dict, dict], expression: Any, where: str, what: str) -> Any:
    """A task's argument on one node (dtlab.roles.render: defaults < inventory < role vars < set_facts)."""
    try:
        return roles.render(node, *layers[:2], expression, layers[2])
    except Exception as error:  # noqa: BLE001 (Ansible raises many kinds; each becomes one line)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DtlabError(f"bundle: {where}: {what} {str(expression)!r} do not render for {node.name}"
                         f" before the node exists ({first}); a bundle cannot hold them yet") from None


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


def _controller_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


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
    for part in wanted:
        say(f"bundle: {part} ...")
        for entry in builders[part](the_plan, out, say):
            entries[entry.path] = entry
    write_manifest(out, cluster.name, the_plan, list(entries.values()))
    total = sum(e.bytes for e in entries.values())
    say(f"bundle: {out}: {len(entries)} files, {total / 2**30:.2f} GiB; check it: invoke bundle.verify {out}")
    return list(entries.values())


def write_manifest(out: Path, cluster_name: str, the_plan: Plan, entries: list[Entry]) -> None:
    """manifest.json for the files of `entries` (their sha256 and size taken now where not yet known)."""
    for entry in entries:
        if not entry.sha256:
            entry.sha256, entry.bytes = file_digest(out / entry.path), (out / entry.path).stat().st_size
    manifest = {
        "format": BUNDLE_FORMAT,
        "built": datetime.now(UTC).isoformat(timespec="seconds"),
        "cluster": cluster_name,
        "node_os": the_plan.node_os,
        "node_python": the_plan.node_python,
        "torch_build": the_plan.torch_build,
        "node_kernel": the_plan.node_kernel,
        "plan": asdict(the_plan),
        "files": [asdict(e) for e in sorted(entries, key=lambda e: e.path)],
    }
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm)
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _run(argv: list[str], what: str, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise DtlabError(f"bundle: {what}: no answer in {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise DtlabError(f"bundle: {what} failed: {tail[-1] if tail else f'exit {done.returncode}'}")
    return done


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


def _build_apt(the_plan: Plan, out: Path, say: Say) -> list[Entry]:
    """Every package and its dependencies, resolved as if the node had nothing installed (an empty dpkg
    status), with this machine's own apt sources and keys and the repositories the roles add
    (Plan.apt_sources, with their keys), into a flat repository."""
    repo = out / "apt"
    repo.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dtlab-bundle-apt-") as scratch:
        state = Path(scratch)
        (state / "lists/partial").mkdir(parents=True)
        (state / "archives/partial").mkdir(parents=True)
        (state / "status").write_text("")
        options = ["-o", f"Dir::State::Lists={state / 'lists'}",
                   "-o", f"Dir::State::status={state / 'status'}",
                   "-o", f"Dir::Cache::archives={state / 'archives'}", "-o", f"Dir::Cache={state}",
                   "-o", f"Dir::Etc::SourceParts={_source_parts(the_plan, state)}",
                   "-o", "APT::Install-Recommends=false", "-o", "Debug::NoLocking=true"]
        _run(["apt-get", *options, "-q", "update"], "apt-get update (the bundle's own lists)", APT_TIMEOUT_S)
        # Each package's URL, for the manifest: asked while the scratch cache is empty, so apt names them all.
        printed = _run(["apt-get", *options, "-qq", "--print-uris", "install", *the_plan.apt_packages],
                       "apt-get install --print-uris", APT_TIMEOUT_S).stdout
        # The bundle's packages go into the scratch cache first: a rebuild downloads only what changed.
        for deb in repo.glob("*.deb"):
            os.link(deb, state / "archives" / deb.name) if deb.stat().st_dev == state.stat().st_dev \
                else shutil.copy2(deb, state / "archives" / deb.name)
        _run(["apt-get", *options, "-q", "-y", "--download-only", "install", *the_plan.apt_packages],
             "apt-get install --download-only", APT_TIMEOUT_S)
        wanted = {deb.name for deb in (state / "archives").glob("*.deb")}
        for stale in repo.glob("*.deb"):
            if stale.name not in wanted:
                stale.unlink()
        for deb in (state / "archives").glob("*.deb"):
            if not (repo / deb.name).exists():
                shutil.move(str(deb), repo / deb.name)
    index = _run(["dpkg-scanpackages", "--multiversion", "."], "dpkg-scanpackages", 600, cwd=repo).stdout
    atomic_write_text(repo / "Packages", index)
    with gzip.open(repo / "Packages.gz", "wt") as compressed:
        compressed.write(index)
    atomic_write_text(repo / "Release", _release(repo, the_plan.node_os))
    entries = []
    for deb in sorted(repo.glob("*.deb")):
        name, version, _arch = (deb.stem.split("_") + ["", ""])[:3]
        entries.append(Entry(f"apt/{deb.name}", "apt", name, version.replace("%3a", ":"),
                             _package_uris(printed).get(deb.name, the_plan.node_os)))
    entries += [Entry(f"apt/{index_file}", "apt", index_file, "", "dpkg-scanpackages")
                for index_file in ("Packages", "Packages.gz", "Release")]
    named = ", ".join(the_plan.apt_packages)
    added = "".join(f" + {source['name']}'s repository" for source in the_plan.apt_sources)
    say(f"bundle: apt: {len(entries) - 3} packages: {named} and their dependencies"
        f" ({the_plan.node_os}{added})")
    return entries


def _source_parts(the_plan: Plan, state: Path) -> Path:
    """A sources.list.d for the resolver: this machine's own parts, and each repository the roles add, as a
    deb822 file signed by its key (fetched into the scratch directory when the role names it by URL)."""
    parts = state / "sources.list.d"
    parts.mkdir()
    for own in sorted(APT_SOURCE_PARTS.glob("*")):
        if own.suffix in (".list", ".sources"):
            shutil.copy2(own, parts / own.name)
    for source in the_plan.apt_sources:
        key = source["signed_by"]
        if re.match(r"[a-z]+://", key):
            fetched = state / "keys" / source["name"]
            _download(key, fetched, f"apt: the signing key of repository {source['name']}")
            # apt reads an armored key only by its .asc name, a binary one by .gpg
            armored = fetched.read_bytes().lstrip().startswith(b"-----")
            key_file = fetched.with_suffix(".asc" if armored else ".gpg")
            fetched.rename(key_file)
            key = str(key_file)
        fields = {"Types": source["types"], "URIs": source["uris"], "Suites": source["suites"],
                  "Components": source["components"], "Signed-By": [key] if key else []}
        (parts / f"dtlab-{source['name']}.sources").write_text(
            "".join(f"{name}: {' '.join(values)}\n" for name, values in fields.items() if values))
    return parts


def _package_uris(printed: str) -> dict[str, str]:
    """apt-get --print-uris's lines (`'URL' FILE SIZE HASH`) as {file name: URL}."""
    found = {}
    for line in printed.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].startswith("'") and fields[1].endswith(".deb"):
            found[fields[1]] = fields[0].strip("'")
    return found


def _release(repo: Path, node_os: str) -> str:
    """A flat repository's Release file: apt checks the indexes against it (the debs against the indexes)."""
    lines = ["Origin: dtlab bundle", f"Label: dtlab bundle for {node_os}", "Suite: dtlab-bundle",
             f"Date: {datetime.now(UTC).strftime('%a, %d %b %Y %H:%M:%S UTC')}", "SHA256:"]
    for index_file in ("Packages", "Packages.gz"):
        data = (repo / index_file).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {index_file}")
    return "\n".join(lines) + "\n"


def _download(url: str, target: Path, what: str) -> None:
    """One file, fetched whole into place; a failure is one line naming the URL."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    try:
        with (urllib.request.urlopen(url, timeout=DOWNLOAD_SOCKET_TIMEOUT_S) as response,  # noqa: S310
              partial.open("wb") as handle):
            shutil.copyfileobj(response, handle, CHUNK)
    except (OSError, ValueError) as error:
        partial.unlink(missing_ok=True)
        raise DtlabError(f"bundle: {what}: cannot fetch {url} ({error}); build this part where it can be"
                         " reached (docs/offline.md)") from None
    partial.replace(target)


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
    pins), saved to its archive with its ID beside it (<archive>.id), which the role loads it by."""
    entries = []
    node_os = str(cluster.require("dtlab_node_os"))
    for image in the_plan.images:
        archive, id_file = out / image["archive"], out / f"{image['archive']}.id"
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
            _run(["docker", "build", "--network", "host", "--tag", image["name"], str(context)],
                 f"images: docker build {image['name']}", PIP_TIMEOUT_S)
        image_id = _run(["docker", "image", "inspect", "--format", "{{.Id}}", image["name"]],
                        f"images: docker image inspect {image['name']}", 60).stdout.strip()
        if not (archive.exists() and id_file.exists() and id_file.read_text().strip() == image_id):
            archive.parent.mkdir(parents=True, exist_ok=True)
            partial = archive.with_name(archive.name + ".partial")
            _run(["docker", "save", "--output", str(partial), image["name"]],
                 f"images: docker save {image['name']}", APT_TIMEOUT_S)
            partial.replace(archive)
            atomic_write_text(id_file, image_id + "\n")
        source = f"built here: FROM {image['base']}, the trainer's requirements and constraints.txt"
        entries += [Entry(image["archive"], "images", image["name"], image_id, source),
                    Entry(f"{image['archive']}.id", "images", f"{image['name']}.id", image_id, source)]
        say(f"bundle: images: {image['name']} ({image_id[:19]}) from {image['base']}")
    return entries


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


# --- reading and verifying -----------------------------------------------------------------------------


def read_manifest(bundle: Path) -> list[Entry]:
    path = bundle / MANIFEST
    try:
        data = json.loads(path.read_text())
        return [Entry(**item) for item in data["files"]]
    except FileNotFoundError:
        raise DtlabError(
            f"bundle {bundle}: no {MANIFEST}; build one: invoke bundle.build --out {bundle}") from None
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise DtlabError(f"bundle {bundle}: {MANIFEST} is not a dtlab manifest ({error})") from None


def verify(cluster: Cluster, bundle: Path, profiles: Iterable[str] | None = None) -> list[str]:
    """Problems (one line each) that keep this bundle from provisioning this inventory; empty when none."""
    bundle = Path(bundle)
    if not bundle.is_dir():
        return [f"bundle {bundle}: no such directory"]
    try:
        manifest = json.loads((bundle / MANIFEST).read_text())
        entries = read_manifest(bundle)
    except FileNotFoundError:
        return [f"bundle {bundle}: no {MANIFEST}; build one with invoke bundle.build --out {bundle}"]
    except (json.JSONDecodeError, DtlabError) as error:
        return [str(error) if isinstance(error, DtlabError) else f"bundle {bundle}: {MANIFEST}: {error}"]
    problems = []
    if manifest.get("format") != BUNDLE_FORMAT:
        problems.append(f"bundle {bundle}: format {manifest.get('format')}, this dtlab reads {BUNDLE_FORMAT}")
    the_plan = plan(cluster, profiles or manifest.get("plan", {}).get("profiles"))
    for key, wanted in (("node_os", the_plan.node_os), ("node_python", the_plan.node_python),
                        ("torch_build", the_plan.torch_build), ("node_kernel", the_plan.node_kernel)):
        built_for = manifest.get(key, "" if key == "node_kernel" else None)  # a CPU bundle names no kernel
        if built_for != wanted:
            problems.append(f"bundle {bundle}: built for {key} {built_for or '(none)'}, inventory: {wanted}")
    listed = {e.path for e in entries}
    for entry in entries:
        path = bundle / entry.path
        if not path.is_file():
            problems.append(f"bundle {bundle}: {entry.path} is listed but missing")
        elif path.stat().st_size != entry.bytes or file_digest(path) != entry.sha256:
            problems.append(f"bundle {bundle}: {entry.path} does not match its sha256 in {MANIFEST}")
    for path in sorted(bundle.rglob("*")):
        relative = str(path.relative_to(bundle))
        if path.is_file() and relative != MANIFEST and relative not in listed:
            problems.append(f"bundle {bundle}: {relative} is not in {MANIFEST}")
    problems += _check_versions(bundle, the_plan, entries)
    return problems


def _check_versions(bundle: Path, the_plan: Plan, entries: list[Entry]) -> list[str]:
    problems = []
    wheels = {e.name: e.version for e in entries if e.part == "wheels"}
    for requirement in the_plan.requirements:
        name = re.split(r"[=\[<>]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        if name not in wheels:
            problems.append(f"bundle {bundle}: wheels: no {name} (the trainer venv needs it)")
    for name, version in sorted(wheels.items()):
        pin = pinned(name) or pinned(name.replace("-", "_"))
        if pin and version.split("+")[0] != pin.split("+")[0]:
            problems.append(f"bundle {bundle}: wheels: {name} {version}, constraints.txt pins {pin}")
    for platform, names in the_plan.built_wheels.items():
        for name in names:
            if name not in wheels:
                problems.append(f"bundle {bundle}: wheels: no {name} ({platform}'s roles install it)")
    debs = {e.name for e in entries if e.part == "apt" and e.path.endswith(".deb")}
    missing = [p for p in the_plan.apt_packages if p not in debs]
    if missing:
        problems.append(f"bundle {bundle}: apt: no {', '.join(missing)} (the roles install them)")
    for release in the_plan.releases:
        if not any(e.part == "releases" and e.name == release["name"] and e.version == release["version"]
                   for e in entries):
            problems.append(f"bundle {bundle}: releases: no {release['name']} {release['version']}"
                            f" ({release['platform']}'s roles install it)")
    for image in the_plan.images:
        if not any(e.part == "images" and e.name == image["name"] for e in entries):
            problems.append(f"bundle {bundle}: images: no {image['name']} (the trainer role loads it;"
                            " trainer_docker_image_build)")
    for repo_id in the_plan.hf_models + the_plan.hf_datasets:
        if not any(e.part == "hf" and e.name.endswith(f":{repo_id}") for e in entries):
            profiles = ", ".join(the_plan.profiles)
            problems.append(f"bundle {bundle}: hf: no snapshot of {repo_id} (profile {profiles})")
    return problems


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
