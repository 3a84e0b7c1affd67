"""The exact Python package versions: constraints.txt is their one home; everything else reads them here
(pyproject.toml keeps compatible ranges, group_vars/all.yml reads the same file with Ansible's lookup)."""

from __future__ import annotations

import re
from pathlib import Path

from dtlab import paths


def pinned(package: str, constraints: Path | None = None) -> str | None:
    """The version constraints.txt pins for a package (`name==version`), or None."""
    constraints = constraints or paths.CONSTRAINTS_FILE
    pattern = re.compile(rf"^\s*{re.escape(package)}\s*==\s*([^\s;#]+)", re.IGNORECASE | re.MULTILINE)
    match = pattern.search(constraints.read_text()) if constraints.exists() else None
    return match.group(1) if match else None


def node_packages(pyproject: Path | None = None) -> list[str]:
    """What the trainer role installs into every node's venv, by name (constraints.txt pins each version):
    pyproject.toml's dependencies, then each optional dependency group named after a platform package
    (dtlab/platforms/<name>/: its Python client), in pyproject's order. The controller's own groups
    (controller, test, bench, dev) stay off the nodes."""
    import tomllib

    project = tomllib.loads((pyproject or paths.REPO_ROOT / "pyproject.toml").read_text())["project"]
    platforms = set(paths.platform_names())
    requirements = [*project["dependencies"],
                    *(requirement for group, listed in project.get("optional-dependencies", {}).items()
                      if group in platforms for requirement in listed)]
    # A requirement's name with its extras, without the version range: "ray[default,train]>=2.60" -> ray[...].
    name = re.compile(r"\s*([A-Za-z0-9_.\-]+(\[[^\]]*\])?)")
    return [name.match(requirement).group(1).lower() for requirement in requirements]
