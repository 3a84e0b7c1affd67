"""Verifying a bundle against an inventory: complete, checksums right, built for its nodes, versions
equal to the pins; each problem one line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from dtlab.bundle.manifest import BUNDLE_FORMAT, MANIFEST, Entry, file_digest, read_manifest
from dtlab.bundle.planning import Plan, plan
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster
from dtlab.pins import pinned


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
