"""The target cluster, read with Ansible's own inventory API so group_vars and host_vars apply.

The inventory is the one chosen by the `inventory =` line of ansible.cfg (the same one
`ansible-playbook site.yml` uses, found and read by Ansible's own configuration, so ANSIBLE_CONFIG
applies); ANSIBLE_INVENTORY or an explicit path (-i/--inventory) overrides it. Everything the
harness knows about nodes, ports and paths comes from here: the model (model.py), finding and
parsing the source (source.py) and the checks behind read_cluster (checks.py), to which the platforms add
theirs (dtlab.platforms.load_cluster, what every command reads the cluster with).
"""

from dtlab.inventory.checks import (
    NODE_COST_VARIABLE,
    PLACEHOLDER_NETWORKS,
    PORT_SUFFIX,
    InventoryChecks,
    read_cluster,
)
from dtlab.inventory.model import LAB_GROUP, MASTER_GROUP, WORKERS_GROUP, Cluster, Node
from dtlab.inventory.source import (
    YAML_SUFFIXES,
    ansible_config_file,
    check_source_readable,
    default_inventory_path,
    inventory_path,
    reading_inventory,
)

__all__ = [
    "LAB_GROUP",
    "MASTER_GROUP",
    "NODE_COST_VARIABLE",
    "PLACEHOLDER_NETWORKS",
    "PORT_SUFFIX",
    "WORKERS_GROUP",
    "YAML_SUFFIXES",
    "Cluster",
    "InventoryChecks",
    "Node",
    "ansible_config_file",
    "check_source_readable",
    "default_inventory_path",
    "inventory_path",
    "read_cluster",
    "reading_inventory",
]
