"""What the roles themselves say, read as ansible-playbook reads them, for code that must know it before a
node exists (the offline bundle, the platforms' releases): a role's variables rendered for one node, and
the apt packages its tasks install.

    role_value(node, "spark", "spark_tarball_url", "ubuntu-noble")   # defaults < inventory < vars, templated
    apt_tasks()                                    # [(task file under roles/, its apt `name:`), ...]
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtlab import paths

if TYPE_CHECKING:
    from dtlab.inventory import Node

ROLES_DIR = paths.REPO_ROOT / "roles"
APT_MODULES = ("ansible.builtin.apt", "apt")
# dtlab_node_os (<ID>-<VERSION_CODENAME>) -> the roles' vars/<Distribution>-<major>.yml
DISTRIBUTION_VARS = {"debian-bookworm": "Debian-12", "ubuntu-noble": "Ubuntu-24"}


def _loader():
    from ansible.parsing.dataloader import DataLoader

    return DataLoader()


def read_role_file(path: Path) -> Any:
    """A role's YAML with its strings trusted as templates, as ansible-playbook trusts a role's own files
    (ansible-core 2.19 renders no other string)."""
    from ansible.template import trust_as_template

    def trusted(value: Any) -> Any:
        if isinstance(value, str):
            return trust_as_template(value)
        if isinstance(value, dict):
            return {key: trusted(item) for key, item in value.items()}
        if isinstance(value, list):
            return [trusted(item) for item in value]
        return value

    return trusted(_loader().load_from_file(str(path)))


def role_layers(role: str, node_os: str) -> tuple[dict, dict]:
    """(defaults, vars) of a role as Ansible layers them: vars/main.yml, then the distribution's vars file."""

    def read(path: Path) -> dict:
        return (read_role_file(path) or {}) if path.exists() else {}

    role_vars = read(ROLES_DIR / role / "vars/main.yml")
    role_vars.update(read(ROLES_DIR / role / "vars" / f"{DISTRIBUTION_VARS.get(node_os, '')}.yml"))
    return read(ROLES_DIR / role / "defaults/main.yml"), role_vars


def render(node: Node, defaults: dict, role_vars: dict, expression: Any) -> Any:
    """`expression` on one node, with Ansible's templar over role defaults < inventory < role vars."""
    from ansible.template import Templar

    variables = {**defaults, **node.hostvars, **role_vars, "inventory_hostname": node.name}
    return Templar(loader=_loader(), variables=variables).template(expression)


def role_value(node: Node, role: str, key: str, node_os: str, extra: dict | None = None) -> str:
    """One of a role's variables on one node, rendered to text; `extra` as the role's importer sets them."""
    defaults, role_vars = role_layers(role, node_os)
    role_vars = {**role_vars, **(extra or {})}
    value = role_vars[key] if key in role_vars else defaults[key]
    return str(render(node, defaults, role_vars, value)).strip()


def apt_tasks() -> list[tuple[str, Any]]:
    """(task file relative to roles/, its `name:`: a template or a list) of every role task that installs apt
    packages by name, read from the roles themselves, so a package a role adds is in the next bundle."""
    found = []
    for task_file in sorted(ROLES_DIR.glob("*/tasks/*.yml")):
        for task in _tasks(read_role_file(task_file) or []):
            for module in APT_MODULES:
                arguments = task.get(module)
                if isinstance(arguments, dict) and "name" in arguments:
                    found.append((str(task_file.relative_to(ROLES_DIR)), arguments["name"]))
    return found


def _tasks(items: list) -> Iterable[dict]:
    for item in items:
        if isinstance(item, dict):
            yield item
            for key in ("block", "rescue", "always"):
                yield from _tasks(item.get(key) or [])
