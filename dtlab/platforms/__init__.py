"""The registry: one Platform per training platform, one module each (dtlab/platforms/<name>.py, whose
PLATFORM is the instance), in the trainer's order of frameworks.

The list of platforms exists once, as the trainer's framework enum (trainer.config.FRAMEWORKS); the result
schema and the matrix schema read it from there, and this registry imports one module per name in it.
A name without a module, or a module whose PLATFORM has another name, fails at import, not in a run.

    from dtlab import platforms
    platforms.get("spark").build(cluster, cell, attempt, timeout_s)
    for platform in platforms.ALL: ...
"""

from __future__ import annotations

import importlib

from dtlab.errors import DtlabError
from dtlab.platforms.base import DTLAB_RETRY, Platform, PreflightError, ResetSteps
from trainer.config import FRAMEWORKS

# The platform the others are compared with, as the study compares them: its per-epoch time is 1.0x.
BASELINE = "ddp"


def _load(name: str) -> Platform:
    platform = importlib.import_module(f"dtlab.platforms.{name}").PLATFORM
    if platform.name != name:
        raise ImportError(f"dtlab.platforms.{name}.PLATFORM is named {platform.name!r}, not {name!r}")
    return platform


ALL: tuple[Platform, ...] = tuple(_load(name) for name in FRAMEWORKS)
BY_NAME: dict[str, Platform] = {platform.name: platform for platform in ALL}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def get(name: str) -> Platform:
    """The platform called `name`; DtlabError (one line) for a name no module registers."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise DtlabError(f"no platform {name!r}; dtlab knows {', '.join(NAMES)}") from None


def label(name: str) -> str:
    """How reports name a platform; a name no module registers (an old store's) as itself."""
    return BY_NAME[name].label if name in BY_NAME else name


__all__ = ["ALL", "BASELINE", "BY_NAME", "DTLAB_RETRY", "NAMES", "Platform", "PreflightError", "ResetSteps",
           "get", "label"]
