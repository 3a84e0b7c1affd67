"""From recorded runs to per-group statistics and the study's derived figures.

A group is (framework, gpus, epochs) of one parallelism strategy; ``gpus`` is the matrix cell's count
(GPUs, or CPU workers). The study's tables are about the platforms at strategy ddp (``group``'s default):
no mean ever mixes strategies; the strategies section (report/strategies.py) sets them side by side.
Derived figures are functions of group means only, so the same code checks the study's own tables.
Each run's whole-run clock (its phases, its epochs' ends) is read by report/run_clock.py.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dtlab.cell import DEFAULT_DATA_PATH, Cell, model_label
from dtlab.platforms import BASELINE
from dtlab.report.run_clock import (
    PHASE_COLUMNS,
    STARTUP_PHASES,
    RunClock,
    epoch_ends_from_submit,
    whole_run_phases,
)
from dtlab.report.run_clock import QUEUE_PHASE as QUEUE_PHASE  # `as`: also read as aggregate.QUEUE_PHASE
from dtlab.report.run_clock import WHOLE_RUN_PHASES as WHOLE_RUN_PHASES  # and as aggregate.WHOLE_RUN_PHASES
from dtlab.report.run_figures import run_cost, run_energy, run_mfu
from dtlab.report.study import FRAMEWORKS, STUDY_LONG_EPOCHS, STUDY_SHORT_EPOCHS
from dtlab.results import Run
from trainer import strategies

GroupKey = tuple[str, int, int]  # (framework, gpus, epochs), within one strategy (GroupStats.strategy)


@dataclass(frozen=True)
class Sample:
    """One ok run, reduced to what the report needs."""

    framework: str
    gpus: int
    epochs: int
    seed: int
    label: str
    device: str
    time_s: float
    accuracy: float
    samples_per_s: float
    gpu_util_pct: float | None
    peak_rss_mb: float | None
    harness_extra_s: float | None  # harness wall time beyond the trainer's own time
    epoch_accuracy: tuple[tuple[int, float], ...]  # (epoch, validation accuracy), epochs ascending
    phases: tuple[tuple[str, float], ...] = ()  # the whole-run clock (WHOLE_RUN_PHASES), when recorded
    # Seconds from submit to the end of each epoch of epoch_accuracy (epoch_ends_from_submit); empty when
    # the marks are missing.
    epoch_end_s: tuple[float, ...] = ()
    strategy: str = strategies.DEFAULT  # the cell's parallelism strategy
    step_time_s: float | None = None  # the trainer's steady-state (median) step time
    # Peak memory of the busiest worker: max_memory_allocated on CUDA, RSS on CPU (None: not recorded).
    peak_worker_mb: float | None = None
    model: str = ""  # the trained model's label (cell.model_label): bert-tiny, bert-mini, ...
    # Whether it trained the profile's own model; a run's models: entry goes to Table B.12 alone.
    profile_model: bool = True
    data_path: str = DEFAULT_DATA_PATH  # the cell's: a platform ETL's run goes to Table B.13 alone
    etl_s: float | None = None  # data_path platform: the driver's ETL (read, clean, tokenize, hand over)
    tokens_ready_s: float | None = None  # the core's wait for both splits' tokens on rank 0
    # Table B.14's, per run (dtlab.report.efficiency): None where not recorded or not measured
    mfu: float | None = None
    energy_j: float | None = None
    cost: float | None = None

    @property
    def startup_s(self) -> float | None:
        """Submit to the end of the first step (the whole-run clock's STARTUP_PHASES); None without it."""
        phases = dict(self.phases)
        return sum(phases[p] for p in STARTUP_PHASES) if all(p in phases for p in STARTUP_PHASES) else None

    @classmethod
    def from_run(cls, run: Run) -> Sample:
        result = run.result or {}
        harness_extra = (
            (run.harness_time_s - result["time_total_s"]) if run.harness_time_s is not None else None
        )
        accuracy_by_epoch = {m["epoch"]: m["val_accuracy"] for m in result["epoch_metrics"]}
        return cls(
            framework=run.cell.framework,
            gpus=run.cell.gpus,
            epochs=run.cell.epochs,
            seed=run.cell.seed,
            label=result["framework_label"],
            device=result["device"],
            time_s=float(result["time_total_s"]),
            accuracy=float(result["final_accuracy"]),
            samples_per_s=float(result["samples_per_s"]),
            gpu_util_pct=result.get("gpu_utilization_pct"),
            peak_rss_mb=(result.get("peak_memory_mb") or {}).get("rss"),
            harness_extra_s=harness_extra,
            epoch_accuracy=tuple(sorted(accuracy_by_epoch.items())),
            phases=whole_run_phases(result),
            epoch_end_s=epoch_ends_from_submit(result),
            strategy=run.cell.strategy,
            step_time_s=result.get("steady_step_time_s"),
            peak_worker_mb=peak_worker_mb(result),
            model=model_label(str((result.get("hyperparameters") or {}).get("model", ""))),
            profile_model=not run.cell.model,
            data_path=run.cell.data_path,
            etl_s=_span(result, "etl_started", "etl_ended"),
            tokens_ready_s=_span(result, "data_started", "data_ready"),
            mfu=run_mfu(result)[0],
            energy_j=run_energy(result)[0],
            cost=run_cost(result)[0],
        )


def in_study_tables(cell: Cell) -> bool:
    """The study's tables compare the platforms as the study ran them: strategy ddp, the profile's model,
    the DataLoader; other strategies, models and data paths have tables of their own (B.12, B.13)."""
    return cell.strategy == strategies.DEFAULT and not cell.model and cell.data_path == DEFAULT_DATA_PATH


def _span(result: dict, start: str, end: str) -> float | None:
    marks = result.get("timeline_unix") or {}
    return marks[end] - marks[start] if marks.get(start) is not None and marks.get(end) is not None else None


def peak_worker_mb(result: dict) -> float | None:
    """The busiest worker's peak memory: CUDA's allocated peak on a GPU run, the process's RSS on CPU."""
    memory = result.get("peak_memory_mb") or {}
    if result.get("device") == "cuda" and memory.get("cuda") is not None:
        return memory["cuda"]
    return memory.get("rss")


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _std(values: list[float]) -> float | None:
    """Sample standard deviation over seeds; undefined (None) for a single run."""
    return statistics.stdev(values) if len(values) >= 2 else None


@dataclass(frozen=True)
class GroupStats:
    framework: str
    gpus: int
    epochs: int
    n: int
    time_mean: float
    time_std: float | None
    accuracy_mean: float
    accuracy_std: float | None
    samples_per_s_mean: float | None  # None for the study's runs: not published
    samples_per_s_std: float | None
    gpu_util_mean: float | None
    peak_rss_mb_mean: float | None
    harness_extra_s_mean: float | None
    labels: tuple[str, ...]
    devices: tuple[str, ...]
    seeds: tuple[int, ...]
    accuracy_curve: tuple[float, ...] = field(default=())  # mean over seeds, per epoch
    phase_means: tuple[tuple[str, float], ...] = ()  # whole-run phases, mean over the runs that have them
    # Every run's time and accuracy, in seed order: the spread (min-max) and the score come from them.
    # Empty for the study's runs: it published means only.
    times: tuple[float, ...] = ()
    accuracies: tuple[float, ...] = ()
    end_to_end: tuple[float, ...] = ()  # the whole-run clock's "end to end", of the runs that have it
    clocks: tuple[RunClock, ...] = ()  # every run's accuracy and clock per epoch, in seed order
    strategy: str = strategies.DEFAULT  # every run's (a group never mixes strategies)

    @property
    def time_range(self) -> tuple[float, float] | None:
        """(fastest, slowest) run; None when the runs behind the mean are not known (the study's)."""
        return (min(self.times), max(self.times)) if self.times else None

    @classmethod
    def of(cls, samples: list[Sample]) -> GroupStats:
        first = samples[0]
        times = [s.time_s for s in samples]
        accuracies = [s.accuracy for s in samples]
        throughputs = [s.samples_per_s for s in samples]
        # Only epochs every seed reported (a resumed run may lack the epochs before its checkpoint).
        by_seed = [dict(s.epoch_accuracy) for s in samples]
        common = sorted(set.intersection(*(set(accuracies) for accuracies in by_seed)))
        curve = tuple((epoch, statistics.fmean(a[epoch] for a in by_seed)) for epoch in common)
        return cls(
            framework=first.framework,
            gpus=first.gpus,
            epochs=first.epochs,
            n=len(samples),
            time_mean=statistics.fmean(times),
            time_std=_std(times),
            accuracy_mean=statistics.fmean(accuracies),
            accuracy_std=_std(accuracies),
            samples_per_s_mean=statistics.fmean(throughputs),
            samples_per_s_std=_std(throughputs),
            gpu_util_mean=_mean([s.gpu_util_pct for s in samples if s.gpu_util_pct is not None]),
            peak_rss_mb_mean=_mean([s.peak_rss_mb for s in samples if s.peak_rss_mb is not None]),
            harness_extra_s_mean=_mean([s.harness_extra_s for s in samples if s.harness_extra_s is not None]),
            labels=tuple(sorted({s.label for s in samples})),
            devices=tuple(sorted({s.device for s in samples})),
            seeds=tuple(sorted(s.seed for s in samples)),
            accuracy_curve=curve,
            phase_means=_phase_means([s.phases for s in samples if s.phases]),
            times=tuple(s.time_s for s in sorted(samples, key=lambda s: s.seed)),
            accuracies=tuple(s.accuracy for s in sorted(samples, key=lambda s: s.seed)),
            end_to_end=tuple(dict(s.phases)["end to end"] for s in samples if s.phases),
            clocks=tuple(
                RunClock(s.seed, s.epoch_accuracy, s.epoch_end_s)
                for s in sorted(samples, key=lambda s: s.seed)
            ),
            strategy=first.strategy,
        )


def _phase_means(timed: list[tuple[tuple[str, float], ...]]) -> tuple[tuple[str, float], ...]:
    if not timed:
        return ()
    means = []
    for phase, _, _ in PHASE_COLUMNS:
        values = [dict(run)[phase] for run in timed if phase in dict(run)]
        if values:
            means.append((phase, statistics.fmean(values)))
    return tuple(means)


def group(samples: Iterable[Sample], strategy: str = strategies.DEFAULT) -> dict[GroupKey, GroupStats]:
    """The groups of one strategy's samples (the others are left out: no mean mixes strategies)."""
    by_key: dict[GroupKey, list[Sample]] = defaultdict(list)
    for sample in samples:
        if sample.strategy == strategy:
            by_key[(sample.framework, sample.gpus, sample.epochs)].append(sample)
    return {
        key: GroupStats.of(members) for key, members in sorted(by_key.items(), key=lambda kv: _order(kv[0]))
    }


def _order(key: GroupKey) -> tuple[int, int, int]:
    framework, gpus, epochs = key
    rank = FRAMEWORKS.index(framework) if framework in FRAMEWORKS else len(FRAMEWORKS)
    return rank, gpus, epochs


def primary_epochs(epoch_counts: Iterable[int]) -> int | None:
    """The 'short' runs the study's 20-epoch tables are about: 20 when present, else the fewest."""
    counts = sorted(set(epoch_counts))
    if not counts:
        return None
    return STUDY_SHORT_EPOCHS if STUDY_SHORT_EPOCHS in counts else counts[0]


def long_epochs(epoch_counts: Iterable[int], primary: int | None) -> int | None:
    """The 'long' linearity runs: 100 when present, else the most, if longer than the primary."""
    counts = sorted(set(epoch_counts))
    if primary is None:
        return None
    if STUDY_LONG_EPOCHS in counts and primary < STUDY_LONG_EPOCHS:
        return STUDY_LONG_EPOCHS
    longer = [c for c in counts if c > primary]
    return longer[-1] if longer else None


class Derived:
    """The study's derived figures (Tables 5.4, 5.7-5.9, section 5.3.1) from group mean times.

    ``times`` maps (framework, gpus, epochs) to the mean whole-run time; every method returns None
    when a figure's inputs are missing, never a substitute.
    """

    def __init__(self, times: Mapping[GroupKey, float]):
        self.times = dict(times)

    def time(self, framework: str, gpus: int, epochs: int | None) -> float | None:
        return self.times.get((framework, gpus, epochs)) if epochs is not None else None

    def gpu_counts(self, framework: str | None = None) -> list[int]:
        return sorted({g for (f, g, _e) in self.times if framework is None or f == framework})

    def per_epoch(self, framework: str, gpus: int, epochs: int | None) -> float | None:
        total = self.time(framework, gpus, epochs)
        return total / epochs if total is not None else None

    def linearity(self, framework: str, gpus: int, short: int | None, long: int | None) -> float | None:
        """Per-epoch time of the long runs over that of the short runs (Table 5.4's ratio)."""
        long_pe, short_pe = self.per_epoch(framework, gpus, long), self.per_epoch(framework, gpus, short)
        return long_pe / short_pe if long_pe is not None and short_pe else None

    def overhead_x(self, framework: str, gpus: int, epochs: int | None) -> float | None:
        """Whole-run time over DDP's at the same GPU count (Table 5.7; x100-100 = section 5.3.1's %)."""
        this, ddp = self.time(framework, gpus, epochs), self.time(BASELINE, gpus, epochs)
        return this / ddp if this is not None and ddp else None

    def base_gpus(self, framework: str) -> int | None:
        counts = self.gpu_counts(framework)
        return counts[0] if counts else None

    def speedup(self, framework: str, gpus: int, epochs: int | None, base: int | None = None) -> float | None:
        """T(base) / T(gpus), base being the smallest count present (Table 5.8)."""
        base = base if base is not None else self.base_gpus(framework)
        if base is None or gpus <= base:
            return None
        t_base, t_scaled = self.time(framework, base, epochs), self.time(framework, gpus, epochs)
        return t_base / t_scaled if t_base is not None and t_scaled else None

    def efficiency_pct(
        self, framework: str, gpus: int, epochs: int | None, base: int | None = None
    ) -> float | None:
        """Speedup over the ideal speedup gpus/base, in percent (Table 5.8)."""
        base = base if base is not None else self.base_gpus(framework)
        speedup = self.speedup(framework, gpus, epochs, base)
        return speedup / (gpus / base) * 100 if speedup is not None else None

    def reduction_pct(
        self, framework: str, gpus: int, epochs: int | None, base: int | None = None
    ) -> float | None:
        """Time saved against the base GPU count, in percent (section 5.3.1)."""
        speedup = self.speedup(framework, gpus, epochs, base)
        return (1 - 1 / speedup) * 100 if speedup is not None else None

    def overhead_per_epoch_s(self, framework: str, gpus: int, epochs: int | None) -> float | None:
        this, ddp = self.per_epoch(framework, gpus, epochs), self.per_epoch(BASELINE, gpus, epochs)
        return this - ddp if this is not None and ddp is not None else None

    def overhead_per_epoch_pct(self, framework: str, gpus: int, epochs: int | None) -> float | None:
        extra = self.overhead_per_epoch_s(framework, gpus, epochs)
        baseline = self.per_epoch(BASELINE, gpus, epochs)
        return extra / baseline * 100 if extra is not None and baseline else None


# --- the spread of a comparison, and the MLPerf-style score --------------------------------------

# Runs a group needs before its min-max is a spread worth ranking on: with 1 there is none, with 2 the
# "interval" is just the two runs.
MIN_RUNS_FOR_SPREAD = 3


@dataclass(frozen=True)
class Spread:
    """A derived figure's interval over its groups' runs and what a reader may conclude from it.

    The interval is min-max, not a bootstrap: with the 3-5 runs per group a profile affords, a bootstrap
    interval resamples so few values that it is narrower than the runs themselves and claims a precision
    the data do not have; min-max is what was seen, and a reader can check it against the run table.
    """

    low: float | None
    high: float | None
    runs: tuple[int, ...]  # n per group the figure rests on, in the order the figure names them
    overlap: bool  # the groups' min-max intervals overlap (a ratio's interval then includes 1.0)

    @property
    def fewest(self) -> int:
        return min(self.runs) if self.runs else 0

    @property
    def verdict(self) -> str:
        """One of: 1 run, no spread; 2 runs; within noise; "" (a difference the spread supports)."""
        if self.fewest < MIN_RUNS_FOR_SPREAD:
            return "1 run, no spread" if self.fewest <= 1 else f"{self.fewest} runs"
        return "within noise" if self.overlap else ""

    @property
    def rankable(self) -> bool:
        """Whether the figure may order the platforms: enough runs, and a difference the spread supports."""
        return self.verdict == ""


def spread(
    groups: Mapping[GroupKey, GroupStats],
    figure: Callable[[Derived], float | None],
    keys: Sequence[GroupKey],
) -> Spread | None:
    """The interval of ``figure`` (a function of group mean times, monotone in each) over the keys' runs:
    the figure evaluated with each group's time at its fastest and slowest run, every combination. None
    when a group is missing or its runs are not known (the study's published means)."""
    stats = [groups.get(key) for key in keys]
    if any(s is None or s.time_range is None for s in stats):
        return None
    means = {key: s.time_mean for key, s in groups.items()}
    values = []
    for corner in itertools.product(*(s.time_range for s in stats)):
        value = figure(Derived({**means, **dict(zip(keys, corner, strict=True))}))
        if value is not None:
            values.append(value)
    ranges = [s.time_range for s in stats]
    overlap = len(ranges) == 2 and ranges[0][0] <= ranges[1][1] and ranges[1][0] <= ranges[0][1]
    return Spread(
        low=min(values) if values else None,
        high=max(values) if values else None,
        runs=tuple(s.n for s in stats),
        overlap=overlap,
    )


def ratio_spread(these: Sequence[float], those: Sequence[float]) -> Spread | None:
    """The min-max of mean(these) / mean(those) over the runs: fastest over slowest, slowest over fastest."""
    if not these or not those or min(those) <= 0:
        return None
    overlap = min(these) <= max(those) and min(those) <= max(these)
    return Spread(min(these) / max(those), max(these) / min(those), (len(these), len(those)), overlap)


# MLPerf's training rules ("Benchmark results", mlcommons/training_policies training_rules.adoc): of N
# runs, drop the fastest and the slowest and average the rest; a run that does not reach the quality
# target counts as the slowest (infinitely long), so one such run is dropped by the trim and two make
# the result invalid. With fewer runs than TRIM_FROM_RUNS nothing is trimmed: a missed run is dropped,
# and two still invalidate.
TRIM_FROM_RUNS = 5
MISSES_ALLOWED = 1


@dataclass(frozen=True)
class Score:
    """One group's scored time: MLPerf's rule over its runs."""

    runs: int  # recorded
    missed_target: int  # runs under the target accuracy
    used: int  # runs the score is the mean of
    value: float | None  # None: invalid (too many runs missed the target)
    trimmed: bool  # fastest and slowest dropped

    @property
    def invalid(self) -> bool:
        return self.value is None


def score(times: Sequence[float], accuracies: Sequence[float], target_accuracy: float | None = None) -> Score:
    """The mean time over the runs MLPerf's rule keeps (TRIM_FROM_RUNS, MISSES_ALLOWED)."""
    missed = [target_accuracy is not None and a < target_accuracy for a in accuracies]
    count = sum(missed)
    if count > MISSES_ALLOWED or count == len(times):
        return Score(len(times), count, 0, None, False)
    ordered = sorted(math.inf if miss else t for t, miss in zip(times, missed, strict=True))
    trimmed = len(ordered) >= TRIM_FROM_RUNS
    used = [t for t in (ordered[1:-1] if trimmed else ordered) if t != math.inf]
    return Score(len(times), count, len(used), statistics.fmean(used), trimmed)


# --- time to target accuracy (Table B.8, Figure B.3) ----------------------------------------------


@dataclass(frozen=True)
class Reached:
    """When one run first reached the target: the epoch (None: never) and the seconds from submit to
    that epoch's end (None: never reached, or the whole-run clock was not recorded)."""

    seed: int
    epoch: int | None
    seconds: float | None


def reached(clock: RunClock, target_accuracy: float) -> Reached:
    for index, (epoch, accuracy) in enumerate(clock.epoch_accuracy):
        if accuracy >= target_accuracy:
            seconds = clock.epoch_end_s[index] if index < len(clock.epoch_end_s) else None
            return Reached(clock.seed, epoch, seconds)
    return Reached(clock.seed, None, None)


def time_to_target(
    groups: Mapping[GroupKey, GroupStats], target_accuracy: float
) -> dict[GroupKey, tuple[Reached, ...]]:
    """Every group's runs against the target, in seed order."""
    return {
        key: tuple(reached(clock, target_accuracy) for clock in stats.clocks) for key, stats in groups.items()
    }


EpochsBySeed = tuple[int, int, int]  # (gpus, epochs, seed): runs that must agree on the epochs to target


def epoch_disagreements(
    found: Mapping[GroupKey, Sequence[Reached]],
) -> dict[EpochsBySeed, dict[str, int | None]]:
    """(gpus, epochs, seed) -> {framework: epoch to target (None: never)} where two or more platforms
    ran that seed at that count and did not reach the target at the same epoch. The trainer is
    reproducible (the same seed gives the same per-epoch numbers on every platform), so any entry is a
    finding, not noise."""
    by_seed: dict[EpochsBySeed, dict[str, int | None]] = defaultdict(dict)
    for (framework, gpus, epochs), runs in found.items():
        for run in runs:
            by_seed[(gpus, epochs, run.seed)][framework] = run.epoch
    return {
        key: platforms
        for key, platforms in sorted(by_seed.items())
        if len(platforms) >= 2 and len(set(platforms.values())) > 1
    }
