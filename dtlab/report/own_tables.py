"""dtlab's own tables beyond the study: B.1 throughput, B.2 failed attempts, B.3 the whole run phase by
phase, B.4 runs resumed from a checkpoint and B.7 the MLPerf-style score."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dtlab.platforms import BASELINE
from dtlab.report.aggregate import (
    MIN_RUNS_FOR_SPREAD,
    PHASE_COLUMNS,
    TRIM_FROM_RUNS,
    GroupKey,
    GroupStats,
    Score,
    in_study_tables,
    ratio_spread,
    score,
)
from dtlab.report.numbers import Value, fmt, missing, num, ratio, text
from dtlab.report.table_base import SPREAD_NOTE, Table, TableContext, spread_text
from dtlab.results import Run
from trainer import progress


class OwnTables(TableContext):
    """Tables B.1, B.3 and B.7, from this cluster's group statistics (beyond the study)."""

    def throughput_table(self) -> Table:
        rows = []
        for stats in self.groups.values():
            rows.append(
                [
                    text(self.name(stats.framework)),
                    text(self.label(stats.framework, stats.gpus)),
                    text(str(stats.epochs)),
                    text(str(stats.n)),
                    num(stats.samples_per_s_mean, "samples_per_s"),
                    num(stats.samples_per_s_std, "samples_per_s"),
                    num(stats.gpu_util_mean, "gpu_util_pct", suffix="%")
                    if stats.gpu_util_mean is not None
                    else text("not recorded"),
                    num(stats.peak_rss_mb_mean, "memory_mb"),
                    num(stats.harness_extra_s_mean, "time_s"),
                ]
            )
        return Table(
            "B.1",
            "table-b.1-throughput",
            "Throughput, GPU utilisation and harness time (beyond the study)",
            [
                "Framework",
                "Configuration",
                "Epochs",
                "Runs",
                "Samples/s mean",
                "Samples/s std",
                "GPU utilisation",
                "Peak RSS (MB)",
                "Harness time beyond trainer (s)",
            ],
            rows,
            [
                "Samples/s and GPU utilisation as the trainer measured them; harness time is the "
                "controller's wall time for the cell minus the trainer's whole-run time."
            ],
        )

    def scored_table(self, target_accuracy: float | None) -> Table:
        """Table B.7: each group's MLPerf-style score, the runs it rests on, and a rank at its count that
        only a supported difference earns."""
        scores = {
            key: score(stats.times, stats.accuracies, target_accuracy) for key, stats in self.groups.items()
        }
        rows = []
        for key, stats in self.groups.items():
            framework, gpus, epochs = key
            scored = scores[key]
            low, high = stats.time_range or (None, None)
            rows.append(
                [
                    text(self.name(framework)),
                    text(self.label(framework, gpus)),
                    text(str(epochs)),
                    text(str(scored.runs)),
                    text(str(scored.missed_target) if target_accuracy is not None else "no target"),
                    text(str(scored.used)),
                    text("invalid: 2 or more runs missed the target")
                    if scored.invalid
                    else num(scored.value, "time_s"),
                    text(f"{fmt(low, 'time_s')}–{fmt(high, 'time_s')}")
                    if stats.n >= 2
                    else text("1 run, no spread"),
                    text(self._rank(key, scores)),
                ]
            )
        target = f"{fmt(target_accuracy, 'accuracy')}" if target_accuracy is not None else "none set"
        return Table(
            "B.7",
            "table-b.7-scored",
            f"Scored time per cell, MLPerf-style (target accuracy: {target}; beyond the study)",
            [
                "Framework",
                "Configuration",
                "Epochs",
                "Runs",
                "Missed target",
                "Runs scored",
                "Score (s)",
                "Time min–max (s)",
                "Rank at this count",
            ],
            rows,
            [
                "Score: the mean whole-run time after dropping the fastest and the slowest run when there "
                f"are at least {TRIM_FROM_RUNS}; a run under the profile's target_accuracy counts as the "
                "slowest (dropped), and two such runs make the cell invalid (MLPerf's training rules). "
                "Rank: 1 + the cells at the same count and epochs that are faster beyond the spread (their "
                f"slowest run faster than this one's fastest); a cell with fewer than {MIN_RUNS_FOR_SPREAD} "
                "runs, or invalid, is not ranked, and cells within noise of each other share a rank.",
            ],
        )

    def _rank(self, key: GroupKey, scores: dict[GroupKey, Score]) -> str:
        stats = self.groups[key]
        if scores[key].invalid:
            return "not ranked (invalid)"
        if stats.n < MIN_RUNS_FOR_SPREAD:
            return f"not ranked ({stats.n} run{'s' if stats.n != 1 else ''})"
        _f, gpus, epochs = key
        rivals = [
            other
            for other_key, other in self.groups.items()
            if other_key != key
            and other_key[1:] == (gpus, epochs)
            and other.n >= MIN_RUNS_FOR_SPREAD
            and not scores[other_key].invalid
        ]
        fastest = min(stats.times)
        return str(1 + sum(max(other.times) < fastest for other in rivals))

    @staticmethod
    def _end_to_end_spread(stats: GroupStats, ddp: GroupStats | None) -> Value:
        if ddp is None or not ddp.end_to_end:
            return missing()
        if stats is ddp:
            return text("– (baseline)")
        found = ratio_spread(stats.end_to_end, ddp.end_to_end)
        return text(spread_text(found, "ratio", suffix="×")) if found is not None else missing()

    def whole_run_table(self) -> Table:
        """Where each platform's time goes, from the controller's submit to the recorded result."""
        rows = []
        for (framework, gpus, epochs), stats in self.groups.items():
            if not stats.phase_means:
                continue
            phases = dict(stats.phase_means)
            ddp = self.groups.get((BASELINE, gpus, epochs))
            ddp_total = dict(ddp.phase_means)["end to end"] if ddp is not None and ddp.phase_means else None
            rows.append(
                [
                    text(self.name(framework)),
                    text(self.label(framework, gpus)),
                    text(str(epochs)),
                    *(
                        num(phases[phase], "time_s") if phase in phases else missing()
                        for phase, _, _ in PHASE_COLUMNS
                    ),
                    ratio(phases["end to end"], ddp_total),
                    self._end_to_end_spread(stats, ddp),
                ]
            )
        return Table(
            "B.3",
            "table-b.3-whole-run",
            "The whole run, phase by phase: mean seconds (beyond the study)",
            [
                "Framework",
                "Configuration",
                "Epochs",
                *(phase for phase, _, _ in PHASE_COLUMNS),
                "End to end vs DDP",
                "End to end vs DDP, min–max",
            ],
            rows,
            [
                "Tables 5.1-5.9 use the trainer's span: from the start of training (after imports, data, "
                "model and process group) to the end of the last validation, which ends the third phase "
                "here and begins inside the second. The study's figures are compared with that span: its "
                "training "
                "script timed each run with Python's time module, so its figures leave out the platform's "
                "start-up too. This table adds what each platform costs around that span: from the "
                "controller taking up the cell to the trainer process running (SSH, units, JVMs and "
                "executors, containers), to the first optimizer step (imports, data, model, rendezvous), "
                'and from the end of validation to the result recorded on the controller. "Of which '
                'queued" is the part of the first phase a scheduler held the job in its queue (Slurm: from '
                "sbatch's job id to the job leaving PENDING); platforms without a queue show —. Runs "
                "recorded before dtlab kept this clock are left out of it.",
                SPREAD_NOTE,
            ],
        )


