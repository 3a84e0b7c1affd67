"""Writing files so that a reader never sees half of one: stage beside the target, then rename."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

# Results and reports are for everyone on the controller to read, like the figures beside them
# (mkstemp alone would leave them 0600). Secrets are written elsewhere, by Ansible, 0600.
READABLE = 0o644


def atomic_write_text(path: Path, text: str, mode: int = READABLE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_copy(source: Path, target: Path, mode: int = READABLE) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
