"""The exact Python package versions: constraints.txt is their one home; everything else reads them here
(pyproject.toml and each platform's `python_client` keep compatible ranges; group_vars/all.yml reads the
same file with Ansible's lookup).

Only the standard library and dtlab.paths: scripts/setup.sh runs `python3 -m dtlab.pins clients` before
the venv holds anything, to install the platforms' clients in the same pip run as dtlab.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from dtlab import paths

# What a platform's class declares of the Python it needs (dtlab.platforms.base.Platform says what each is).
DECLARED = ("python_client", "node_imports")


def pinned(package: str, constraints: Path | None = None) -> str | None:
    """The version constraints.txt pins for a package (`name==version`), or None."""
    constraints = constraints or paths.CONSTRAINTS_FILE
    pattern = re.compile(rf"^\s*{re.escape(package)}\s*==\s*([^\s;#]+)", re.IGNORECASE | re.MULTILINE)
    match = pattern.search(constraints.read_text()) if constraints.exists() else None
    return match.group(1) if match else None


def platform_declarations(repo: Path | None = None) -> dict[str, dict[str, tuple[str, ...]]]:
    """Each platform package's `python_client` and `node_imports`, read from its __init__.py without importing
    it (its imports need the very packages it declares): {name: {"python_client": (...), ...}}, by name.
    A platform's class states them as literal tuples; the contract test holds the registry's to these."""
    platforms = (repo or paths.REPO_ROOT) / "dtlab" / "platforms"
    declared: dict[str, dict[str, tuple[str, ...]]] = {}
    for name in paths.platform_names(platforms):
        init = platforms / name / "__init__.py"
        found = {field: () for field in DECLARED}
        for node in ast.walk(ast.parse(init.read_text(), str(init))):
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    target, value = _assignment(statement)
                    if target in DECLARED:
                        found[target] = tuple(ast.literal_eval(value))
        declared[name] = found
    return declared


def _assignment(statement: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value:
        return statement.target.id, statement.value
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0],
                                                                                         ast.Name):
        return statement.targets[0].id, statement.value
    return None, None


def platform_clients(repo: Path | None = None) -> list[str]:
    """Every platform's Python client as pip requirements (ranges), platforms by name, each in its order."""
    return [requirement for declared in platform_declarations(repo).values()
            for requirement in declared["python_client"]]


def dependencies(repo: Path | None = None) -> list[str]:
    """pyproject.toml's dependencies (ranges): the trainer's, on the controller and every node."""
    import tomllib

    pyproject = (repo or paths.REPO_ROOT) / "pyproject.toml"
    return tomllib.loads(pyproject.read_text())["project"]["dependencies"]


def node_packages(repo: Path | None = None) -> list[str]:
    """What the trainer role installs into every node's venv, by name (constraints.txt pins each version):
    pyproject.toml's dependencies, then each platform's `python_client`. The controller's own optional
    groups (controller, test, bench, dev) stay off the nodes."""
    requirements = [*dependencies(repo), *platform_clients(repo)]
    # A requirement's name with its extras, without the version range: "ray[default,train]>=2.60" -> ray[...].
    name = re.compile(r"\s*([A-Za-z0-9_.\-]+(\[[^\]]*\])?)")
    return [name.match(requirement).group(1).lower() for requirement in requirements]


def node_imports(repo: Path | None = None) -> list[str]:
    """Every platform's `node_imports`: the modules its launcher imports on a node, platforms by name."""
    return [module for declared in platform_declarations(repo).values()
            for module in declared["node_imports"]]


if __name__ == "__main__":  # python3 -m dtlab.pins clients: one requirement a line, for setup.sh
    if sys.argv[1:] != ["clients"]:
        sys.exit("usage: python3 -m dtlab.pins clients")
    print("\n".join(platform_clients()))
