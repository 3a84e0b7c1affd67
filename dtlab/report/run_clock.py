"""The whole-run clock: each run's phases, from submit to its result recorded, and the seconds from submit
to the end of each epoch, read from a trainer result's timeline marks (the controller's and rank 0's)."""

from __future__ import annotations

from dataclasses import dataclass

# The whole-run clock: (phase, from mark, to mark). Marks come from the controller (harness_timeline_unix)
# and from rank 0's node (timeline_unix); on a real cluster the two clocks must be in NTP sync.
WHOLE_RUN_PHASES = (
    ("submit → trainer process", "submitted", "process_started"),
    ("→ first step", "process_started", "first_step_done"),
    ("→ end of last validation", "first_step_done", "training_ended"),
    ("→ result recorded", "training_ended", "recorded"),
    ("end to end", "submitted", "recorded"),
)


STARTUP_PHASES = tuple(phase for phase, _, _ in WHOLE_RUN_PHASES[:2])  # submit -> first step


# A platform's own queue, inside "submit → trainer process": how long its scheduler held the job
# (Slurm's driver marks when sbatch gave the job id and when squeue stopped showing it PENDING).
# Only runs through a queue have it; the table shows "—" for the others.
QUEUE_PHASE = ("of which queued", "queue_entered", "queue_left")
PHASE_COLUMNS = (WHOLE_RUN_PHASES[0], QUEUE_PHASE, *WHOLE_RUN_PHASES[1:])


def whole_run_phases(result: dict) -> tuple[tuple[str, float], ...]:
    """Seconds per whole-run phase (QUEUE_PHASE when marked); empty when a required mark is missing
    (runs recorded before the clock)."""
    marks = {**(result.get("timeline_unix") or {}), **(result.get("harness_timeline_unix") or {})}
    if any(marks.get(name) is None for _, start, end in WHOLE_RUN_PHASES for name in (start, end)):
        return ()
    return tuple(
        (phase, marks[end] - marks[start])
        for phase, start, end in PHASE_COLUMNS
        if marks.get(start) is not None and marks.get(end) is not None
    )


def epoch_ends_from_submit(result: dict) -> tuple[float, ...]:
    """Seconds from the controller's submit to the end of each epoch's validation, epochs ascending.

    The trainer records no per-epoch timestamp, so this is derived: the end of epoch k is the start of
    training plus the train and validation times of epochs 1..k, plus k-1 shares of the time between
    epochs (checkpoints, hooks: the recorded span training_started -> training_ended less every epoch's
    train and validation time, spread evenly over the gaps). The last epoch's end is then training_ended
    exactly. Empty when a mark is missing (runs recorded before the whole-run clock).
    """
    marks = {**(result.get("timeline_unix") or {}), **(result.get("harness_timeline_unix") or {})}
    submitted, started, ended = (marks.get(m) for m in ("submitted", "training_started", "training_ended"))
    metrics = sorted(result["epoch_metrics"], key=lambda m: m["epoch"])
    if submitted is None or started is None or ended is None or not metrics:
        return ()
    busy = [m["train_time_s"] + m["val_time_s"] for m in metrics]
    gap = max(0.0, (ended - started) - sum(busy)) / (len(busy) - 1) if len(busy) > 1 else 0.0
    return tuple(started - submitted + sum(busy[: k + 1]) + k * gap for k in range(len(busy)))


@dataclass(frozen=True)
class RunClock:
    """One run's validation accuracy per epoch and the seconds from submit to each epoch's end."""

    seed: int
    epoch_accuracy: tuple[tuple[int, float], ...]  # (epoch, validation accuracy), epochs ascending
    epoch_end_s: tuple[float, ...]  # same order; empty when the whole-run clock was not recorded
