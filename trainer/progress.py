"""The trainer's progress lines in rank 0's log: written by the core, read back by the harness.

The report counts the epochs a failed attempt began, to show what a resumed run did twice. Both
sides use this module, so the line format lives in one place. Standard library only.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

LOG_PREFIX = "[trainer] "
# Rank 0 rewrites this file in output_dir once each epoch's checkpoint is complete: its number. The
# harness's fault plans wait on it, whatever the platform, so "after epoch k" means the same for all.
CHECKPOINTED_FILE = "checkpointed_epoch"
# Each rank writes its PID here (output_dir/ranks/<rank>.pid on its own node): a fault plan kills those.
RANKS_DIR = "ranks"
_RANGE = re.compile(r"epochs (\d+)\.\.(\d+)$")
_EPOCH_DONE = re.compile(r"epoch (\d+)/(\d+): ")


def epoch_range(first: int, last: int) -> str:
    """Ends the start line: the epochs this attempt is to train."""
    return f"epochs {first}..{last}"


def epoch_done(epoch: int, epochs: int) -> str:
    """Starts the line logged when an epoch's training and validation are done."""
    return f"epoch {epoch}/{epochs}: "


def epochs_begun(lines: Iterable[str]) -> int | None:
    """Epochs an attempt began, from its log: those it finished, plus the one it was in when it
    stopped early. None when the trainer never logged its start (it failed before training)."""
    planned, finished = None, 0
    for line in lines:
        _, found, body = line.partition(LOG_PREFIX)  # launchers may prefix lines (rank, time)
        if not found:
            continue
        if start := _RANGE.search(body):
            planned, finished = int(start[2]) - int(start[1]) + 1, 0  # a restart starts the count again
        elif planned is not None and _EPOCH_DONE.match(body):
            finished += 1
    if planned is None:
        return None
    return planned if finished >= planned else finished + 1


def mark_checkpointed(output_dir: str | Path, epoch: int) -> None:
    """Say (atomically) that epoch `epoch`'s checkpoint is complete; see CHECKPOINTED_FILE."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{CHECKPOINTED_FILE}-", dir=output_dir)
    with os.fdopen(handle, "w") as stream:
        stream.write(f"{epoch}\n")
    os.replace(temporary, Path(output_dir, CHECKPOINTED_FILE))


def mark_rank(output_dir: str | Path, rank: int) -> None:
    """Leave this process's PID where a fault plan finds it; see RANKS_DIR."""
    ranks = Path(output_dir, RANKS_DIR)
    ranks.mkdir(parents=True, exist_ok=True)
    Path(ranks, f"{rank}.pid").write_text(f"{os.getpid()}\n")
