"""The registry: one Platform per training platform, one package each (dtlab/platforms/<name>/, which
registers its instance as it is imported: `PLATFORM = register(...)`), in the order of their names.

The registry imports every package beside it (pkgutil: no list of platforms anywhere). The package's folder
is the platform's name (dtlab.paths.platform_names, which the matrix schema and the cell units read without
importing the packages); a package that registers another name, or none, fails at import, not in a run.

    from dtlab import platforms
    platforms.get("spark").build(cluster, cell, attempt, timeout_s)
    for platform in platforms.ALL: ...
    cluster = platforms.load_cluster(inventory)   # the inventory, with every platform's checks
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, InventoryChecks, read_cluster
from dtlab.platforms.base import DTLAB_RETRY, Platform, PreflightError, ResetSteps, registered
from trainer.config import DEFAULT_FRAMEWORK

# The platform the others are compared with, as the study compares them: its per-epoch time is 1.0x.
# The trainer's own default (a config that names no framework trains under torchrun's hooks) is that one.
BASELINE = DEFAULT_FRAMEWORK


def _discover() -> tuple[Platform, ...]:
    packages = [module.name for module in pkgutil.iter_modules(__path__) if module.ispkg]
    for package in packages:
        importlib.import_module(f"{__name__}.{package}")
    found = registered()
    unregistered = [package for package in packages if package not in found]
    if unregistered:
        raise ImportError(f"dtlab.platforms.{unregistered[0]} registers no platform; end it with "
                          f"PLATFORM = register(<its Platform>())")
    if BASELINE not in found:
        raise ImportError(f"dtlab/platforms/ has no {BASELINE} package (the report's baseline)")
    return tuple(found[name] for name in paths.platform_names())  # register() holds name == folder


ALL: tuple[Platform, ...] = _discover()
BY_NAME: dict[str, Platform] = {platform.name: platform for platform in ALL}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# What each platform checks of the inventory as it is read (dtlab.inventory runs them, in this order).
INVENTORY_CHECKS = InventoryChecks(
    port_ranges=tuple(ports for platform in ALL for ports in platform.port_ranges),
    host=tuple(platform.check_inventory_host for platform in ALL),
    cluster=tuple(platform.check_inventory for platform in ALL),
)


def get(name: str) -> Platform:
    """The platform called `name`; DtlabError (one line) for a name no package registers."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise DtlabError(f"no platform {name!r}; dtlab knows {', '.join(NAMES)}") from None


def label(name: str) -> str:
    """How reports name a platform; a name no package registers (an old store's) as itself."""
    return BY_NAME[name].label if name in BY_NAME else name


def load_cluster(inventory: str | Path | None = None, *, allow_placeholders: bool = False) -> Cluster:
    """Read and check the inventory (default: ansible.cfg's), every platform's checks included: the first
    problem is one DtlabError line, before anything starts. Every `invoke` command reads the cluster with
    it, and site.yml's first play through plugins/ (dtlab.inventory.read_cluster says what it checks)."""
    return read_cluster(inventory, allow_placeholders=allow_placeholders, checks=INVENTORY_CHECKS)


__all__ = ["ALL", "BASELINE", "BY_NAME", "DTLAB_RETRY", "INVENTORY_CHECKS", "NAMES", "Platform",
           "PreflightError", "ResetSteps", "get", "label", "load_cluster"]
