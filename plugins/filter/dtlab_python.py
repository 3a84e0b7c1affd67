"""Filters that read a checkout's Python lists through dtlab.pins, so that the trainer role and the offline
bundle read the one list each: in the trainer role's defaults,

    trainer_python_packages: "{{ dtlab_repo_dir | dtlab_node_packages }}"   # pyproject's dependencies,
                                                                            # then each platform's client
    trainer_bytecode_imports: "{{ trainer_core_imports + (dtlab_repo_dir | dtlab_node_imports) }}"
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _pins():
    if str(REPO_ROOT) not in sys.path:  # this checkout's dtlab, also where the venv has another
        sys.path.insert(0, str(REPO_ROOT))
    from dtlab import pins

    return pins


def _checkout(repo_dir) -> Path:
    """dtlab_repo_dir, which must be a dtlab checkout: its lists are read there, not guessed."""
    from ansible.errors import AnsibleFilterError

    repo = Path(str(repo_dir))
    for part in ("pyproject.toml", "dtlab/platforms"):
        if not (repo / part).exists():
            raise AnsibleFilterError(f"dtlab_repo_dir {repo} has no {part}: it must be the dtlab checkout"
                                     " the inventory belongs to (group_vars/all.yml: the inventory's parent)")
    return repo


def dtlab_node_packages(repo_dir):
    return _pins().node_packages(_checkout(repo_dir))


def dtlab_node_imports(repo_dir):
    return _pins().node_imports(_checkout(repo_dir))


class FilterModule:
    def filters(self):
        return {"dtlab_node_packages": dtlab_node_packages, "dtlab_node_imports": dtlab_node_imports}
