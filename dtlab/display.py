"""What bench.all shows while it runs: progress over the matrix, an ETA, each epoch line, and a
failed attempt's error lines (rich)."""

from __future__ import annotations

import re
import statistics
import time
from collections import defaultdict

from dtlab.cell import Cell
from dtlab.outcome import CellOutcome

HELD_LINES = 20
EPOCH_LINE = re.compile(r"\bepoch\s+\d+\s*/\s*\d+", re.IGNORECASE)
PROBLEM_LINE = re.compile(r"Traceback|Error|error:|Killed|FAILED", re.IGNORECASE)


class Display:
    """Live progress over the matrix: done / failed / left, ETA from measured cell times, epoch lines."""

    def __init__(self, total: int, verbose: bool, console=None):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console or Console(highlight=False, soft_wrap=True)
        self.verbose = verbose
        self.total = total
        self.done = self.failed = self.skipped = 0
        self.cell_seconds: dict[str, list[float]] = defaultdict(list)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TextColumn("ETA {task.fields[eta]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task("matrix", total=total, counts="", eta="?")
        self.pending: list[Cell] = []
        self.current: Cell | None = None
        self.current_started = 0.0
        # Error lines of the running attempt, shown only if it fails: a cell that succeeds prints
        # none (e.g. torchrun's exit-barrier race, pytorch#69520); the logs keep every line.
        self.held: list = []  # rich Text lines
        self.muted = False

    def __enter__(self) -> Display:
        self.progress.start()
        self._refresh()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def eta_seconds(self) -> float | None:
        """The running cell's expected rest plus each left cell at the measured mean of its framework."""
        measured = [s for times in self.cell_seconds.values() for s in times]
        if not self.pending and self.current is None:
            return 0.0
        if not measured:
            return None
        overall = statistics.mean(measured)

        def expected(cell: Cell) -> float:
            times = self.cell_seconds[cell.framework]
            return statistics.mean(times) if times else overall

        running = 0.0
        if self.current is not None:
            running = max(0.0, expected(self.current) - (time.monotonic() - self.current_started))
        return running + sum(expected(c) for c in self.pending)

    def _refresh(self, current: str = "matrix") -> None:
        left = self.total - self.done - self.failed - self.skipped
        eta = self.eta_seconds()
        self.progress.update(
            self.task,
            description=current,
            completed=self.total - left,
            counts=f"{self.done} done, {self.failed} failed, {self.skipped} skipped, {left} left",
            eta="?" if eta is None else _duration(eta),
        )

    def start_cell(self, cell: Cell, attempt: int) -> None:
        if cell in self.pending:
            self.pending.remove(cell)
        if self.current != cell:
            self.current, self.current_started = cell, time.monotonic()
        retry = f" (retry {attempt - 1})" if attempt > 1 else ""
        self.held.clear()
        self.console.print(f"[bold cyan]▶ {cell.key}{retry}[/]")
        self._refresh(f"{cell.key}{retry}")

    def line(self, node: str, text: str) -> None:
        from rich.text import Text

        if self.muted:
            return
        self._refresh(self.current.key if self.current else "matrix")
        shown = Text.assemble((f"[{node}] ", "dim"), text)
        if self.verbose or EPOCH_LINE.search(text) or "final accuracy" in text:
            self.console.print(shown)
        elif PROBLEM_LINE.search(text):
            self.held.append(shown)
            del self.held[:-HELD_LINES]

    def attempt_failed(self) -> None:
        """Show the failed attempt's error lines (the last HELD_LINES of them)."""
        for line in self.held:
            self.console.print(line)
        self.held.clear()

    def mute(self) -> None:
        """Ctrl-C: the workers' own tracebacks as they are stopped are not news; one line says it all."""
        self.muted = True
        self.held.clear()

    def note(self, message: str) -> None:
        self.console.print(message)

    def finish_cell(self, outcome: CellOutcome) -> None:
        self.current = None
        if outcome.status == "ok":
            self.done += 1
            self.cell_seconds[outcome.cell.framework].append(outcome.seconds)
            accuracy = (outcome.result or {}).get("final_accuracy")
            self.console.print(
                f"[green]✔ {outcome.cell.key}[/] in {_duration(outcome.seconds)}"
                + (f", accuracy {accuracy:.4f}" if accuracy is not None else "")
            )
        elif outcome.status == "skipped":
            self.skipped += 1
        else:
            self.failed += 1
            reason = outcome.failure.reason if outcome.failure else "failed"
            self.console.print(f"[red]✘ {outcome.cell.key}[/]: {reason}")
        self._refresh()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )
