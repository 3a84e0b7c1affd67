"""`invoke bench.compare A B`: two sets of runs set side by side, cell by cell, each figure's change marked
"regression", "improvement" or "within noise" by the report's own rule, so that a change can be gated.

A side is a results folder (or a cluster's name: results/<name>), optionally narrowed to the runs recorded
at one dtlab revision (``--revisions R1,R2``: A's at R1, B's at R2; A and B may then be the same folder).
Each side keeps what the report keeps: the newest readable ok run of each cell key (of ``--profile``, when
given), undisturbed (no fault plan), not resumed, of its group's newest setup (build.newest_setup_only).

Runs are matched by cell key, and only when both sides recorded the same config hash: nothing is compared
across trainer configs. The matched runs form groups as the report's (platform, count, epochs, strategy,
model, over the seeds); each figure of a group is computed as the report computes it (aggregate.Sample and
GroupStats; start-up as Table B.10's) and set B against A with aggregate.ratio_spread, whose Spread decides
as everywhere in the report: fewer than MIN_RUNS_FOR_SPREAD runs on a side is not decidable, overlapping
min-max intervals are within noise, intervals apart are a difference the spread supports.
"""

from __future__ import annotations

import statistics
import textwrap
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dtlab.errors import DtlabError
from dtlab.paths import results_dir_for
from dtlab.report.aggregate import MIN_RUNS_FOR_SPREAD, GroupStats, Sample, Spread, ratio_spread
from dtlab.report.build import newest_setup_only
from dtlab.report.comparison_measures import startup as startup_measure  # Table B.10's start-up
from dtlab.report.numbers import fmt
from dtlab.report.study import DISPLAY_NAMES
from dtlab.results import ResultStore, Run, newest_per_cell, unreadable_reason

REGRESSION, IMPROVEMENT, WITHIN_NOISE = "regression", "improvement", "within noise"
COMMAND = "bench.compare"


# --- the figures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One figure compared per group: its runs' values, read as the report reads them."""

    name: str
    quantity: str  # numbers.PLACES key: its printed precision
    unit: str
    lower_is_better: bool
    values: Callable[[GroupStats, Sequence[Sample]], tuple[float, ...]]


def _startup_values(stats: GroupStats, samples: Sequence[Sample]) -> tuple[float, ...]:
    return startup_measure(samples, (stats.framework, stats.gpus, stats.epochs)).values


FIGURES = (
    Figure("trainer time", "time_s", "s", True, lambda stats, _: stats.times),
    Figure("per epoch", "per_epoch_s", "s", True,
           lambda stats, _: tuple(t / stats.epochs for t in stats.times)),
    Figure("start-up", "time_s", "s", True, _startup_values),
    Figure("end to end", "time_s", "s", True, lambda stats, _: stats.end_to_end),
    Figure("steady step", "step_ms", "ms", True,
           lambda _, samples: tuple(s.step_time_s * 1000 for s in samples if s.step_time_s is not None)),
    Figure("final accuracy", "accuracy", "", False, lambda stats, _: stats.accuracies),
)

LEGEND = (
    "Figures as the report computes them: trainer time and final accuracy (Table 5.1), per epoch (Table 5.4, "
    "the steady state), start-up (submit → first step) and end to end (the whole-run clock, Table B.3), "
    "steady step (the trainer's median step, Table B.12)."
)

RULE = (
    "Each figure: mean [min–max] n over each side's runs; change: B's mean over A's, and its interval over "
    "the runs (B's lowest over A's highest, B's highest over A's lowest). A regression or improvement needs "
    f"{MIN_RUNS_FOR_SPREAD} or more runs on each side and the two sides' min–max apart (the report's rule, "
    "docs/results-and-report.md); overlapping runs are within noise."
)