@dataclass(frozen=True)
class ResumedCost:
    """One run resumed from a checkpoint, with every attempt it took (dtlab.report.build)."""

    cell_key: str
    attempts: int
    resumed_from: int
    epochs_redone: int | None  # None: an attempt's logs are missing or lack the trainer's lines
    trainer_time_s: float
    whole_harness_s: float | None
    undisturbed_harness_s: float | None  # mean over the undisturbed runs of the same group


def resumed_table(costs: Iterable[ResumedCost]) -> Table:
    """Table B.4: the whole cost of each run resumed from a checkpoint."""
    rows = []
    for cost in costs:
        extra = (
            cost.whole_harness_s - cost.undisturbed_harness_s
            if cost.whole_harness_s is not None and cost.undisturbed_harness_s is not None
            else None
        )
        rows.append(
            [
                text(cost.cell_key),
                text(str(cost.attempts)),
                text(str(cost.resumed_from)),
                text("not logged") if cost.epochs_redone is None else text(str(cost.epochs_redone)),
                num(cost.trainer_time_s, "time_s"),
                num(cost.whole_harness_s, "time_s"),
                num(cost.undisturbed_harness_s, "time_s"),
                num(extra, "time_s", sign=True),
            ]
        )
    return Table(
        "B.4",
        "table-b.4-resumed",
        "Runs resumed from a checkpoint: their whole cost (left out of Tables 5.1-5.9)",
        [
            "Cell",
            "Attempts",
            "Resumed after epoch",
            "Epochs redone",
            "Trainer span (s)",
            "All attempts, controller (s)",
            "Undisturbed runs, controller (s)",
            "Cost of the interruption (s)",
        ],
        rows,
        [
            "Attempts: the cell's attempts since its previous success, the failed ones and the resumed one. "
            "Epochs redone: epochs a failed attempt began past the checkpoint it left, which the resumed "
            "attempt trained again (the one it was in counts whole), read from the attempts' logs. The "
            "trainer span carries the checkpointed epochs' time over from the earlier attempt and misses "
            "the lost work; the controller's times (the whole cell, every attempt, and the mean of the "
            "same group's undisturbed runs) include it.",
        ],
    )


