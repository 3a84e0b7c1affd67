"""Writing files so that a reader never sees half of one: stage beside the target, then rename."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Results and reports are for everyone on the controller to read, like the figures beside them
# (mkstemp alone would leave them 0600). Secrets are written elsewhere, by Ansible, 0600.
READABLE = 0o644


@contextlib.contextmanager
def _staged(target: Path, mode: int) -> Iterator[Path]:
    """A temporary file beside `target`; it replaces `target` when the block ends well, else it goes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str, mode: int = READABLE) -> None:
    with _staged(path, mode) as staging, open(staging, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_copy(source: Path, target: Path, mode: int = READABLE) -> None:
    with _staged(target, mode) as staging:
        shutil.copyfile(source, staging)
