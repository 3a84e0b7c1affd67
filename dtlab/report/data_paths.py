"""The data paths section (beyond the study): each platform's own ETL beside its DataLoader runs, on the
same clock (Table B.13). Shown only when a run with data_path platform is recorded.

A row is one group of runs: (platform, world size, epochs, data path); no mean mixes data paths. The
platform's ETL row is set against the same platform's DataLoader row at the same world size and epochs,
so the difference is the data path's (the same core, the same tokens: tests/trainer test both paths
token for token). The ratios carry their min-max over the runs and say when the spread does not support
a difference.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence

from dtlab import platforms
from dtlab.cell import DEFAULT_DATA_PATH
from dtlab.report.aggregate import WHOLE_RUN_PHASES, Sample
from dtlab.report.numbers import Value, fmt, missing, num, text
from dtlab.report.strategies import known, ratio_cells
from dtlab.report.study import FRAMEWORKS
from dtlab.report.tables import Table, config_label
from trainer import strategies
from trainer.config import PLATFORM_DATA_PATH

DataPathKey = tuple[str, int, int, str]  # (framework, gpus, epochs, data path)
LOADER_LABEL = "DataLoader: the trainer tokenizes on each node (its cache), each rank reads"
END_TO_END = WHOLE_RUN_PHASES[-1][0]


def end_to_end_s(sample: Sample) -> float | None:
    return dict(sample.phases).get(END_TO_END)


def _order(key: DataPathKey) -> tuple:
    framework, gpus, epochs, data_path = key
    rank = FRAMEWORKS.index(framework) if framework in FRAMEWORKS else len(FRAMEWORKS)
    return rank, framework, gpus, epochs, data_path != DEFAULT_DATA_PATH


def by_data_path(samples: Iterable[Sample]) -> dict[DataPathKey, list[Sample]]:
    """The runs of every platform that has an ETL row, grouped; the study's strategy and model only."""
    groups: dict[DataPathKey, list[Sample]] = defaultdict(list)
    for sample in samples:
        if sample.strategy == strategies.DEFAULT and sample.profile_model:
            groups[(sample.framework, sample.gpus, sample.epochs, sample.data_path)].append(sample)
    with_etl = {(f, g, e) for f, g, e, path in groups if path != DEFAULT_DATA_PATH}
    return {key: groups[key] for key in sorted(groups, key=_order) if key[:3] in with_etl}


def _seconds(values: list[float]) -> Value:
    """The mean, and (min–max) where two or more runs."""
    if not values:
        return missing()
    shown = fmt(statistics.fmean(values), "time_s")
    return text(f"{shown} ({fmt(min(values), 'time_s')}–{fmt(max(values), 'time_s')})" if len(values) > 1
                else shown)


def _step_ms(members: Iterable[Sample]) -> list[float]:
    return [s * 1000 for s in known(m.step_time_s for m in members)]


def _first_step_ratio(members: Iterable[Sample], loader: Iterable[Sample]) -> tuple[Value, Value]:
    return ratio_cells(known(m.startup_s for m in members), known(m.startup_s for m in loader))


def data_paths_table(samples: Sequence[Sample]) -> Table:
    """Table B.13: each platform's own ETL beside its DataLoader runs."""
    groups = by_data_path(samples)
    rows = []
    for (framework, gpus, epochs, data_path), members in groups.items():
        loader = groups.get((framework, gpus, epochs, DEFAULT_DATA_PATH), [])
        is_etl = data_path != DEFAULT_DATA_PATH
        steps = _step_ms(members)
        devices = sorted({m.device for m in members})
        baseline = (text("1 (baseline)"), missing())
        first_ratio = _first_step_ratio(members, loader) if is_etl else baseline
        step_ratio = ratio_cells(steps, _step_ms(loader)) if is_etl else baseline
        rows.append([
            text(platforms.label(framework)),
            text(config_label(gpus, devices[0]) if len(devices) == 1 else f"{gpus} ({'/'.join(devices)})"),
            text(str(epochs)),
            text(platforms.get(framework).etl_label if is_etl else LOADER_LABEL),
            text(str(len(members))),
            _seconds(known(m.etl_s for m in members)) if is_etl else text("— (in tokens ready)"),
            _seconds(known(m.tokens_ready_s for m in members)),
            _seconds(known(m.startup_s for m in members)),
            num(statistics.fmean(steps) if steps else None, "step_ms"),
            _seconds(known(map(end_to_end_s, members))),
            num(statistics.fmean([m.accuracy for m in members]), "accuracy"),
            *first_ratio,
            *step_ratio,
        ])
    return Table(
        "B.13",
        "table-b.13-data-paths",
        "Each platform's own data path beside the DataLoader, on one clock (beyond the study)",
        ["Platform", "Configuration", "Epochs", "Data path", "Runs", "ETL on the driver (s)",
         "Tokens ready on rank 0 (s)", "Submit → first step (s)", "Steady step (ms)", "End to end (s)",
         "Final accuracy", "First step ÷ DataLoader", "First step ÷ DataLoader: min–max (n)",
         "Steady step ÷ DataLoader", "Steady step ÷ DataLoader: min–max (n)"],
        rows,
        [
            "ETL: the platform's own read, clean (the trainer's normalisation), tokenize (the trainer's "
            "tokenizer) and hand-over, timed on the driver before training starts. Tokens ready: rank 0's "
            "wait for both splits' tokens inside the core (the DataLoader path's tokenizing, or its cache; "
            "the ETL path's reading of the platform's rows). Submit → first step and end to end: the whole-"
            "run clock (Table B.3). Steady step: the trainer's median step, the first steps left out. Each "
            "the mean over the group's runs, (min–max) where there are two or more.",
            "Ratios: the ETL runs' mean over the same platform's DataLoader runs at the same world size and "
            "epochs. Min–max: fastest over slowest and slowest over fastest run; then (n=…) the runs of "
            "each; \"within noise\": the two groups' runs overlap, so the spread does not support a "
            "difference.",
            "Both paths train on the same tokens in the same order (every rank takes the whole tokenized "
            "split and the sampler its share, as under ddp), so the per-epoch numbers are the DataLoader "
            "path's; what differs is where and when the tokens are made.",
        ],
    )


def etl_summaries(samples: Sequence[Sample]) -> dict[str, str]:
    """Per platform with measured ETL runs, Table B.10's line: its first step against the DataLoader's."""
    groups = by_data_path(samples)
    lines = {}
    for (framework, gpus, epochs, data_path), members in groups.items():
        loader = groups.get((framework, gpus, epochs, DEFAULT_DATA_PATH), [])
        if data_path != DEFAULT_DATA_PATH and framework not in lines:
            ratio, spread = _first_step_ratio(members, loader)
            lines[framework] = f"own ETL: first step {ratio.text} the DataLoader's, {spread.text} (B.13)"
    return lines


def etl_not_measured(framework: str) -> str:
    """Table B.10's line for a platform without measured ETL runs."""
    if PLATFORM_DATA_PATH in platforms.get(framework).data_paths:
        return "own ETL, not measured yet (bench.all --profile pipeline)"
    return "no ETL of its own in dtlab"


__all__ = ["by_data_path", "data_paths_table", "end_to_end_s", "etl_not_measured", "etl_summaries"]
