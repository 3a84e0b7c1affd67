"""Planning: what a bundle for an inventory holds (`Plan`), worked out from the inventory, the matrix
profiles and the roles' own tasks, rendered per node, before anything is fetched or written."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ansible.template import trust_as_template

from dtlab import gpucompat, platforms, roles
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.pins import node_packages, pinned

# The task files whose packages only a GPU node installs (the nvidia role; Docker's NVIDIA toolkit):
# left out of a cpu inventory's bundle, as the roles skip them there.
GPU_TASK_FILES = ("nvidia/tasks/gpu.yml", "docker/tasks/nvidia_toolkit.yml")

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
    """The trainer role's package list (dtlab.pins', as its defaults read it), torch labelled with the build,
    as the role does."""
    torch = f"torch=={pinned('torch')}" + ("" if build_name == gpucompat.PYPI else f"+{build_name}")
    return [torch if package == "torch" else package for package in node_packages()]


def _trainer_images(cluster: Cluster) -> list[dict[str, str]]:
    """The trainer role's image, where some node builds it (trainer_docker_image_build): its name:tag, the
    archive the role loads it from (trainer_docker_image_archive), its base image, and the label the role
    knows it by (trainer_docker_image_inputs_label)."""
    node_os = str(cluster.require("dtlab_node_os"))
    for node in cluster.nodes:
        if str(roles.role_value(node, "trainer", "trainer_docker_image_build", node_os)).lower() == "true":
            def value(key: str, node=node) -> str:
                return roles.role_value(node, "trainer", key, node_os)

            return [{"name": f"{value('trainer_docker_image_name')}:{value('trainer_docker_image_tag')}",
                     "archive": value("trainer_docker_image_archive"),
                     "base": value("trainer_docker_base_image"),
                     "inputs_label": value("trainer_docker_image_inputs_label")}]
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
