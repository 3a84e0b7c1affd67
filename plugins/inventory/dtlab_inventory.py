"""Inventory plugin dtlab_inventory: Ansible's YAML inventory; a source dtlab refuses is one line.

ansible.cfg enables only this plugin. Without it, a mistyped `-i` path or a YAML error in the inventory
(or in its group_vars/host_vars) reaches the user as a stack of Ansible warnings, one per inventory plugin
tried, and any other mistake (two hosts on one address, a port out of range) as Ansible's task-failure
block of site.yml's validation play, the line twice in it. Here, when ansible-playbook is about to run
site.yml on one inventory file, every check of dtlab.platforms.load_cluster runs while Ansible reads it;
for any other playbook (the tests' role plays run on parts of a cluster's inventory) the first two. The
line every `invoke` command prints goes to stderr alone, and ansible-playbook exits 2 before any play
starts. A source that passes is parsed by ansible.builtin.yaml, unchanged. site.yml's validation play still
checks what only the command line gives (-e dtlab_bundle, more than one -i, a folder as the inventory).
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
from dtlab.inventory import YAML_SUFFIXES, check_source_readable, reading_inventory  # noqa: E402

DOCUMENTATION = """
    name: dtlab_inventory
    short_description: Ansible's YAML inventory; a source dtlab refuses is one line and exit 2
    description:
        - Parses the source with ansible.builtin.yaml. A source that does not exist, whose YAML (or
          that of its group_vars and host_vars) does not parse, or that fails any other check of
          dtlab.platforms.load_cluster, is refused with dtlab's one line on stderr.
"""


class InventoryModule(BaseInventoryPlugin):
    NAME = "dtlab_inventory"

    def verify_file(self, path):
        # A missing source is ours too: parse() refuses it in one line instead of Ansible's warnings.
        return not Path(path).exists() or Path(path).suffix in YAML_SUFFIXES

    def parse(self, inventory, loader, path, cache=True):
        try:
            if _runs_site_yml() and _the_one_source(path) and not reading_inventory():
                from dtlab.platforms import load_cluster  # its platforms' checks too; only here (0.4 s)

                load_cluster(path)  # which parses it again: then reading_inventory(), and the branch below
            else:
                check_source_readable(path)
        except DtlabError as error:
            # SystemExit passes Ansible's per-plugin error collection: the line stands alone, exit 2.
            sys.stderr.write(f"error: {error}\n")
            sys.stderr.flush()
            raise SystemExit(DtlabError.exit_code) from None
        yaml_plugin = inventory_loader.get("ansible.builtin.yaml")
        yaml_plugin.set_options()
        yaml_plugin.parse(inventory, loader, path, cache)


def _runs_site_yml() -> bool:
    """Whether this is ansible-playbook about to run site.yml's plays (not --syntax-check or a --list-*):
    other playbooks, the tests' role plays among them, may run on a part of a cluster's inventory."""
    from ansible import context

    if any(context.CLIARGS.get(flag) for flag in ("syntax", "listhosts", "listtasks", "listtags")):
        return False
    from dtlab.paths import SITE_PLAYBOOK

    site = SITE_PLAYBOOK.resolve()
    return any(Path(argument).resolve() == site for argument in context.CLIARGS.get("args") or ())


def _the_one_source(path) -> bool:
    """Whether `path` is the command's one inventory source (-i, or ansible.cfg's), not a file of a folder
    given as the source (load_cluster reads the folder: site.yml's validation play checks it whole) or one of
    several (refused there)."""
    from ansible import context

    sources = [source for source in context.CLIARGS.get("inventory") or () if source]
    return len(sources) == 1 and Path(sources[0]).expanduser().resolve() == Path(path).resolve()