@dataclass(frozen=True)
class Change:
    """One figure of one group, B against A."""

    group: str
    figure: Figure
    a: tuple[float, ...]
    b: tuple[float, ...]

    @property
    def spread(self) -> Spread | None:
        return ratio_spread(self.b, self.a) if self.a and self.b else None

    @property
    def mark(self) -> str:
        found = self.spread
        if found is None:
            missing = [side for side, values in (("A", self.a), ("B", self.b)) if not values]
            return f"not recorded in {' and '.join(missing)}" if missing else "not comparable (a zero in A)"
        if found.fewest < MIN_RUNS_FOR_SPREAD:
            return f"{found.fewest} run{'s' if found.fewest != 1 else ''}: not decidable"
        if found.verdict == WITHIN_NOISE:
            return WITHIN_NOISE
        higher = statistics.fmean(self.b) > statistics.fmean(self.a)
        return REGRESSION if higher == self.figure.lower_is_better else IMPROVEMENT

    def change_text(self) -> str:
        found = self.spread
        if found is None:
            return "—"
        pct = (statistics.fmean(self.b) / statistics.fmean(self.a) - 1) * 100
        shown = fmt(pct, "reduction_pct", sign=True, suffix=" %")
        if found.fewest <= 1:
            return shown
        low, high = ((value - 1) * 100 for value in (found.low, found.high))
        interval = (fmt(value, "reduction_pct", sign=True, suffix=" %") for value in (low, high))
        return f"{shown} [{', '.join(interval)}]"

    def side_text(self, values: tuple[float, ...]) -> str:
        if not values:
            return "—"
        q = self.figure.quantity
        if len(values) == 1:
            return f"{fmt(values[0], q)} n=1"
        mean = fmt(statistics.fmean(values), q)
        return f"{mean} [{fmt(min(values), q)}–{fmt(max(values), q)}] n={len(values)}"


# --- the sides --------------------------------------------------------------------------------------


@dataclass
class Side:
    """One side's runs: the newest comparable ok run per cell key, and the runs left out before matching."""

    name: str  # "A" or "B"
    store: ResultStore
    revision: str | None  # the recorded revision asked for (--revisions), else None: every revision
    runs: dict[str, Run]
    left_out: list[str] = field(default_factory=list)

    @property
    def described(self) -> str:
        revisions = sorted({run.git_rev or "not recorded" for run in self.runs.values()})
        cells = f"{len(self.runs)} cell{'s' if len(self.runs) != 1 else ''}"
        return f"{self.name}: {self.store.root}, {cells}, revision {', '.join(revisions)}"


def open_store(spec: str, name: str) -> ResultStore:
    """A results folder, or a cluster's name (results/<name>); DtlabError when neither holds a store."""
    folder = Path(spec)
    # A bare name that is no folder here is a cluster's: results/<name>.
    candidates = [folder] if folder.exists() or "/" in spec else [folder, results_dir_for(spec)]
    for candidate in candidates:
        store = ResultStore(candidate)
        if store.exists():
            store.check(writable=False)
            return store
    where = " or ".join(str(candidate) for candidate in candidates)
    raise DtlabError(f"{COMMAND}: {name} {spec!r} is not a results store (no dtlab.sqlite in {where}); "
                     "give a results folder such as results/lab, or a cluster's name")


def readable_ok_runs(store: ResultStore) -> list[Run]:
    return [run for run in store.runs("ok") if unreadable_reason(run) is None]


def resolve_revision(runs: Sequence[Run], asked: str, store: ResultStore) -> str:
    """The recorded revision `asked` names: itself, or the one recorded revision it is a prefix of."""
    recorded = sorted({run.git_rev for run in runs if run.git_rev})
    if asked in recorded:
        return asked
    matching = [rev for rev in recorded if rev.startswith(asked)]
    if len(matching) == 1:
        return matching[0]
    if matching:
        raise DtlabError(f"{COMMAND}: revision {asked} is ambiguous in {store.root}: {', '.join(matching)}; "
                         "give more of it")
    counts = ", ".join(f"{rev} ({sum(run.git_rev == rev for run in runs)} runs)" for rev in recorded)
    raise DtlabError(f"{COMMAND}: revision {asked} has no successful run in {store.root}; recorded: "
                     f"{counts or 'no revision'}")


