"""Filter dtlab_node_packages: the Python packages every node's venv gets, by name, read from a pyproject.toml
by dtlab.pins.node_packages (its dependencies, then each platform's optional group), so that the trainer role
and the offline bundle read the one list pyproject holds. In the trainer role's defaults:

    trainer_python_packages: "{{ (dtlab_repo_dir ~ '/pyproject.toml') | dtlab_node_packages }}"
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def dtlab_node_packages(pyproject):
    if str(REPO_ROOT) not in sys.path:  # this checkout's dtlab, also where the venv has another
        sys.path.insert(0, str(REPO_ROOT))
    from dtlab import pins

    return pins.node_packages(Path(str(pyproject)))


class FilterModule:
    def filters(self):
        return {"dtlab_node_packages": dtlab_node_packages}
