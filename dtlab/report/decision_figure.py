"""Figure B.5, the decision figure: per platform, the measured criteria side by side (start-up, steady-state
overhead, fault recovery, 2-worker scaling, idle memory), each a mean with its min–max over n runs, drawn
right after the verdict (issue #52, item 2).

Every figure is one the report already computes, taken from where it is computed: start-up, steady state,
recovery and idle memory are Table B.10's measures (dtlab.report.comparison_measures, comparison_records),
the overhead's min–max is aggregate.ratio_spread over the steady-state runs (as Table B.10's text), and the
scaling is Table 5.8's speedup with aggregate.spread. A criterion with no runs behind it for a platform is a
"not measured" mark with its reason, never a zero.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dtlab.platforms import BASELINE
from dtlab.report.aggregate import Derived, GroupKey, GroupStats, Spread, ratio_spread, spread
from dtlab.report.comparison_measures import Comparison, Measure
from dtlab.report.comparison_records import NOT_MEASURED
from dtlab.report.numbers import fmt
from dtlab.report.study import STUDY_BASE_GPUS, STUDY_SCALED_GPUS

TITLE = "Figure B.5: what each platform costs here, measured (min–max over n runs)"
STEM = "figure-b.5-decision"
IDLE_UNRECORDED = "no cluster.idle probe"
# Kinds of mark: a value with its min-max; the baseline itself (DDP against DDP); an exact figure from
# the repository (no daemon: 0 MiB); a run that never recovered (worse than any ratio); nothing measured.
MEASURED, BASELINE_MARK, EXACT, DID_NOT_RECOVER, MISSING = (
    "measured", "baseline", "exact", "did not recover", "not measured")


@dataclass(frozen=True)
class Mark:
    """One platform on one criterion: `value` None unless measured; `low`/`high` its min-max where 2 or
    more runs are behind it; `n` the runs (as text: "3", or "5/5" for a ratio of two groups)."""

    kind: str
    value: float | None
    label: str
    n: str = ""
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class CriterionPanel:
    """One column of the figure: a criterion, its unit and direction, a mark per platform."""

    title: str
    axis: str  # the unit and which way is better
    marks: Mapping[str, Mark]
    reference: float | None = None  # a dashed line: 1.0 for a ratio (as fast as DDP, no gain)
    what: str = "runs"  # what n counts: runs, fault runs, probes
    of: str = ""  # for a ratio, whose runs n counts: "platform/DDP"

    @property
    def n_text(self) -> str:
        """What the panel rests on: "n = 1 run each", "n = 1/1 runs each (platform/DDP)", "n = 1 to 5
        runs", or "n = 0 fault runs"."""
        counts = sorted({m.n for m in self.marks.values() if m.kind in (MEASURED, DID_NOT_RECOVER) and m.n},
                        key=_n_order)
        of = f" ({self.of})" if self.of else ""
        if not counts:
            return f"n = 0 {self.what}"
        if len(counts) == 1:
            what = self.what.removesuffix("s") if counts[0] == "1" else self.what
            return f"n = {counts[0]} {what} each{of}"
        return f"n = {counts[0]} to {counts[-1]} {self.what}{of}"


def _n_order(n: str) -> tuple[int, ...]:
    return tuple(int(part) for part in n.split("/"))


def _missing(reason: str) -> Mark:
    return Mark(MISSING, None, reason if reason.startswith(NOT_MEASURED) else f"{NOT_MEASURED}: {reason}")


def _with_range(text: str, n: str, low: float | None, high: float | None, quantity: str, unit: str) -> str:
    if low is None or high is None:
        return f"{text} (n={n})"
    return f"{text} (n={n})\n{fmt(low, quantity)}–{fmt(high, quantity)}{unit}"


def _of_runs(measure: Measure, quantity: str, unit: str, unrecorded: str = "") -> Mark:
    """A measure over runs (start-up, recovery, idle probes): its mean, min-max where 2 or more.
    `unrecorded`: why, where the measure says only "not measured" (no record at all)."""
    if not measure.measured:
        return _missing(unrecorded if unrecorded and measure.shown == NOT_MEASURED else measure.shown)
    if measure.exact and not measure.values:  # e.g. 0 MiB: no daemon of its own, from the repository
        return Mark(EXACT, measure.value, f"{fmt(measure.value, quantity)}{unit}: {_reason(measure.shown)}")
    if measure.value == float("inf"):
        n = str(len(measure.values))
        return Mark(DID_NOT_RECOVER, None, f"did not recover (n={n})", n)
    values = measure.values
    n = str(len(values))
    low, high = (min(values), max(values)) if len(values) > 1 else (None, None)
    text = f"{fmt(measure.value, quantity)}{unit}"
    return Mark(MEASURED, measure.value, _with_range(text, n, low, high, quantity, unit), n, low, high)


def _reason(shown: str) -> str:
    """'0 MiB (no daemon of its own)' -> 'no daemon of its own'."""
    return shown[shown.find("(") + 1:shown.rfind(")")] if "(" in shown else shown