def failures_table(failed: Iterable[Run], ok_runs: Iterable[Run]) -> Table:
    """Table B.2. "Cell later ok": an ok attempt of the same cell came after this failure (a failure
    recorded after a success says no: the cell's latest state is that failure)."""
    ok_attempts: dict[str, list[int]] = {}
    for ok in ok_runs:
        ok_attempts.setdefault(ok.cell_key, []).append(ok.attempt)
    rows = [
        [
            text(run.cell_key),
            text(run.cell.profile),
            text(str(run.attempt)),
            text(run.failed_node or "—"),
            text("—" if run.exit_code is None else str(run.exit_code)),
            text(run.reason or "—"),
            text("yes" if any(later > run.attempt for later in ok_attempts.get(run.cell_key, ())) else "no"),
            text(run.recorded_at),
        ]
        for run in failed
    ]
    return Table(
        "B.2",
        "table-b.2-failures",
        "Failed attempts (kept; a later attempt may have succeeded)",
        ["Cell", "Profile", "Attempt", "Node", "Exit code", "Reason", "Cell later ok", "Recorded"],
        rows,
    )


def epochs_begun(run: Run) -> int | None:
    """Epochs a failed attempt began, from its logs (rank 0's has the trainer's progress lines);
    None when it kept no logs."""
    logs = sorted(run.log_dir.glob("*.log")) if run.log_dir.is_dir() else []
    if not logs:
        return None
    counts = [progress.epochs_begun(path.read_text(errors="replace").splitlines()) for path in logs]
    return max((c for c in counts if c is not None), default=0)


def resumed_costs(resumed: list[Run], all_runs: list[Run], groups: dict[GroupKey, GroupStats]
                  ) -> list[ResumedCost]:
    """What each resumed run really cost: every attempt since the cell's previous success."""
    costs = []
    for run in resumed:
        earlier = sorted((r for r in all_runs if r.cell_key == run.cell_key and r.attempt < run.attempt),
                         key=lambda r: r.attempt, reverse=True)
        failed = []
        for attempt in earlier:
            if attempt.status == "ok":
                break
            failed.append(attempt)
        resumed_from = int(run.result["resumed_from_epoch"])
        begun = [epochs_begun(attempt) for attempt in failed]
        # Epochs begun by the failed attempts beyond the checkpoint: negative means their logs miss lines.
        redone = sum(begun) - resumed_from if None not in begun else None
        attempts = [*failed, run]
        whole = sum(a.harness_time_s for a in attempts) if all(a.harness_time_s for a in attempts) else None
        # The groups are the study tables' (in_study_tables): another strategy's, model's or data path's
        # run has no undisturbed mean among them.
        key = (run.cell.framework, run.cell.gpus, run.cell.epochs)
        stats = groups.get(key) if in_study_tables(run.cell) else None
        undisturbed = (stats.time_mean + stats.harness_extra_s_mean
                       if stats is not None and stats.harness_extra_s_mean is not None else None)
        costs.append(ResumedCost(
            cell_key=run.cell_key, attempts=len(attempts), resumed_from=resumed_from,
            epochs_redone=redone if redone is not None and redone >= 0 else None,
            trainer_time_s=float(run.result["time_total_s"]), whole_harness_s=whole,
            undisturbed_harness_s=undisturbed,
        ))
    return costs
