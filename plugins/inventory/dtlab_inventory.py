"""Inventory plugin dtlab_inventory: Ansible's YAML inventory; a missing or malformed source is one line.

ansible.cfg enables only this plugin. Without it, a mistyped `-i` path or a YAML error in the inventory
(or in its group_vars/host_vars) reaches the user as a stack of Ansible warnings, one per inventory plugin
tried, before site.yml's validation play says what is wrong. Here the line every `invoke` command prints
(dtlab.inventory) goes to stderr and ansible-playbook exits 2 before any play starts. A source that reads
well is parsed by ansible.builtin.yaml, unchanged; the other inventory checks stay in ansible/validate.yml.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.plugins.inventory import BaseInventoryPlugin
from ansible.plugins.loader import inventory_loader

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # this checkout's dtlab, also where the venv has another
    sys.path.insert(0, str(REPO_ROOT))

from dtlab.errors import DtlabError  # noqa: E402
from dtlab.inventory import YAML_SUFFIXES, check_source_readable  # noqa: E402

DOCUMENTATION = """
    name: dtlab_inventory
    short_description: Ansible's YAML inventory; a missing or malformed source is one line and exit 2
    description:
        - Parses the source with ansible.builtin.yaml. A source that does not exist, or whose YAML (or
          that of its group_vars and host_vars) does not parse, is refused with dtlab.inventory's one
          line on stderr.
"""


class InventoryModule(BaseInventoryPlugin):
    NAME = "dtlab_inventory"

    def verify_file(self, path):
        # A missing source is ours too: parse() refuses it in one line instead of Ansible's warnings.
        return not Path(path).exists() or Path(path).suffix in YAML_SUFFIXES

    def parse(self, inventory, loader, path, cache=True):
        try:
            check_source_readable(path)
        except DtlabError as error:
            # SystemExit passes Ansible's per-plugin error collection: the line stands alone, exit 2.
            sys.stderr.write(f"error: {error}\n")
            sys.stderr.flush()
            raise SystemExit(DtlabError.exit_code) from None
        yaml_plugin = inventory_loader.get("ansible.builtin.yaml")
        yaml_plugin.set_options()
        yaml_plugin.parse(inventory, loader, path, cache)
