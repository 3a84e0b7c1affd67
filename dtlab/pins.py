"""The exact Python package versions. Each pin has one owner: dtlab's own (its dependencies and what they
pull in) are in dtlab/pins.txt, and each platform's (its `python_client` and what that pulls in beyond
dtlab's) in its package, dtlab/platforms/<name>/pins.txt, so that a platform's pins come and go with its
folder. Their union is constraints.txt, the one file pip (`-c`), the roles and the bundle read: written
from the parts by scripts/setup.sh (`python3 -m dtlab.pins lock`), never by hand, and not in git.
`scripts/setup.sh --relock` splits the venv's freeze back into the parts (`relock`). pyproject.toml and
each platform's `python_client` keep compatible ranges.

Only the standard library and dtlab.paths (`relock` alone imports packaging, from the venv): setup.sh runs
`python3 -m dtlab.pins clients` and `lock` before the venv holds anything.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from dtlab import paths

# What a platform's class declares of the Python it needs (dtlab.platforms.base.Platform says what each is).
DECLARED = ("python_client", "node_imports")


PINS_FILE = "pins.txt"  # one owner's part of the lock: dtlab/pins.txt, dtlab/platforms/<name>/pins.txt
LOCK_HEADER = """\
# The one pin list for the controller and every node (pip install -c constraints.txt ...), not in git:
# scripts/setup.sh writes it from dtlab/pins.txt and each platform's dtlab/platforms/<name>/pins.txt.
# Edit those (or rewrite them with scripts/setup.sh --relock), never this file.
"""


def pinned(package: str, constraints: Path | None = None) -> str | None:
    """The version the lock pins for a package (`name==version`), or None: read from its parts, or from a
    constraints file given."""
    text = constraints.read_text() if constraints else lock_text()
    pattern = re.compile(rf"^\s*{re.escape(package)}\s*==\s*([^\s;#]+)", re.IGNORECASE | re.MULTILINE)
    match = pattern.search(text)
    return match.group(1) if match else None


def canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503): PyYAML, pyyaml and py_yaml are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pin_files(repo: Path | None = None) -> list[Path]:
    """The lock's parts that exist: dtlab's own, then each platform's that has pins, platforms by name."""
    dtlab_dir = (repo or paths.REPO_ROOT) / "dtlab"
    platforms = [dtlab_dir / "platforms" / name / PINS_FILE
                 for name in paths.platform_names(dtlab_dir / "platforms")]
    return [dtlab_dir / PINS_FILE, *(path for path in platforms if path.is_file())]


def _pins(path: Path) -> dict[str, str]:
    """A part's pins, {canonical name: its line}; comments and blank lines skipped."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {canonical(line.split("==", 1)[0]): line for line in lines if line}


def lock_text(repo: Path | None = None) -> str:
    """constraints.txt: every part's pins in one list, sorted by name as pip freeze sorts them. A package
    pinned by two parts is refused in one line: it would have two owners."""
    owners: dict[str, Path] = {}
    lines: dict[str, str] = {}
    for path in pin_files(repo):
        if not path.is_file():
            raise SystemExit(f"dtlab.pins: {path} is missing: dtlab's own pins (scripts/setup.sh --relock)")
        for name, line in _pins(path).items():
            if name in owners:
                raise SystemExit(
                    f"dtlab.pins: {name} is pinned in both {owners[name]} and {path}; keep it in one")
            owners[name], lines[name] = path, line
    return LOCK_HEADER + "".join(f"{lines[name]}\n" for name in sorted(lines))


def relock(freeze: Iterable[str], repo: Path | None = None) -> dict[Path, list[str]]:
    """Split a venv's freeze into the parts, written: each platform's pins are its client's closure beyond
    dtlab's own (`dtlab[test]`, what setup.sh installs); a package two platforms pull in stays where it was
    pinned, else goes to the first by name. Returns {part: its lines}. Run by the venv's Python."""
    repo = repo or paths.REPO_ROOT
    pins = {canonical(line.split("==", 1)[0]): line.strip() for line in freeze if "==" in line}
    base = _closure(["dtlab[test]"])
    claims = {name: _closure(declared["python_client"]) - base
              for name, declared in platform_declarations(repo).items()}
    before = {name: path for path in pin_files(repo) if path.is_file() for name in _pins(path)}
    dtlab_part = repo / "dtlab" / PINS_FILE
    parts: dict[Path, list[str]] = {dtlab_part: []}
    for package in sorted(pins):
        owners = [platform for platform, claimed in claims.items() if package in claimed]
        kept = [platform for platform in owners if before.get(package) == _part(repo, platform)]
        owner = _part(repo, (kept or owners)[0]) if owners else dtlab_part
        parts.setdefault(owner, []).append(pins[package])
    for platform in claims:  # a platform whose client left, or that pulls in nothing of its own
        if _part(repo, platform) not in parts:
            _part(repo, platform).unlink(missing_ok=True)
    for path, lines in parts.items():
        path.write_text(_part_header(repo, path) + "".join(f"{line}\n" for line in lines))
    return parts


def _part(repo: Path, platform: str) -> Path:
    return repo / "dtlab" / "platforms" / platform / PINS_FILE


def _part_header(repo: Path, path: Path) -> str:
    if path == repo / "dtlab" / PINS_FILE:
        whose = "dtlab's own pins: pyproject.toml's dependencies and test extra, and what they pull in"
    else:
        whose = f"{path.parent.name}'s pins: its python_client and what that pulls in beyond dtlab/pins.txt"
    return (f"# {whose}.\n"
            "# Part of constraints.txt (dtlab/pins.py); rewritten by scripts/setup.sh --relock, which\n"
            "# freezes .venv (torch keeps no local label: a CPU wheel and a CUDA wheel both satisfy it).\n")


def _closure(requirements: Iterable[str]) -> set[str]:
    """The installed distributions these requirements pull in, themselves included, by canonical name;
    their markers judged for this Python and the extras asked for."""
    import importlib.metadata

    from packaging.requirements import Requirement

    seen: set[tuple[str, str]] = set()
    todo = [Requirement(requirement) for requirement in requirements]
    while todo:
        requirement = todo.pop()
        name = canonical(requirement.name)
        extras = {""} | set(requirement.extras)
        if all((name, extra) in seen for extra in extras):
            continue
        seen.update((name, extra) for extra in extras)
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in extras):
                todo.append(needed)
    return {name for name, _ in seen}


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


if __name__ == "__main__":  # scripts/setup.sh's three uses
    command = sys.argv[1:]
    if command == ["clients"]:  # one requirement a line
        print("\n".join(platform_clients()))
    elif command == ["lock"]:  # the parts' union into constraints.txt (rewritten only when it changed)
        text = lock_text()
        if not paths.CONSTRAINTS_FILE.is_file() or paths.CONSTRAINTS_FILE.read_text() != text:
            paths.CONSTRAINTS_FILE.write_text(text)
    elif command == ["relock"]:  # pip freeze on stdin, into the parts
        for part, lines in relock(sys.stdin.read().splitlines()).items():
            print(f"dtlab.pins: {part.relative_to(paths.REPO_ROOT)}: {len(lines)} pins")
    else:
        sys.exit("usage: python3 -m dtlab.pins clients|lock|relock")
