"""What one lab instance created on the host, so that down/recovery touch exactly that and no more."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from dtlab.errors import DtlabError

LOCK_WAIT_S = 600


class LabState:
    """A JSON file in the instance's run dir, rewritten atomically after every change.

    Keys: created.{links,netns} (names), nodes.<node>.{root_mode,image}, binds, image.
    Creations are recorded *before* the command that creates them, so a crash in between
    leaves a name to clean up rather than an orphan.
    """

    def __init__(self, run_dir: Path):
        self.path = run_dir / "state.json"
        self.data: dict = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.data.setdefault("created", {"links": [], "netns": []})
        self.data.setdefault("nodes", {})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n")
        os.replace(temporary, self.path)

    def created(self, kind: str) -> list[str]:
        return self.data["created"].setdefault(kind, [])

    def record_created(self, kind: str, name: str) -> None:
        if name not in self.created(kind):
            self.created(kind).append(name)
            self.save()

    def forget_created(self, kind: str, name: str) -> None:
        if name in self.created(kind):
            self.created(kind).remove(name)
            self.save()

    def node(self, node: str) -> dict:
        return self.data["nodes"].setdefault(node, {})


@contextmanager
def held_lock(path: Path, wait_s: float, busy_message: str):
    """An exclusive lock across processes, waited for at most wait_s; then busy_message as the error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(path, timeout=wait_s):
            yield
    except Timeout:
        raise DtlabError(f"{busy_message} (lock {path}, waited {wait_s:.0f} s)") from None


def instance_lock(run_dir: Path):
    """One lab operation at a time per instance (up, down, restart), across processes."""
    return held_lock(run_dir / ".lock", LOCK_WAIT_S, "lab: another lab command is running on this lab;"
                     " wait for it to finish")
