"""What one cell's run came to, as bench returns it and the display, the demo and the commands read it:
its status, attempts and time, the last attempt's failure or result, and its phases on the clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dtlab.cell import Cell


@dataclass
class AttemptFailure:
    reason: str
    node: str | None = None
    exit_code: int | None = None
    log_tail: list[str] = field(default_factory=list)
    retryable: bool = True


@dataclass
class CellOutcome:
    cell: Cell
    status: str  # ok | failed | skipped
    attempts: int = 0
    seconds: float = 0.0
    failure: AttemptFailure | None = None
    result: dict[str, Any] | None = None
    phases: dict[str, float] = field(default_factory=dict)  # seconds per harness phase, last attempt
    marks: dict[str, float] = field(default_factory=dict)  # wall clock (time.time) of units start/end
    # A skipped cell that is not recorded: why it did not run ("node2 drained (ssh: ...)").
    skipped_because: str | None = None
