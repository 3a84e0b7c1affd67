"""Action dtlab_inventory_check: site.yml's inventory checks are dtlab's own (dtlab.platforms.load_cluster).

site.yml's validation play runs it first, so ansible-playbook and every `invoke` command refuse a bad
inventory with the same one line, before any secret is generated or any node contacted. It runs in the
controller's ansible-playbook process, reads the inventory sources again (so YAML syntax errors, which
Ansible only warns about, are reported with the parser's message) and needs no connection to any host.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.plugins.action import ActionBase

REPO_ROOT = Path(__file__).resolve().parents[2]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("sources", "bundle"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        sources = [str(s) for s in self._task.args.get("sources") or []]
        if str(REPO_ROOT) not in sys.path:  # this checkout's dtlab, also where the venv has another
            sys.path.insert(0, str(REPO_ROOT))
        from dtlab.errors import DtlabError
        from dtlab.platforms import load_cluster

        result["changed"] = False
        if len(sources) != 1:
            result.update(failed=True, msg=f"inventory {', '.join(sources) or '(none)'}: dtlab reads one"
                          " inventory; pass exactly one -i (a folder counts as one)")
            return result
        try:
            cluster = load_cluster(sources[0])
        except DtlabError as error:
            result.update(failed=True, msg=str(error))
            return result
        result["msg"] = (f"inventory {cluster.inventory_path}: {len(cluster.nodes)} hosts, master"
                         f" {cluster.master.name}, workers {', '.join(w.name for w in cluster.workers)}")
        bundle = str(self._task.args.get("bundle") or "")
        if bundle:
            problem = self._bundle_problem(cluster, bundle)
            if problem:
                result.update(failed=True, msg=problem)
                return result
            result["msg"] += f"; offline bundle {bundle} complete"
        return result

    @staticmethod
    def _bundle_problem(cluster, bundle: str) -> str | None:
        """The first reason the offline bundle (-e dtlab_bundle=DIR) cannot provision this inventory."""
        from dtlab.bundle import verify
        from dtlab.errors import DtlabError

        if not Path(bundle).is_absolute():
            return f"dtlab_bundle {bundle}: give the bundle's absolute path (the roles read it elsewhere)"
        try:
            problems = verify(cluster, Path(bundle))
        except DtlabError as error:
            return str(error)
        if not problems:
            return None
        more = f" ({len(problems) - 1} more: invoke bundle.verify {bundle})" if len(problems) > 1 else ""
        return problems[0] + more
