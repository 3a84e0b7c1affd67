"""Finding the inventory and reading it: Ansible's configuration, YAML syntax, Ansible's InventoryManager."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from dtlab import paths
from dtlab.errors import DtlabError

YAML_SUFFIXES = (".yml", ".yaml", ".json")


def default_inventory_path() -> Path:
    """The inventory ansible-playbook would use: ANSIBLE_INVENTORY, else the config file's `inventory =`.

    Ansible's own configuration reads it (its DEFAULT_HOST_LIST setting), so its precedence and path
    rules hold: a relative path in the file is relative to the file, one in ANSIBLE_INVENTORY to the
    working directory. The file is Ansible's choice too (see ansible_config_file).
    """
    from ansible.config.manager import ConfigManager

    config_file = ansible_config_file()
    config = ConfigManager(str(config_file) if config_file else None)
    hosts, origin = config.get_config_value_and_origin("DEFAULT_HOST_LIST")
    if origin == "default":  # no ANSIBLE_INVENTORY, no `inventory =`: Ansible would read /etc/ansible/hosts
        raise DtlabError(
            f"{config_file or paths.ANSIBLE_CFG}: no `inventory =` line in [defaults]; add one or pass -i"
        )
    return Path(hosts[0])


def ansible_config_file() -> Path | None:
    """The ansible.cfg Ansible reads here (ANSIBLE_CONFIG, else ./ansible.cfg), found by Ansible itself.

    Where Ansible would fall back to ~/.ansible.cfg or /etc/ansible/ansible.cfg, the repository's
    ansible.cfg is used instead: the harness belongs to this repository, and invoke finds tasks.py from
    any folder below it, as ansible-playbook site.yml runs from its root.
    """
    from ansible.config.manager import find_ini_config_file

    found = find_ini_config_file()
    fallbacks = {Path("~/.ansible.cfg").expanduser(), Path("/etc/ansible/ansible.cfg")}
    if found and ("ANSIBLE_CONFIG" in os.environ or Path(found) not in fallbacks):
        return Path(found)
    return paths.ANSIBLE_CFG if paths.ANSIBLE_CFG.is_file() else (Path(found) if found else None)


def inventory_path(inventory: str | Path | None = None) -> Path:
    """The inventory's absolute path (default: ansible.cfg's); a mistyped one fails here."""
    path = Path(inventory).expanduser() if inventory else default_inventory_path()
    if not path.is_absolute():
        path = (Path.cwd() / path).resolve()
    if not path.exists():
        hint = (
            "run `invoke lab.up` to create it"
            if path.name.startswith("lab")
            else "check the path given to -i/--inventory or ansible.cfg's `inventory =` line"
        )
        raise DtlabError(f"inventory {path}: no such file; {hint}")
    return path


def check_source_readable(inventory: str | Path | None = None) -> Path:
    """The inventory's path once it exists and its YAML (and its group_vars' and host_vars') parses.

    The checks Ansible's inventory plugins only warn about; also run by the dtlab_inventory plugin, so
    ansible-playbook refuses the same source with the same line."""
    path = inventory_path(inventory)
    _check_yaml_syntax(path)
    return path


def _check_yaml_syntax(path: Path) -> None:
    """YAML syntax errors in the inventory and its group_vars/host_vars, in the YAML parser's own words."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the parser Ansible uses
    for file in _yaml_files(path):
        text = file.read_text(errors="replace")
        if file.suffix == ".json" and _is_json(text):  # Ansible reads JSON first, then YAML
            continue
        try:
            for _ in yaml.compose_all(text, Loader=loader):  # syntax only: custom tags (!vault) compose
                pass
        except yaml.YAMLError as error:
            raise DtlabError(f"inventory {file}: {_yaml_error_line(error)}; fix the YAML there") from None


def _yaml_files(path: Path) -> list[Path]:
    """The YAML files Ansible reads for an inventory: the file (or a folder's), group_vars, host_vars."""
    if path.is_file():
        files, inventory_dir = ([path] if path.suffix in YAML_SUFFIXES else []), path.parent
    else:
        files, inventory_dir = (
            sorted(f for f in path.iterdir() if f.is_file() and f.suffix in YAML_SUFFIXES),
            path,
        )
    for vars_dir in (inventory_dir / "group_vars", inventory_dir / "host_vars"):
        if vars_dir.is_dir():  # like Ansible's host_group_vars: .yml/.yaml/.json or no suffix, no dot files
            files += sorted(
                f
                for f in vars_dir.rglob("*")
                if f.is_file()
                and (f.suffix in YAML_SUFFIXES or not f.suffix)
                and not any(part.startswith(".") for part in f.relative_to(vars_dir).parts)
            )
    return files


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _yaml_error_line(error: Any) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    line = f"YAML syntax error{where}: {problem}"
    context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context and context_mark and (not mark or context_mark.line != mark.line):
        line += f" ({context} that starts at line {context_mark.line + 1})"
    return line


_reading = False


def reading_inventory() -> bool:
    """Whether load_cluster is parsing an inventory with Ansible's InventoryManager right now."""
    return _reading


def _read(path: Path) -> tuple[Any, Any, Any]:
    """Ansible's loader, inventory and variables for one source; parse failures become one line."""
    import ansible.constants as constants
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig
    from ansible.vars.manager import VariableManager

    # Lookups in group_vars need the plugin loader; inside ansible-playbook (validate.yml) it is set up.
    if not AnsibleCollectionConfig.collection_finder:
        init_plugin_loader()
    loader = DataLoader()
    global _reading
    with _parse_failures() as failures:
        _reading = True  # the dtlab_inventory plugin, called by this parse, leaves the checks to us
        try:
            manager = InventoryManager(loader=loader, sources=[str(path)], parse=True)
        except Exception as exc:  # ansible raises many types; the user needs one line
            raise DtlabError(f"inventory {path}: cannot be parsed: {_first_line(exc)}") from None
        finally:
            _reading = False
    if not manager.get_hosts():
        if failures:  # the reason of the plugin meant for this file: yaml for .yml, else ini
            preferred = "yaml" if path.suffix in YAML_SUFFIXES else "ini"
            reason = failures.get(preferred) or next(iter(failures.values()))
            raise DtlabError(
                f"inventory {path}: not an Ansible inventory: {reason.rstrip('.')};"
                " see inventory/cluster.example.yml for the layout"
            )
        raise DtlabError(f"inventory {path}: no hosts; see inventory/cluster.example.yml for the layout")
    # The harness never reads facts: a memory cache, so reading writes nothing under .dtlab/facts.
    configured_cache, constants.CACHE_PLUGIN = constants.CACHE_PLUGIN, "ansible.builtin.memory"
    try:
        variables = VariableManager(loader=loader, inventory=manager)
    finally:
        constants.CACHE_PLUGIN = configured_cache
    return loader, manager, variables


@contextlib.contextmanager
def _parse_failures():
    """Collect (not print) Ansible's per-plugin parse failures; one of them becomes the message."""
    from ansible.utils.display import Display

    display = Display()
    failures: dict[str, str] = {}  # plugin name -> its first line

    def error_as_warning(msg, exception, **kwargs):
        plugin = re.search(r"with '([^']+)' plugin", msg or "")
        failures[plugin.group(1) if plugin else str(len(failures))] = _first_line(exception)

    def warning(msg, *args, **kwargs):
        if not msg.startswith(("Unable to parse", "No inventory was parsed")):
            type(display).warning(display, msg, *args, **kwargs)

    display.error_as_warning, display.warning = error_as_warning, warning
    try:
        yield failures
    finally:
        del display.error_as_warning, display.warning


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
