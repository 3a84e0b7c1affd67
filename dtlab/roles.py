"""What the roles themselves say, read as ansible-playbook reads them, for code that must know it before a
node exists (the offline bundle, the platforms' releases): a role's variables rendered for one node, and
the apt packages its tasks install.

    role_value(node, "spark", "spark_tarball_url", "ubuntu-noble")   # defaults < inventory < vars, templated
    all_defaults()           # every role's defaults: the lowest layer of each host's variables
    apt_tasks()              # [RoleTask(task file under roles/, its apt `name:`, its `when:`), ...]
    repository_tasks()       # the same for the apt repositories the roles add (deb822_repository)
    role_facts("nvidia")     # the expressions of a role's set_fact tasks, rendered as the role would
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from dtlab import paths

if TYPE_CHECKING:
    from dtlab.inventory import Node

ROLES_DIR = paths.REPO_ROOT / "roles"
APT_MODULES = ("ansible.builtin.apt", "apt")
REPOSITORY_MODULES = ("ansible.builtin.deb822_repository", "deb822_repository")
SET_FACT_MODULES = ("ansible.builtin.set_fact", "set_fact")
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


def all_defaults(roles_dir: Path = ROLES_DIR) -> dict[str, Any]:
    """Every role's defaults/main.yml in one mapping, its strings trusted as templates: the lowest layer of
    each host's variables, where Ansible's precedence puts them, so a setting one role owns lives once, in
    that role, and the harness reads it there too (dtlab.inventory). Two roles defining one name would be
    two facts: refused in one line."""
    return dict(_all_defaults(roles_dir))


@functools.cache
def _all_defaults(roles_dir: Path) -> dict[str, Any]:
    from dtlab.errors import DtlabError

    merged: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for path in sorted(roles_dir.glob("*/defaults/main.yml")):
        role = path.parent.parent.name
        for key, value in (read_role_file(path) or {}).items():
            if key in owner:
                raise DtlabError(f"roles/{role}/defaults/main.yml: {key} is also set in roles/{owner[key]}/"
                                 "defaults/main.yml; keep it in the one role that uses it, or in group_vars")
            merged[key], owner[key] = value, role
    return merged


def role_layers(role: str, node_os: str) -> tuple[dict, dict]:
    """(defaults, vars) of a role as Ansible layers them: vars/main.yml, then the distribution's vars file."""

    def read(path: Path) -> dict:
        return (read_role_file(path) or {}) if path.exists() else {}

    role_vars = read(ROLES_DIR / role / "vars/main.yml")
    role_vars.update(read(ROLES_DIR / role / "vars" / f"{DISTRIBUTION_VARS.get(node_os, '')}.yml"))
    return read(ROLES_DIR / role / "defaults/main.yml"), role_vars


def render(node: Node, defaults: dict, role_vars: dict, expression: Any, facts: dict | None = None) -> Any:
    """`expression` on one node, with Ansible's templar over role defaults < inventory < role vars < `facts`
    (what the role's set_fact tasks and the node's own facts would say, where the caller knows them)."""
    return _templar(node, defaults, role_vars, facts).template(expression)


def holds(node: Node, defaults: dict, role_vars: dict, conditions: list[str], facts: dict | None = None
          ) -> bool | None:
    """Whether a task's `when:` holds on one node; None where it cannot be told before the node exists (a
    registered result, check mode)."""
    templar = _templar(node, defaults, role_vars, facts)
    try:
        return all(templar.evaluate_conditional(condition) for condition in conditions)
    except Exception:  # noqa: BLE001 (Ansible raises many kinds for an undefined name)
        return None


def _templar(node: Node, defaults: dict, role_vars: dict, facts: dict | None):
    from ansible.template import Templar

    variables = {**defaults, **node.hostvars, **role_vars, **(facts or {}), "inventory_hostname": node.name}
    return Templar(loader=_loader(), variables=variables)


def role_value(node: Node, role: str, key: str, node_os: str, extra: dict | None = None) -> str:
    """One of a role's variables on one node, rendered to text, as the role reads it: its vars, else the
    inventory's, else its defaults; `extra` as the role's importer sets them."""
    from ansible.template import trust_as_template

    defaults, role_vars = role_layers(role, node_os)
    role_vars = {**role_vars, **(extra or {})}
    if key not in {**defaults, **node.hostvars, **role_vars}:
        raise KeyError(f"roles/{role}: no variable {key} (defaults, vars or the inventory)")
    return str(render(node, defaults, role_vars, trust_as_template(f"{{{{ {key} }}}}"))).strip()


class RoleTask(NamedTuple):
    """One task of a role, as its file says it."""

    task_file: str  # relative to roles/
    arguments: Any  # the module's argument named by the reader (apt: `name`), or all its arguments
    when: list[Any]  # its conditions, all of which must hold, as written (trusted, as the role's)


def apt_tasks() -> list[RoleTask]:
    """Every role task that installs apt packages by name (`name:`: a template or a list), read from the roles
    themselves, so a package a role adds is in the next bundle."""
    return [task._replace(arguments=task.arguments["name"]) for task in _module_tasks(APT_MODULES)
            if "name" in task.arguments]


def apt_deb_tasks() -> list[RoleTask]:
    """Every role task that installs a .deb from a path or URL (apt's `deb:`), which no repository holds."""
    return [task._replace(arguments=task.arguments["deb"]) for task in _module_tasks(APT_MODULES)
            if "deb" in task.arguments]


def repository_tasks() -> list[RoleTask]:
    """Every role task that adds an apt repository (deb822_repository), with all its arguments."""
    return _module_tasks(REPOSITORY_MODULES)


def role_facts(role: str) -> dict[str, Any]:
    """The expressions a role's set_fact tasks assign, by name, as templates: the templar renders each only
    when it is read, so a fact that needs the node (a registered command's output) fails only if asked."""
    facts: dict[str, Any] = {}
    for task_file in sorted((ROLES_DIR / role / "tasks").glob("*.yml")):
        for task in _tasks(read_role_file(task_file) or []):
            for module in SET_FACT_MODULES:
                if isinstance(task.get(module), dict):
                    facts.update({k: v for k, v in task[module].items() if k != "cacheable"})
    return facts


def _module_tasks(modules: tuple[str, ...]) -> list[RoleTask]:
    found = []
    for task_file in sorted(ROLES_DIR.glob("*/tasks/*.yml")):
        for task in _tasks(read_role_file(task_file) or []):
            for module in modules:
                arguments = task.get(module)
                if isinstance(arguments, dict):
                    when = task.get("when", [])
                    conditions = when if isinstance(when, list) else [when]
                    found.append(RoleTask(str(task_file.relative_to(ROLES_DIR)), arguments, conditions))
    return found


def _tasks(items: list) -> Iterable[dict]:
    for item in items:
        if isinstance(item, dict):
            yield item
            for key in ("block", "rescue", "always"):
                yield from _tasks(item.get(key) or [])