def load_side(name: str, store: ResultStore, runs: list[Run], revision: str | None, profile: str | None
              ) -> Side:
    if revision is not None:
        runs = [run for run in runs if run.git_rev == revision]
    if profile is not None and not any(run.cell.profile == profile for run in runs):
        present = sorted({run.cell.profile for run in runs})
        at = f" at {revision}" if revision else ""
        raise DtlabError(f"{COMMAND}: --profile {profile} has no successful run in {name} "
                         f"({store.root}{at}); recorded: {', '.join(present) or 'none'}")
    newest = newest_per_cell(runs, profile)
    left_out = [f"{run.cell_key} in {name}: faulted (its time is the fault's; see the report's fault section)"
                for run in newest if run.cell.fault]
    left_out += [f"{run.cell_key} in {name}: resumed from a checkpoint (its time misses the interruption)"
                 for run in newest if not run.cell.fault and run.result.get("resumed_from_epoch")]
    kept, other_setup = newest_setup_only(
        [run for run in newest if not run.cell.fault and not run.result.get("resumed_from_epoch")])
    left_out += [f"{run.cell_key} in {name}: another setup than its group's newest runs "
                 f"({run.result['framework_label']})" for run in other_setup]
    if not kept:
        at = f" at revision {revision}" if revision else ""
        raise DtlabError(f"{COMMAND}: {name} ({store.root}{at}) has no successful undisturbed run to compare")
    return Side(name, store, revision, {run.cell_key: run for run in kept}, left_out)


def parse_revisions(spec: str) -> tuple[str, str]:
    parts = [part.strip() for part in spec.split(",")]
    if len(parts) != 2 or not all(parts):
        raise DtlabError(f"{COMMAND}: --revisions {spec!r}: give two revisions separated by a comma, "
                         "A's then B's, e.g. 1a2b3c4d,5e6f7a8b")
    return parts[0], parts[1]


# --- the comparison ---------------------------------------------------------------------------------


# (framework, gpus, epochs, strategy, model, data path): the report's group
GroupId = tuple[str, int, int, str, str, str]


def group_name(run: Run) -> str:
    """The cell key without its seed: ddp-g2-e2, ray-g2-e2-fsdp."""
    cell = run.cell
    head = f"{cell.framework}-g{cell.gpus}-e{cell.epochs}"
    return head + run.cell_key.removeprefix(f"{head}-s{cell.seed}")


def _group_order(group: GroupId) -> tuple:
    framework, gpus, epochs, strategy, model, data_path = group
    order = list(DISPLAY_NAMES)
    return (order.index(framework) if framework in order else len(order), framework, gpus, epochs, strategy,
            model, data_path)


@dataclass
class GroupComparison:
    name: str
    seeds: tuple[int, ...]
    labels: tuple[str, str]  # each side's framework_label(s)
    changes: list[Change]


@dataclass
class Comparison:
    a: Side
    b: Side
    groups: list[GroupComparison]
    left_out: list[str]  # "<cell key>: why", in key order

    @property
    def changes(self) -> list[Change]:
        return [change for group in self.groups for change in group.changes]

    def marked(self, mark: str) -> list[Change]:
        return [change for change in self.changes if change.mark == mark]

    @property
    def regressions(self) -> list[Change]:
        return self.marked(REGRESSION)

    def lines(self) -> list[str]:
        lines = [f"{COMMAND}: B against A", f"  {self.a.described}", f"  {self.b.described}",
                 *textwrap.wrap(LEGEND, 110), *textwrap.wrap(RULE, 110)]
        header = ("figure", "A", "B", "change", "mark")
        for group in self.groups:
            label = group.labels[0] if group.labels[0] == group.labels[1] else (
                f"setup A {group.labels[0]}, B {group.labels[1]}")
            lines += ["", f"{group.name} (seeds {', '.join(map(str, group.seeds))}; {label})"]
            rows = [header] + [
                (f"{c.figure.name}{f' ({c.figure.unit})' if c.figure.unit else ''}", c.side_text(c.a),
                 c.side_text(c.b), c.change_text(), c.mark)
                for c in group.changes
            ]
            widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
            lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                      for row in rows]
        if not self.groups:
            lines += ["", "Nothing compared: no cell is recorded in both with the same config hash."]
        if self.left_out:
            lines += ["", "Left out (not compared):"] + [f"  {why}" for why in self.left_out]
        lines += ["", self.summary()]
        return lines

    def summary(self) -> str:
        undecided = [c for c in self.changes if c.mark.endswith("not decidable")]
        regressed = ", ".join(f"{c.group} {c.figure.name}" for c in self.regressions)
        counts = [
            f"{len(self.regressions)} regression(s) beyond noise" + (f" ({regressed})" if regressed else ""),
            f"{len(self.marked(IMPROVEMENT))} improvement(s)",
            f"{len(self.marked(WITHIN_NOISE))} within noise",
            f"{len(undecided)} not decidable (too few runs)",
        ]
        cells = sum(len(group.seeds) for group in self.groups)
        return (f"{COMMAND}: {cells} cell(s) in {len(self.groups)} group(s) compared: " + ", ".join(counts)
                + f"; {len(self.left_out)} left out")


