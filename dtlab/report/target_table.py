"""Table B.8: time to the profile's target accuracy, and whether platforms reach it at the same epoch."""

from __future__ import annotations

from collections.abc import Iterable

from dtlab.platforms import BASELINE
from dtlab.report.aggregate import (
    GroupKey,
    Reached,
    Spread,
    epoch_disagreements,
    ratio_spread,
    time_to_target,
)
from dtlab.report.numbers import Value, fmt, missing, num, text
from dtlab.report.study import DISPLAY_NAMES
from dtlab.report.table_base import SPREAD_NOTE, Table, TableContext, spread_text


class TimeToTargetTable(TableContext):
    """Table B.8, time to target accuracy (beyond the study)."""

    def time_to_target_table(self, target_accuracy: float | None, profile: str | None) -> Table:
        """Table B.8: per group, the runs that reached the target, the epoch they did (the same on every
        platform for the same seed, or not) and the whole-run clock from submit to that epoch's end."""
        title = "Time to target accuracy: from submit to the end of the first epoch at the target"
        if target_accuracy is None:
            where = f"profiles.{profile}" if profile else "the profile"
            return Table(
                "B.8",
                "table-b.8-time-to-target",
                f"{title} (no target set; beyond the study)",
                TIME_TO_TARGET_COLUMNS,
                [],
                [
                    f"No target accuracy: set target_accuracy (e.g. 0.80) under {where} in "
                    "experiments/matrix.yml to get the time to target."
                ],
            )
        found = time_to_target(self.groups, target_accuracy)
        disagreeing = epoch_disagreements(found)
        rows = []
        for key, runs in found.items():
            framework, gpus, epochs = key
            times = [run.seconds for run in runs if run.seconds is not None]
            ddp = [run.seconds for run in found.get((BASELINE, gpus, epochs), ()) if run.seconds is not None]
            rows.append(
                [
                    text(self.name(framework)),
                    text(self.label(framework, gpus)),
                    text(str(epochs)),
                    text(str(len(runs))),
                    text(str(sum(run.epoch is not None for run in runs))),
                    text(_epochs_to_target(runs)),
                    text(_agreement(key, runs, disagreeing, found)),
                    num(sum(times) / len(times) if times else None, "time_s"),
                    text(_own_spread(times)) if times else missing(),
                    self._to_target_vs_ddp(framework, times, ddp),
                ]
            )
        notes = [
            "Time to target: the whole-run clock (Table B.3) from the controller's submit to the end of the "
            "validation of the first epoch whose accuracy reached the target, mean over the runs that "
            "reached it. The trainer records no per-epoch timestamp: an epoch's end is the start of "
            "training plus the train and validation times of the epochs up to it, plus its share of the "
            "time between epochs (checkpoints), so the last epoch ends at the recorded end of training. "
            "Runs recorded before the whole-run clock have an epoch but no time.",
            "Same epoch on every platform: runs with the same seed at the same count and epochs train on the "
            "same numbers, so they reach the target at the same epoch; any other outcome is listed.",
            SPREAD_NOTE,
        ]
        if disagreeing:
            notes.append(
                "Platforms that reached the target at different epochs for the same seed: "
                + "; ".join(self._disagreement_text(k, v) for k, v in disagreeing.items())
                + "."
            )
        return Table(
            "B.8",
            "table-b.8-time-to-target",
            f"{title} (target accuracy: {fmt(target_accuracy, 'accuracy')}; beyond the study)",
            TIME_TO_TARGET_COLUMNS,
            rows,
            notes,
        )

    def _disagreement_text(self, key: tuple[int, int, int], platforms: dict[str, int | None]) -> str:
        gpus, epochs, seed = key
        found = ", ".join(
            f"{DISPLAY_NAMES.get(f, f)} {'never' if e is None else e}" for f, e in platforms.items()
        )
        return f"{self.label(None, gpus)}, {epochs} ep, seed {seed}: {found}"

    @staticmethod
    def _to_target_vs_ddp(framework: str, times: list[float], ddp: list[float]) -> Value:
        if framework == BASELINE:
            return text("– (baseline)") if times else missing()
        found = ratio_spread(times, ddp)
        return text(spread_text(found, "ratio", suffix="×")) if found is not None else missing()


TIME_TO_TARGET_COLUMNS = [
    "Framework",
    "Configuration",
    "Epochs",
    "Runs",
    "Reached target",
    "Epochs to target",
    "Same epoch on every platform",
    "Time to target mean (s)",
    "Time to target min–max (s)",
    "Time to target vs DDP, min–max",
]


def _epochs_to_target(runs: Iterable[Reached]) -> str:
    """ "3", or per seed when they differ: "3 (seeds 1, 2), never (seed 3)"."""
    by_epoch: dict[int | None, list[int]] = {}
    for run in runs:
        by_epoch.setdefault(run.epoch, []).append(run.seed)
    if len(by_epoch) == 1:
        [epoch] = by_epoch
        return "never" if epoch is None else str(epoch)
    return ", ".join(
        f"{'never' if epoch is None else epoch} ({_seeds(seeds)})"
        for epoch, seeds in sorted(by_epoch.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    )


def _agreement(key: GroupKey, runs: Iterable[Reached], disagreeing: dict, found: dict) -> str:
    framework, gpus, epochs = key
    seeds = [run.seed for run in runs if (gpus, epochs, run.seed) in disagreeing]
    if seeds:
        return f"no: {_seeds(seeds)} (see the note)"
    others = {
        run.seed
        for (f, g, e), other in found.items()
        if (g, e) == (gpus, epochs) and f != framework
        for run in other
    }
    if not others & {run.seed for run in runs}:
        return "no other platform ran these seeds"
    return "yes"


def _seeds(seeds: list[int]) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def _own_spread(times: list[float]) -> str:
    """A group's own min-max, with the marks the other tables use."""
    found = Spread(min(times), max(times), (len(times),), overlap=False)
    return spread_text(found, "time_s")
