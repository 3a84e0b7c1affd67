"""The verdict: the report's first screen, one line per scenario (experiments/scenarios.yml) saying which
platform this cluster's runs favour and why, or that they do not decide it yet and what would.

Each line rests on dtlab.report.recommendation's decision over Table B.10's measures: the same rule as
Table B.11 (a platform drops out only behind another with support; where a criterion cannot order the
platforms still in, the decision stops and names the command that measures it). The platforms in a
scenario's field are those that ran here (and that it admits). Beside each answer: the scenario source's
own pick (never ranked), the upstream health where it matters (each platform's upstream_health) and any
stand-in a reason rests on (a platform's `stand_in_labels`, e.g. Determined's Core API off-cluster).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

import yaml

from dtlab import platforms
from dtlab.errors import DtlabError
from dtlab.paths import EXPERIMENTS_DIR
from dtlab.report.aggregate import MIN_RUNS_FOR_SPREAD, GroupKey, GroupStats
from dtlab.report.comparison_measures import PLATFORMS, Comparison, Measure, upstream
from dtlab.report.recommendation import (
    MEASURED_BY,
    Decision,
    Priorities,
    decide,
    expand,
    how_to_measure,
    order_from,
    weights_from,
)
from dtlab.report.study import DISPLAY_NAMES
from dtlab.results import Run

SCENARIOS_FILE = EXPERIMENTS_DIR / "scenarios.yml"
LABELS = {"whole_run": "whole run", "speed": "steady-state speed", "startup": "start-up",
          "unattended": "recovery without a person", "adoption": "lines a user writes",
          "footprint": "services and ports", "idle": "idle memory", "provisioning": "provisioning time",
          "mfu": "model FLOPs utilization", "energy": "energy per run", "cost": "cost per run",
          "search": "a search with ASHA", "serving": "serving latency (p99)"}
SPEED_MODES = {"whole_run": "the whole run, start-up included", "steady_state": "the steady-state epoch"}
SCENARIO_KEYS = {"id", "name", "source", "claim", "speed", "priorities", "weights", "candidates", "because"}
REQUIRED_KEYS = ("id", "name", "source", "claim", "speed")

# --- the scenarios file -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    id: str
    name: str
    source: str
    claim: str
    speed: str  # a SPEED_MODES key
    priorities: Priorities  # as written; `judged` maps speed to the scenario's mode
    candidates: tuple[str, ...] = ()
    because: str = ""

    @property
    def judged(self) -> Priorities:
        """The priorities with "speed" read as the scenario says: whole_run or the steady-state epoch."""
        if self.speed != "whole_run":
            return self.priorities
        swap = {"speed": "whole_run"}
        order = tuple(dict.fromkeys(swap.get(c, c) for c in self.priorities.order))
        weights = self.priorities.weights
        return Priorities(order, None if weights is None else {swap.get(c, c): w for c, w in weights.items()})


def _fail(path: Path, where: str, problem: str) -> DtlabError:
    return DtlabError(f"bench.report: {path}: {where}: {problem}")


def _scenario(entry: object, index: int, path: Path, seen: set[str]) -> Scenario:
    where = f"scenario {index}"
    if not isinstance(entry, dict):
        raise _fail(path, where, "must be a mapping with id, name, source, claim, speed and priorities")
    where = f"scenario {index} ({entry.get('id', 'no id')})"
    unknown = sorted(set(map(str, entry)) - SCENARIO_KEYS)
    if unknown:
        raise _fail(path, where, f"unknown key {unknown[0]!r}; known: {', '.join(sorted(SCENARIO_KEYS))}")
    for key in REQUIRED_KEYS:
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise _fail(path, where, f"{key} must be a non-empty string")
    if entry["id"] in seen:
        raise _fail(path, where, "id used twice")
    seen.add(entry["id"])
    if entry["speed"] not in SPEED_MODES:
        raise _fail(path, where, f"speed must be {' or '.join(SPEED_MODES)}, got {entry['speed']!r}")
    for key in ("claim", *(("candidates",) if "candidates" in entry else ())):
        names = entry[key] if key == "candidates" else [entry[key]]
        if not isinstance(names, list) or not names or any(n not in PLATFORMS for n in names):
            raise _fail(path, where, f"{key}: platforms are {', '.join(PLATFORMS)}, got {entry[key]!r}")
    if ("priorities" in entry) == ("weights" in entry):
        raise _fail(path, where, "give either priorities (criteria in order) or weights (criterion: weight)")
    command = f"bench.report: {path}"
    try:
        if "weights" in entry:
            chosen = weights_from(entry["weights"], f"{where}: weights", "bench.report")
        else:
            names = entry["priorities"]
            if not isinstance(names, list):
                raise _fail(path, where, "priorities must be a list, e.g. [speed, recovery]")
            chosen = order_from(names, f"{where}: priorities", "bench.report")
    except DtlabError as error:  # its message names the criterion; say which file
        raise DtlabError(str(error).replace("bench.report:", f"{command}:", 1)) from None
    return Scenario(entry["id"], entry["name"].strip(), entry["source"].strip(), entry["claim"],
                    entry["speed"], chosen, tuple(entry.get("candidates", ())), str(entry.get("because", "")))


def load_scenarios(path: str | Path | None = None) -> list[Scenario]:
    """experiments/scenarios.yml -> the scenarios, every one checked; a bad file is one line."""
    path = Path(path) if path is not None else SCENARIOS_FILE
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise DtlabError(f"bench.report: {path}: cannot read it ({error.strerror})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        raise DtlabError(f"bench.report: {path}: not valid YAML"
                         f"{f' at line {mark.line + 1}' if mark is not None else ''}") from None
    entries = data.get("scenarios") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise DtlabError(f"bench.report: {path}: needs `scenarios:`, a list of scenarios")
    seen: set[str] = set()
    return [_scenario(entry, index, path, seen) for index, entry in enumerate(entries, start=1)]


# --- what the decision needs beside the measures --------------------------------------------------------


@dataclass(frozen=True)
class ProfileCost:
    """What a matrix profile took here: its cells recorded and the seconds of all their attempts."""

    cells: int
    seconds: float | None


def profile_costs(runs: Iterable[Run]) -> dict[str, ProfileCost]:
    cells: dict[str, set[str]] = {}
    seconds: dict[str, float | None] = {}
    for run in runs:
        cells.setdefault(run.cell.profile, set()).add(run.cell_key)
        known = seconds.get(run.cell.profile, 0.0)
        seconds[run.cell.profile] = (None if known is None or run.harness_time_s is None
                                     else known + run.harness_time_s)
    return {p: ProfileCost(len(keys), seconds[p]) for p, keys in cells.items()}


def _profile_shape(profile: str) -> tuple[int, int] | None:
    """(cells, fewest runs per cell) the matrix file declares for a profile; None when it declares none."""
    from dtlab import matrix

    try:
        cells = matrix.load(profile).cells
    except DtlabError:
        return None
    per = Counter((c.framework, c.gpus, c.epochs, c.strategy, c.model, c.data_path, c.fault) for c in cells)
    return len(cells), min(per.values()) if per else 0


def stand_ins(groups: Mapping[GroupKey, GroupStats]) -> dict[str, str]:
    """Per platform, the label of its runs here that are a stand-in (its `stand_in_labels`)."""
    found = {}
    for (framework, _g, _e), stats in groups.items():
        marks = getattr(platforms.get(framework), "stand_in_labels", ()) if framework in PLATFORMS else ()
        for label in stats.labels:
            if any(label.startswith(mark) for mark in marks):
                found[framework] = label
    return found


# --- the lines ----------------------------------------------------------------------------------------


@dataclass
class Verdict:
    lines: list[tuple[str, str]]  # (who asks, the answer): one per scenario; with --priorities, yours first
    preface: list[str] = field(default_factory=list)  # what the runs can and cannot show
    notes: list[str] = field(default_factory=list)  # where the scenarios and the facts come from


def _name(platform: str) -> str:
    return DISPLAY_NAMES.get(platform, platform)


def _names(found: Sequence[str]) -> str:
    names = [_name(p) for p in found]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _short(criterion: str, m: Measure) -> str:
    if not m.measured:
        return m.shown
    value = m.value
    shown = {
        "speed": lambda: f"{value:.2f} s/epoch",
        "whole_run": lambda: f"{value:.1f} s",
        "startup": lambda: f"{value:.1f} s",
        "recovery": lambda: "did not recover" if value == float("inf") else f"{value:.2f}× undisturbed",
        "unattended": lambda: "recovers by itself" if value else "needs a rerun",
        "reproducibility": lambda: "same per-epoch accuracy as DDP" if value else "differs from DDP",
        "adoption": lambda: f"{value:.0f} lines",
        "footprint": lambda: f"{value:.0f} services and ports",
        "idle": lambda: f"{value:.0f} MiB idle",
        "provisioning": lambda: f"{value:.0f} s to provision",
        "mfu": lambda: f"{value * 100:.2f}% MFU",
        "energy": lambda: f"{value:.0f} J a run",
        "cost": lambda: f"{value:.4f} a run",
        "search": lambda: f"{value:.1f} s a search",
        "serving": lambda: f"p99 {value:.1f} ms",
    }.get(criterion, lambda: m.shown)()
    n = m.n
    return f"{shown} (n={n})" if n else f"{shown} (counted)"


@cache
def _lab_durations() -> dict:
    """dtlab/data/lab_durations.yml: how long each profile the verdict names took on the local lab."""
    return yaml.safe_load(resources.files("dtlab").joinpath("data/lab_durations.yml").read_text())


def _duration(profile: str | None, costs: Mapping[str, ProfileCost]) -> str:
    if profile is None:
        return ""
    cost = costs.get(profile)
    if cost is not None and cost.seconds is not None:
        return f"its {cost.cells} cells took {cost.seconds / 60:.1f} min of cell time here (recorded)"
    shape = _profile_shape(profile)
    cells = f"{shape[0]} cells; " if shape else ""
    lab = _lab_durations()
    minutes = lab["seconds"][profile] / 60 if profile in lab["seconds"] else None
    on_lab = f"; on the local lab the command took {minutes:.0f} min ({lab['measured']})" if minutes else ""
    return f"{cells}not yet run on this cluster, so its duration is not measured here{on_lab}"


def _command(criterion: str, measures: Mapping[str, Measure], unknown: Sequence[str],
             costs: Mapping[str, ProfileCost]) -> str:
    """What would decide it: the command, how long it took here, and what it cannot give."""
    missing = [p for p in unknown if not measures[p].measured]
    if missing:
        why = f"{LABELS.get(criterion, criterion)} is not measured for {_names(missing)}"
    else:
        fewest = min(m.n or 0 for p, m in measures.items() if p in unknown)
        runs = f"{fewest} run{'s' if fewest != 1 else ''}"
        why = (f"{LABELS.get(criterion, criterion)} rests on {runs} (at least {MIN_RUNS_FOR_SPREAD} each "
               f"are needed) for {_names(unknown)}")
    command, profile = MEASURED_BY.get(criterion, (how_to_measure(criterion), None))
    text = f"not decidable yet: {why}. Decide it with `{command}`"
    duration = _duration(profile, costs)
    if profile is not None:
        shape = _profile_shape(profile)
        if shape is not None and shape[1] < MIN_RUNS_FOR_SPREAD and not missing:
            duration += (f"; it runs {shape[1]} per cell: give its runs {MIN_RUNS_FOR_SPREAD} seeds in "
                         "experiments/matrix.yml to rank on it")
    return f"{text} ({duration})" if duration else text


def _reasons(decision: Decision, measures: Mapping[str, Mapping[str, Measure]], word: str = "against"
             ) -> list[str]:
    reasons = []
    for step in decision.steps[:3]:
        chosen = measures[step.criterion]
        winner = step.kept[0]
        behind = step.dropped[0]
        more = f" and {len(step.dropped) - 1} more" if len(step.dropped) > 1 else ""
        reasons.append(f"{LABELS.get(step.criterion, step.criterion)}: "
                       f"{_short(step.criterion, chosen[winner])} {word} "
                       f"{_name(behind)}'s {_short(step.criterion, chosen[behind])}{more}")
    return reasons


def _alone(decision: Decision, measures: Mapping[str, Mapping[str, Measure]], priorities: Priorities,
           platform: str, ran: Sequence[str]) -> Decision:
    """A scenario that admits one platform: its figures beside the best measured other, as steps."""
    from dtlab.report.recommendation import Step

    steps = []
    for criterion in priorities.criteria[:2]:
        others = [p for p in ran if p != platform and measures[criterion][p].measured]
        if measures[criterion][platform].measured and others:
            steps.append(Step(criterion, (platform,), (others[0],)))
    return Decision(decision.chosen, tuple(steps))


def _sureness(decision: Decision, measures: Mapping[str, Mapping[str, Measure]]) -> str:
    used = [(s.criterion, p) for s in decision.steps for p in (*s.kept, *s.dropped)]
    timed = [measures[c][p].n for c, p in used if not measures[c][p].exact and measures[c][p].n]
    if not decision.steps:
        return "no ranking was needed"
    if not timed:
        return "sure as a count: it rests on counts and yes/no facts, not on timings"
    return (f"supported: min–max apart with at least {min(timed)} runs each (the report's rule, "
            f"{MIN_RUNS_FOR_SPREAD} or more)")


def _caveats(chosen: Sequence[str], scenario_claim: str | None, decision: Decision,
             found_stand_ins: Mapping[str, str]) -> list[str]:
    caveats = []
    named = set(chosen) | {p for s in decision.steps for p in (*s.kept, *s.dropped)}
    for platform in sorted(named & set(found_stand_ins), key=PLATFORMS.index):
        caveats.append(f"rests on a stand-in: {_name(platform)}'s runs here are "
                       f"\"{found_stand_ins[platform]}\", not the platform itself")
    facts = upstream()
    for platform in dict.fromkeys([*chosen, *([scenario_claim] if scenario_claim else [])]):
        if not facts[platform]["maintained"]:
            caveats.append(f"{_name(platform)} is unmaintained upstream (last release "
                           f"{facts[platform]['last_release']}; source: {facts[platform]['source']})")
    return caveats


def verdict_line(title: str, priorities: Priorities, comparison: Comparison, field_: Sequence[str],
                 costs: Mapping[str, ProfileCost], found_stand_ins: Mapping[str, str],
                 claim: str | None = None, source: str = "") -> tuple[str, str]:
    measures = comparison.measures
    decision = decide(measures, priorities, field_)
    if decision.chosen:
        if len(field_) == 1:
            alone = _alone(decision, measures, priorities, field_[0], comparison.ranked_field)
            reasons = _reasons(alone, measures, "beside")
            runs = [measures[c][field_[0]].n for c in priorities.criteria if measures[c][field_[0]].n]
            body = (f"{_name(field_[0])}, the only platform it admits that ran here"
                    + (f"; what it costs here: {'; '.join(reasons)}" if reasons else "")
                    + ". How sure: not ranked, there is no other candidate"
                    + (f"; its figures rest on {min(runs)} run(s)" if runs else ""))
        elif len(decision.chosen) == 1:
            answer = f"favours {_name(decision.chosen[0])}"
        else:
            answer = f"favours {_names(decision.chosen)} alike (the runs do not separate them)"
        if len(field_) > 1:
            reasons = _reasons(decision, measures)
            alike = [LABELS.get(c, c) for c in decision.tied_on]
            if alike:
                reasons.append(f"alike within noise on {', '.join(alike)}")
            body = f"{answer}: {'; '.join(reasons)}" if reasons else answer
            body += f". How sure: {_sureness(decision, measures)}"
    elif decision.blocked is None:
        body = "not decidable yet: no platform it admits has run here. Decide it with " \
               f"`{MEASURED_BY['speed'][0]}` ({_duration('spread', costs)})"
    else:
        body = _command(decision.blocked, measures[decision.blocked], decision.unknown, costs)
        if decision.steps:
            body += "; so far " + "; ".join(_reasons(decision, measures))
    caveats = _caveats(decision.chosen, claim, decision, found_stand_ins)
    body += f". Judged on: {', then '.join(LABELS.get(c, c) for c in priorities.criteria)}"
    if claim is not None:
        agrees = "the runs here agree" if decision.chosen == (claim,) else "not confirmed here"
        body += f". The source's pick ({source or 'the scenario'}): {_name(claim)}, {agrees}"
    if caveats:
        body += ". " + "; ".join(c[0].upper() + c[1:] for c in caveats)
    return title, f"{body}."


def single_runs_preface(groups: Mapping[GroupKey, GroupStats]) -> list[str]:
    """For a store of single runs (the demo's): what they can and cannot show."""
    if not groups or max(stats.n for stats in groups.values()) > 1:
        return []
    runs = sum(stats.n for stats in groups.values())
    return [
        f"These are {runs} single runs, one per cell. They show that each platform installed, started and "
        "trained on this cluster, its accuracy, and one sample of its time and of where that time went. "
        "They cannot rank platforms on any time: one run has no spread, so no difference can be told "
        f"from noise ({MIN_RUNS_FOR_SPREAD} runs each are needed, their min–max apart). Counts (lines a "
        "user writes, services and ports) and yes/no facts (same-seed reproducibility) need no repeats. "
        "Each line below names the command that would decide it."
    ]


def build_verdict(comparison: Comparison, groups: Mapping[GroupKey, GroupStats], runs: Iterable[Run],
                  priorities: Priorities | None = None, scenarios: list[Scenario] | None = None,
                  search_stand_ins: Mapping[str, str] | None = None) -> Verdict:
    """`search_stand_ins`: the platforms whose search runs are a stand-in's (search.stand_ins)."""
    scenarios = scenarios if scenarios is not None else load_scenarios()
    costs = profile_costs(runs)
    found = {**(search_stand_ins or {}), **stand_ins(groups)}
    ran = comparison.ranked_field
    lines = []
    if priorities is not None:
        lines.append(verdict_line(f"Your priorities ({priorities.described})", priorities, comparison, ran,
                                  costs, found))
    for s in scenarios:
        field_ = [p for p in ran if not s.candidates or p in s.candidates]
        admits = f"; admits {_names(s.candidates)}: {s.because}" if s.candidates else ""
        title = f"{s.name} (speed: {SPEED_MODES[s.speed]}{admits})"
        lines.append(verdict_line(title, s.judged, comparison, field_, costs, found, s.claim, s.source))
    not_run = [p for p in comparison.platforms if p not in ran]
    notes = [
        f"Scenarios and their criteria: {SCENARIOS_FILE.relative_to(EXPERIMENTS_DIR.parent)} (edit it; "
        "`invoke bench.report --priorities ...` adds your own line). Every criterion is measured on this "
        "cluster (Table B.10); the study's checklist and pipelines are shown there beside them, never "
        "ranked. "
        "operations = " + ", ".join(expand(("operations",))) + ".",
    ]
    if not_run:
        notes.append(f"Not run on this cluster, so in no verdict (never placed last for it): "
                     f"{_names(not_run)}.")
    return Verdict(lines, single_runs_preface(groups), notes)


__all__ = ["SCENARIOS_FILE", "ProfileCost", "Scenario", "Verdict", "build_verdict", "load_scenarios",
           "profile_costs", "single_runs_preface", "stand_ins", "verdict_line"]
