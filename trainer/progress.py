"""The trainer's progress lines in rank 0's log: written by the core, read back by the harness.

The report counts the epochs a failed attempt began, to show what a resumed run did twice. Both
sides use this module, so the line format lives in one place. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

LOG_PREFIX = "[trainer] "
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
