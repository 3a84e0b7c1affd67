"""The strategies section (beyond the study): each parallelism strategy against ddp on the same model,
platform, world size and epochs: step time, peak memory per worker, final accuracy, and the ratio to ddp
with its spread and the runs behind it (Table B.12); and, where a run's models: sets model sizes side by
side, the same as model size grows (Figure B.4). Shown only when a strategy other than ddp, or a model
other than the profile's, is recorded.

A row is one group of runs: (strategy, model, platform, world size, epochs); no mean mixes strategies,
models or platforms. The ratio is taken against the ddp group of the same model, platform, world size and
epochs (a platform runs the same core under every strategy, so the difference is the strategy's).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dtlab.platforms import label as platform_label
from dtlab.report.aggregate import Sample, Spread, ratio_spread
from dtlab.report.numbers import Value, fmt, missing, num, text
from dtlab.report.study import FRAMEWORKS
from dtlab.report.tables import Table, config_label
from trainer import strategies
from trainer.config import GENERATED_MODEL_SHAPES

StrategyKey = tuple[str, str, str, int, int]  # (strategy, model label, framework, gpus, epochs)


def model_size_rank(label: str) -> tuple[float, str]:
    """Smaller models first: a known miniature by its layers x hidden width squared (its encoder's weights,
    roughly); any other model after them, by name."""
    shape = GENERATED_MODEL_SHAPES.get(label)
    size = shape["num_hidden_layers"] * shape["hidden_size"] ** 2 if shape else float("inf")
    return size, label


def _order(key: StrategyKey) -> tuple:
    strategy, model, framework, gpus, epochs = key
    names = strategies.NAMES
    strategy_rank = names.index(strategy) if strategy in names else len(names)
    framework_rank = FRAMEWORKS.index(framework) if framework in FRAMEWORKS else len(FRAMEWORKS)
    return model_size_rank(model), strategy_rank, gpus, epochs, framework_rank, framework


def by_strategy(samples: Iterable[Sample]) -> dict[StrategyKey, list[Sample]]:
    groups: dict[StrategyKey, list[Sample]] = defaultdict(list)
    for sample in samples:
        groups[(sample.strategy, sample.model, sample.framework, sample.gpus, sample.epochs)].append(sample)
    return {key: groups[key] for key in sorted(groups, key=_order)}


def any_other_strategy(samples: Iterable[Sample]) -> bool:
    """Whether the section has anything beyond the study's tables: another strategy, or another model."""
    return any(sample.strategy != strategies.DEFAULT or not sample.profile_model for sample in samples)


@dataclass(frozen=True)
class SizePoint:
    """One model size of a Figure B.4 line: its runs' step times (ms) and peak memory per worker (MB)."""

    model: str
    step_ms: tuple[float, ...]
    memory_mb: tuple[float, ...]


SizeLineKey = tuple[str, str, int, int]  # (strategy, framework, gpus, epochs)


def size_lines(samples: Sequence[Sample]) -> dict[SizeLineKey, list[SizePoint]]:
    """Figure B.4's lines: each (strategy, platform, world size, epochs) recorded at two or more model
    sizes, its points smallest model first. Empty when no run set sizes side by side."""
    lines: dict[SizeLineKey, list[SizePoint]] = defaultdict(list)
    # by_strategy's order (smallest model first, then strategy) orders each line's points and the lines.
    for (strategy, model, framework, gpus, epochs), members in by_strategy(samples).items():
        lines[(strategy, framework, gpus, epochs)].append(SizePoint(
            model,
            tuple(s * 1000 for s in known(m.step_time_s for m in members)),
            tuple(known(m.peak_worker_mb for m in members)),
        ))
    return {key: points for key, points in lines.items() if len(points) >= 2}


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def known(values: Iterable[float | None]) -> list[float]:
    """The values that were recorded (None: not)."""
    return [v for v in values if v is not None]


def ratio_cells(these: list[float], baseline: list[float]) -> tuple[Value, Value]:
    """(ratio of the means, its min-max over the runs with n and "within noise" where the runs overlap), or
    missing ones: two cells of a table beyond the study (B.12, B.13)."""
    if not these or not baseline or statistics.fmean(baseline) <= 0:
        return missing(), missing()
    found: Spread | None = ratio_spread(these, baseline)
    value = num(statistics.fmean(these) / statistics.fmean(baseline), "ratio", suffix="×")
    if found is None:
        return value, missing()
    runs = f"(n={'/'.join(str(n) for n in found.runs)})"
    if found.fewest <= 1:
        return value, text(f"1 run, no spread {runs}")
    interval = f"{fmt(found.low, 'ratio', suffix='×')}–{fmt(found.high, 'ratio', suffix='×')}"
    verdict = f", {found.verdict}" if found.verdict else ""
    return value, text(f"{interval}{verdict} {runs}")


def strategies_table(samples: Sequence[Sample]) -> Table:
    """Table B.12: every (strategy, model, platform, world size, epochs) group beside the same model's and
    platform's ddp."""
    groups = by_strategy(samples)
    rows = []
    for (strategy, model, framework, gpus, epochs), members in groups.items():
        baseline = groups.get((strategies.DEFAULT, model, framework, gpus, epochs), [])
        steps = known(s.step_time_s for s in members)
        memory = known(s.peak_worker_mb for s in members)
        step_ratio, step_spread = ratio_cells(steps, known(s.step_time_s for s in baseline))
        memory_ratio, memory_spread = ratio_cells(memory, known(s.peak_worker_mb for s in baseline))
        devices = sorted({s.device for s in members})
        rows.append([
            text(strategy),
            text(model),
            text(platform_label(framework)),
            text(config_label(gpus, devices[0]) if len(devices) == 1 else f"{gpus} ({'/'.join(devices)})"),
            text(str(epochs)),
            text(str(len(members))),
            num(_mean([s * 1000 for s in steps]) if steps else None, "step_ms"),
            num(_mean(memory), "memory_mb"),
            num(_mean([s.accuracy for s in members]), "accuracy"),
            step_ratio,
            step_spread,
            memory_ratio,
            memory_spread,
        ])
    baseline_name = strategies.DEFAULT
    return Table(
        "B.12",
        "table-b.12-strategies",
        "Parallelism strategies against ddp, per model, platform and world size (beyond the study)",
        [
            "Strategy",
            "Model",
            "Platform",
            "Configuration",
            "Epochs",
            "Runs",
            "Step time (ms)",
            "Peak memory per worker (MB)",
            "Final accuracy",
            f"Step time ÷ {baseline_name}",
            f"Step time ÷ {baseline_name}: min–max (n)",
            f"Memory ÷ {baseline_name}",
            f"Memory ÷ {baseline_name}: min–max (n)",
        ],
        rows,
        [
            "Step time: the trainer's steady-state (median) step, the first steps left out; peak memory: the "
            "busiest worker's, max_memory_allocated on a GPU, RSS on CPU; final accuracy: the last epoch's "
            "validation accuracy; each the mean over the group's runs (seeds).",
            f"Ratios: this strategy's mean over {baseline_name}'s on the same model, platform, world size "
            f"and epochs (— where that {baseline_name} group is not recorded). Min–max: fastest over "
            "slowest and slowest over fastest run; then (n=…) the runs of this group and of the baseline's. "
            "\"Within noise\": the two groups' runs overlap.",
        ],
    )


__all__ = ["SizePoint", "any_other_strategy", "by_strategy", "known", "model_size_rank", "ratio_cells",
           "size_lines", "strategies_table"]
