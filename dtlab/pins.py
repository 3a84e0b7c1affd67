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
