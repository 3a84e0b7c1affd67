"""What a bench run was asked for: the flags of bench.all and bench.run (BenchOptions)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class BenchOptions:
    profile: str | None = None
    only: str | None = None
    force: bool = False
    retries: int = 1
    timeout_s: int | None = None  # None: the profile's timeout_s
    verbose: bool = False  # stream every log line, not only epochs and errors
    matrix_path: Path | None = None
    report: bool = True
    # No health gate before the matrix, and no re-check of a node a cell failed on (so no drains).
    skip_gate: bool = False