def _of_spread(value: float | None, found: Spread | None, why_not: str, quantity: str, unit: str) -> Mark:
    """A ratio of two groups with its interval over their runs, drawn only when each has 2 or more (as
    Figure 5.1: one run has no spread)."""
    if value is None or found is None:
        return _missing(why_not)
    n = "/".join(map(str, found.runs))
    shown = found.fewest > 1 and found.low is not None and found.high is not None
    low, high = (found.low, found.high) if shown else (None, None)
    return Mark(MEASURED, value, _with_range(f"{fmt(value, quantity)}{unit}", n, low, high, quantity, unit),
                n, low, high)


def overhead_marks(speed: Mapping[str, Measure]) -> dict[str, Mark]:
    """Steady-state per-epoch time against DDP's (Table B.10's steady state): the ratio of the means, its
    min–max over the runs (aggregate.ratio_spread, Table B.10's interval)."""
    ddp = speed.get(BASELINE)
    marks = {}
    for platform, measure in speed.items():
        if not measure.measured:
            marks[platform] = _missing(measure.shown)
        elif ddp is None or not ddp.measured:
            marks[platform] = _missing("no DDP run")
        elif platform == BASELINE:
            n = str(len(measure.values))
            marks[platform] = Mark(BASELINE_MARK, 1.0, f"1× (baseline, n={n})", n)
        else:
            found = ratio_spread(measure.values, ddp.values)
            marks[platform] = _of_spread(measure.value / ddp.value, found, "no DDP run", "overhead_x", "×")
    return marks


def _speedup(platform: str, base: int, scaled: int, epochs: int | None) -> Callable[[Derived], float | None]:
    return lambda derived: derived.speedup(platform, scaled, epochs, base)


def scaling_marks(groups: Mapping[GroupKey, GroupStats], platforms: Sequence[str], epochs: int | None,
                  base: int = STUDY_BASE_GPUS, scaled: int = STUDY_SCALED_GPUS) -> dict[str, Mark]:
    """Speedup T(base) / T(scaled) at the short runs, as Table 5.8 computes it, with its min–max."""
    derived = Derived({key: stats.time_mean for key, stats in groups.items()})
    marks = {}
    for platform in platforms:
        keys = [(platform, base, epochs), (platform, scaled, epochs)]
        lacking = [count for (_p, count, _e) in keys if (platform, count, epochs) not in groups]
        figure = _speedup(platform, base, scaled, epochs)
        why = f"no {' or '.join(f'{c}-worker' for c in lacking)} run" if lacking else "no run"
        marks[platform] = _of_spread(figure(derived), spread(groups, figure, keys) if not lacking else None,
                                     why, "speedup", "×")
    return marks


def decision_panels(comparison: Comparison, groups: Mapping[GroupKey, GroupStats], short: int | None,
                    count: int | None) -> list[CriterionPanel]:
    """The figure's five columns, in the order a reader weighs them: what each platform costs to start,
    per epoch, to recover, to scale, and when idle. `count` is the count Table B.10 compares at."""
    measures = comparison.measures
    at = f"{count} workers/GPUs, " if count is not None else ""
    epochs = f"{short}-epoch runs" if short is not None else "no runs"
    return [
        CriterionPanel(
            "Start-up\nsubmit → first step",
            f"seconds ({at}{epochs}); lower is better",
            {p: _of_runs(measures["startup"][p], "time_s", " s") for p in comparison.platforms},
        ),
        CriterionPanel(
            "Steady overhead\nper-epoch time / DDP's",
            f"× DDP's time ({at}{epochs}); lower is better",
            overhead_marks({p: measures["speed"][p] for p in comparison.platforms}),
            reference=1.0, of="platform/DDP",
        ),
        CriterionPanel(
            "Recovery from a fault\ntotal / undisturbed time",
            "× undisturbed (fault runs); lower is better",
            {p: _of_runs(measures["recovery"][p], "ratio", "×") for p in comparison.platforms},
            reference=1.0, what="fault runs",
        ),
        CriterionPanel(
            f"{STUDY_SCALED_GPUS}-worker scaling\nT({STUDY_BASE_GPUS}) / T({STUDY_SCALED_GPUS}), speedup",
            f"× ({epochs}; {STUDY_SCALED_GPUS} = ideal); higher is better",
            scaling_marks(groups, comparison.platforms, short),
            reference=1.0, of=f"{STUDY_BASE_GPUS}/{STUDY_SCALED_GPUS} workers",
        ),
        CriterionPanel(
            "Idle footprint\nmemory of its services",
            "MiB over the nodes, no cell running; lower is better",
            {p: _of_runs(measures["idle"][p], "memory_mb", " MiB", IDLE_UNRECORDED)
             for p in comparison.platforms},
            what="probes",
        ),
    ]


__all__ = ["BASELINE_MARK", "DID_NOT_RECOVER", "EXACT", "MEASURED", "MISSING", "NOT_MEASURED", "STEM",
           "TITLE", "CriterionPanel", "Mark", "decision_panels", "overhead_marks", "scaling_marks"]
