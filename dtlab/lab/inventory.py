"""The generated Ansible inventory of a lab instance (templates/lab-inventory.yml.j2)."""

from __future__ import annotations

import os
from pathlib import Path

import jinja2
import yaml

from dtlab import paths
from dtlab.lab.config import LabConfig

TEMPLATE_NAME = "lab-inventory.yml.j2"


def _controller_path(config: LabConfig, path: os.PathLike) -> str:
    """Portable when the state dir is the checkout's .dtlab/ (Ansible resolves inventory_dir)."""
    default_state_dir = paths.REPO_ROOT / ".dtlab"
    if paths.STATE_DIR.resolve() == default_state_dir.resolve():
        return "{{ inventory_dir }}/../.dtlab/" + str(os.path.relpath(path, default_state_dir))
    return str(path)


def render(config: LabConfig, bundle: str | None = None) -> str:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(paths.TEMPLATES_DIR),
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                     trim_blocks=True, lstrip_blocks=True)
    return environment.get_template(TEMPLATE_NAME).render(
        lab=config,
        nodes=[{"name": node, "address": str(config.node_address(node))} for node in config.node_names],
        private_key_file=_controller_path(config, config.private_key_path),
        known_hosts_file=_controller_path(config, config.known_hosts_path),
        bundle=bundle,
    )


def write(config: LabConfig, bundle: str | None = None) -> bool:
    """Write the inventory if its content changed; True if it did. `bundle`: an offline lab's bundle."""
    text = render(config, bundle)
    path = config.inventory_path
    if path.exists() and path.read_text() == text:
        return False
    temporary = path.with_suffix(".yml.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return True


def variant(inventory: Path, suffix: str, **host_vars) -> Path:
    """A copy of a lab inventory beside it, <stem>-<suffix>.yml, with `host_vars` on every host: beside
    it, its paths and group_vars resolve the same; host vars beat group_vars/all.yml, as a site's own
    inventory sets them. For a setting tried on the same nodes (tests, benchmarks); the caller removes it."""
    data = yaml.safe_load(inventory.read_text())
    for group in data.values():
        for host in (group.get("hosts") or {}).values():
            host.update(host_vars)
    copy = inventory.with_name(f"{inventory.stem}-{suffix}.yml")
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy
