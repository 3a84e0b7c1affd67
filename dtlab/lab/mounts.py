"""Mounts under a lab directory: list, unmount, and delete a tree only once nothing is mounted in it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from dtlab.errors import DtlabError


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mount_points() -> list[Path]:
    with open("/proc/self/mountinfo") as mountinfo:
        return [Path(_unescape(line.split()[4])) for line in mountinfo]


def mounts_under(directory: Path) -> list[Path]:
    """Mount points at or below `directory`, deepest first (the order to unmount them)."""
    directory = directory.resolve() if directory.exists() else directory
    found = [point for point in mount_points() if point == directory or directory in point.parents]
    return sorted(set(found), key=lambda point: len(point.parts), reverse=True)


def is_mounted(point: Path) -> bool:
    return point in mount_points()


def unmount_under(directory: Path, attempts: int = 10) -> None:
    """Unmount everything at or below `directory`; lazily as a last resort."""
    for attempt in range(attempts):
        remaining = mounts_under(directory)
        if not remaining:
            return
        for point in remaining:
            lazy = ["-l"] if attempt == attempts - 1 else []
            subprocess.run(["umount", *lazy, str(point)], capture_output=True, timeout=30)
        time.sleep(0.1 * attempt)
    if mounts_under(directory):
        raise DtlabError(f"lab: cannot unmount {mounts_under(directory)[0]}; find its user with "
                         f"`fuser -vm {mounts_under(directory)[0]}` and stop it")


def remove_tree(directory: Path) -> None:
    """rm -rf, refusing while anything is mounted below (a bind mount would be deleted through)."""
    if not directory.exists():
        return
    unmount_under(directory)
    if mounts_under(directory):
        raise DtlabError(f"lab: refusing to delete {directory}: something is still mounted below it")
    shutil.rmtree(directory)