def match(a: Side, b: Side) -> tuple[list[tuple[Run, Run]], list[str]]:
    """Pairs of runs of the same cell key and config hash; the others, each with why it is left out."""
    matched, left_out = [], [*a.left_out, *b.left_out]
    for key in sorted(set(a.runs) | set(b.runs)):
        run_a, run_b = a.runs.get(key), b.runs.get(key)
        if run_b is None:
            left_out.append(f"{key}: only in A")
        elif run_a is None:
            left_out.append(f"{key}: only in B")
        elif run_a.config_hash != run_b.config_hash:
            left_out.append(f"{key}: config hash differs (A {run_a.config_hash}, B {run_b.config_hash}): "
                            "another trainer config, never compared")
        else:
            matched.append((run_a, run_b))
    return matched, sorted(left_out)


def compare_groups(matched: Sequence[tuple[Run, Run]]) -> list[GroupComparison]:
    by_group: dict[GroupId, list[tuple[Run, Run]]] = defaultdict(list)
    for run_a, run_b in matched:
        cell = run_a.cell
        group_id = (cell.framework, cell.gpus, cell.epochs, cell.strategy, cell.model, cell.data_path)
        by_group[group_id].append((run_a, run_b))
    groups = []
    for group_id in sorted(by_group, key=_group_order):
        pairs = sorted(by_group[group_id], key=lambda pair: pair[0].cell.seed)
        name = group_name(pairs[0][0])
        samples = [[Sample.from_run(pair[side]) for pair in pairs] for side in (0, 1)]
        stats = [GroupStats.of(side) for side in samples]
        changes = []
        for figure in FIGURES:
            a, b = (figure.values(stats[side], samples[side]) for side in (0, 1))
            if a or b:  # a figure neither side recorded (no whole-run clock, no step time) is no row
                changes.append(Change(name, figure, tuple(a), tuple(b)))
        groups.append(GroupComparison(name, tuple(pair[0].cell.seed for pair in pairs),
                                      (" / ".join(stats[0].labels), " / ".join(stats[1].labels)), changes))
    return groups


def compare_runs(a: str, b: str, *, revisions: str | None = None, profile: str | None = None) -> Comparison:
    """`invoke bench.compare A B [--revisions R1,R2] [--profile P]`: every input is checked (DtlabError,
    one line) before anything is printed."""
    asked = parse_revisions(revisions) if revisions is not None else (None, None)
    store_a, store_b = open_store(a, "A"), open_store(b, "B")
    same_folder = store_a.db_path.resolve() == store_b.db_path.resolve()
    if same_folder and revisions is None:
        raise DtlabError(f"{COMMAND}: A and B are the same results folder ({store_a.root}); give two "
                         "folders, or add --revisions R1,R2 to compare two revisions' runs in it")
    runs_a = readable_ok_runs(store_a)
    runs_b = runs_a if same_folder else readable_ok_runs(store_b)
    rev_a = resolve_revision(runs_a, asked[0], store_a) if asked[0] is not None else None
    rev_b = resolve_revision(runs_b, asked[1], store_b) if asked[1] is not None else None
    if same_folder and rev_a == rev_b:
        raise DtlabError(f"{COMMAND}: --revisions {revisions}: both name revision {rev_a} of {store_a.root}; "
                         "the same runs cannot be compared with themselves")
    side_a = load_side("A", store_a, runs_a, rev_a, profile)
    side_b = load_side("B", store_b, runs_b, rev_b, profile)
    matched, left_out = match(side_a, side_b)
    return Comparison(side_a, side_b, compare_groups(matched), left_out)
