"""What one lab instance created on the host, so that down/recovery touch exactly that and no more."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

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


class instance_lock:
    """One lab operation at a time per instance (up, down, restart), across processes."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / ".lock"

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "w")
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DtlabError(f"lab: another lab command holds {self.path} for {LOCK_WAIT_S} s;"
                                     " wait for it to finish") from None
                time.sleep(0.5)

    def __exit__(self, *exc):
        self.file.close()
