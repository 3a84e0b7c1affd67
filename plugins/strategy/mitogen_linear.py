"""Strategy mitogen_linear: Ansible's `linear` run over Mitogen's connections (ansible.cfg names it).

Stock Ansible starts a fresh Python on the node for every task; Mitogen keeps one interpreter per node
for the whole run and sends it each module once. Nothing else changes: the same plays, tasks and order as
`linear`. Mitogen ships this class at a path inside its installed package, which ansible.cfg cannot name
portably (it holds the venv's Python version), so this file names it from the project's plugin folder.

Plain Ansible again, for one run:  ANSIBLE_STRATEGY=linear ansible-playbook site.yml
"""

from __future__ import annotations

import ansible_mitogen.loaders
import ansible_mitogen.strategy

_Linear = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, _Linear):
    pass
