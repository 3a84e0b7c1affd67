"""Where dtlab keeps things on the controller. Every other module asks here."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Controller-side state, git-ignored: secrets, lab keys, wheelhouse, fact cache.
STATE_DIR = Path(os.environ.get("DTLAB_STATE_DIR", REPO_ROOT / ".dtlab"))
SECRETS_DIR = STATE_DIR / "secrets"
WHEELHOUSE_DIR = STATE_DIR / "wheelhouse"

# Recorded runs and reports, one folder per cluster (inventory) name.
RESULTS_DIR = Path(os.environ.get("DTLAB_RESULTS_DIR", REPO_ROOT / "results"))

INVENTORY_DIR = REPO_ROOT / "inventory"
LAB_VARS_FILE = INVENTORY_DIR / "group_vars" / "lab.yml"  # the lab's shape and its guarded range
EXPERIMENTS_DIR = REPO_ROOT / "experiments"
TEMPLATES_DIR = REPO_ROOT / "templates"
CONSTRAINTS_FILE = REPO_ROOT / "constraints.txt"
SITE_PLAYBOOK = REPO_ROOT / "site.yml"
ANSIBLE_CFG = REPO_ROOT / "ansible.cfg"
# One package per training platform (dtlab/platforms/<name>/, docs/platforms.md): its folder is where its
# name is declared, so adding a platform edits no list. Read as folders here, below every layer that needs
# the names (the matrix, the cell units), without importing the packages (dtlab.platforms does that).
PLATFORMS_DIR = REPO_ROOT / "dtlab" / "platforms"


def platform_names(platforms_dir: Path = PLATFORMS_DIR) -> tuple[str, ...]:
    """The platforms' names, sorted: every package folder under dtlab/platforms/ (or another checkout's)."""
    return tuple(sorted(folder.name for folder in platforms_dir.iterdir()
                        if (folder / "__init__.py").is_file() and not folder.name.startswith("_")))


# Inside results/<cluster>/: the health gate that preceded each matrix (dtlab.doctor), as JSON.
GATE_DIRNAME = "gate"
# ... each whole site.yml converge's seconds per role (dtlab.provision), and the platforms' daemons
# idle (dtlab.idle, invoke cluster.idle); both read by the report's Table B.10.
PROVISION_DIRNAME = "provision"
IDLE_DIRNAME = "idle"


def results_dir_for(cluster_name: str) -> Path:
    return RESULTS_DIR / cluster_name
