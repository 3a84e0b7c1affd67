"""Table B.11: the platforms ranked on the criteria the user puts first (`bench.report --priorities`),
a place given only where the data support it; the decision the verdict (dtlab.report.verdict) reads; and
the study's conclusions checked against that decision.

A decision goes criterion by criterion (or, with weights, sums the places): a platform drops out only
behind another with support (aggregate.MIN_RUNS_FOR_SPREAD runs each and min-max apart, or an exact
count); platforms within noise on a criterion go on to the next. Where a criterion cannot order the
platforms still in (not measured, or too few runs) the decision stops there: the next criterion never
decides as if that one were measured and tied."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from dtlab.errors import DtlabError
from dtlab.report.aggregate import MIN_RUNS_FOR_SPREAD
from dtlab.report.comparison_measures import CRITERIA, Comparison, Measure, study_qualitative
from dtlab.report.numbers import text
from dtlab.report.study import DISPLAY_NAMES
from dtlab.report.tables import Table

# --- which of two measures is ahead, with support ----------------------------------------------------


def better(a: Measure, b: Measure, lower_first: bool) -> bool | None:
    """True when a is ahead of b and the data support it; None when they cannot be told apart."""
    if not a.measured or not b.measured:
        return None
    if math.isinf(a.value) != math.isinf(b.value):  # did not recover against recovered: always apart
        return (a.value < b.value) == lower_first
    if a.exact or (a.published and b.published):
        if a.value == b.value:
            return None
        return (a.value < b.value) == lower_first
    if a.published or b.published or min(len(a.values), len(b.values)) < MIN_RUNS_FOR_SPREAD:
        return None
    if lower_first:
        return True if max(a.values) < min(b.values) else None
    return True if min(a.values) > max(b.values) else None


def _supported(m: Measure) -> bool:
    """Enough behind it to call it equal to another: a count, a published mean, or enough runs."""
    return m.exact or m.published or len(m.values) >= MIN_RUNS_FOR_SPREAD


def compare(a: Measure, b: Measure, lower_first: bool) -> str:
    """'ahead', 'behind', 'tied' (both measured with support, not apart: within noise or equal) or
    'unknown' (one not measured, or too few runs to tell)."""
    if better(a, b, lower_first):
        return "ahead"
    if better(b, a, lower_first):
        return "behind"
    if a.measured and b.measured and _supported(a) and _supported(b):
        return "tied"
    return "unknown"


LOWER_FIRST = {
    "speed": True,
    "whole_run": True,
    "startup": True,
    "recovery": True,
    "unattended": False,
    "reproducibility": False,
    "adoption": True,
    "footprint": True,
    "idle": True,
    "provisioning": True,
    "mfu": False,
    "energy": True,
    "cost": True,
    "search": True,
    "serving": True,
    "checklist": False,
    "pipelines": False,
}

# "operations" is what running a platform costs its operators, as dtlab measures it: recovery without a
# person, services and ports, idle memory, provisioning time, lines a user writes (in that order).
COMPOSITES = {"operations": ("unattended", "footprint", "idle", "provisioning", "adoption")}
KNOWN = (*CRITERIA, *COMPOSITES)

# What measures a criterion on a cluster: the command, and the matrix profile it runs (None: not a
# matrix run). Criteria missing here are always measured (counted in the repository dtlab deploys).
MEASURED_BY = {
    "speed": ("invoke bench.all --profile spread", "spread"),
    "whole_run": ("invoke bench.all --profile spread", "spread"),
    "startup": ("invoke bench.all --profile spread", "spread"),
    "reproducibility": ("invoke bench.all --profile spread", "spread"),
    "recovery": ("invoke bench.faults --profile faults", "faults"),
    "unattended": ("invoke bench.faults --profile faults", "faults"),
    "idle": ("invoke cluster.idle, 3 times with no cell running", None),
    "provisioning": ("invoke cluster.provision on fresh nodes, 3 times", None),
    "mfu": ("invoke bench.all --profile spread", "spread"),
    "energy": ("invoke bench.all --profile spread, on nodes with an NVIDIA GPU or RAPL", "spread"),
    "cost": ("node_cost_per_hour in the inventory, then invoke bench.all --profile spread", "spread"),
    "search": ("invoke bench.all --profile tune", "tune"),
    "serving": ("invoke bench.all --profile serve", "serve"),
}
STUDY_WORD = "the study's word, never measured by dtlab"


def expand(names: Sequence[str]) -> tuple[str, ...]:
    """Criteria with each composite replaced by its parts, each once, in order."""
    found: list[str] = []
    for name in names:
        for part in COMPOSITES.get(name, (name,)):
            if part not in found:
                found.append(part)
    return tuple(found)


# --- priorities -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Priorities:
    """Ordered criteria (lexicographic: the first decides, the next breaks its ties) or weights."""

    order: tuple[str, ...]
    weights: dict[str, float] | None = None

    @property
    def described(self) -> str:
        if self.weights is None:
            return ", then ".join(self.order)
        return ", ".join(f"{c} ×{w:g}" for c, w in self.weights.items())

    @property
    def criteria(self) -> tuple[str, ...]:
        """The order with composites expanded (operations: its measured parts)."""
        return expand(self.order)

    @property
    def expanded_weights(self) -> dict[str, float] | None:
        """Each composite's weight shared evenly among its parts."""
        if self.weights is None:
            return None
        found: dict[str, float] = {}
        for name, weight in self.weights.items():
            parts = COMPOSITES.get(name, (name,))
            for part in parts:
                found[part] = found.get(part, 0.0) + weight / len(parts)
        return found


def _unknown(name: str, where: str, command: str) -> DtlabError:
    return DtlabError(f"{command}: {where}: unknown criterion {name!r}; known: {', '.join(KNOWN)}")


def weights_from(data: object, where: str, command: str) -> Priorities:
    """{criterion: weight > 0} -> Priorities ordered by weight, largest first; one-line errors."""
    if not isinstance(data, dict) or not data:
        raise DtlabError(f"{command}: {where}: must map criteria to weights, e.g. 'speed: 3'")
    weights = {}
    for name, weight in data.items():
        if name not in KNOWN:
            raise _unknown(str(name), where, command)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise DtlabError(f"{command}: {where}: {name}: weight must be a number > 0, got {weight!r}")
        weights[name] = float(weight)
    return Priorities(tuple(sorted(weights, key=lambda c: -weights[c])), weights)


def order_from(names: Sequence[object], where: str, command: str) -> Priorities:
    """Criteria in order -> Priorities; one-line errors."""
    if not names or any(not isinstance(n, str) or not n for n in names):
        raise DtlabError(f"{command}: {where}: give criteria in order, e.g. speed,recovery,operations")
    for name in names:
        if name not in KNOWN:
            raise _unknown(str(name), where, command)
    if len(set(names)) != len(names):
        raise DtlabError(f"{command}: {where}: a criterion is named twice")
    return Priorities(tuple(str(n) for n in names))


def parse_priorities(spec: str) -> Priorities:
    """`speed,recovery,operations` (ordered) or a YAML file of {criterion: weight > 0}; one-line errors."""
    command = "bench.report"
    spec = spec.strip()
    if spec.endswith((".yml", ".yaml")) or Path(spec).is_file():
        path = Path(spec)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as error:
            raise DtlabError(
                f"bench.report: --priorities {spec}: cannot read it ({error.strerror})"
            ) from None
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise DtlabError(f"bench.report: --priorities {spec}: not valid YAML{where}") from None
        return weights_from(data, f"--priorities {spec}", command)
    names = [name.strip() for name in spec.split(",")]
    if not spec or any(not name for name in names):
        raise DtlabError(
            f"bench.report: --priorities {spec!r}: give criteria separated by commas, "
            f"e.g. speed,recovery,operations"
        )
    return order_from(names, f"--priorities {spec}", command)


# --- the decision --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """A criterion that left `dropped` behind `kept` with support."""

    criterion: str
    kept: tuple[str, ...]
    dropped: tuple[str, ...]


@dataclass(frozen=True)
class Decision:
    chosen: tuple[str, ...]  # first place (more than one: alike on every criterion); () not decidable
    steps: tuple[Step, ...] = ()  # the criteria that decided, in order
    tied_on: tuple[str, ...] = ()  # criteria on which the platforms still in were alike (with support)
    blocked: str | None = None  # the criterion the decision stopped at
    unknown: tuple[str, ...] = ()  # the platforms it cannot order there
    contenders: tuple[str, ...] = ()  # the platforms still in when it stopped


Measures = Mapping[str, Mapping[str, Measure]]


def _unknown_among(measures: Measures, criterion: str, platforms: Sequence[str]) -> tuple[str, ...]:
    lower = LOWER_FIRST[criterion]
    found = set()
    for i, p in enumerate(platforms):
        for q in platforms[i + 1:]:
            if compare(measures[criterion][p], measures[criterion][q], lower) == "unknown":
                found |= {p, q}
    return tuple(p for p in platforms if p in found)


def _places(measures: Measures, criterion: str, platforms: Sequence[str]) -> dict[str, int]:
    lower = LOWER_FIRST[criterion]
    return {p: 1 + sum(compare(measures[criterion][q], measures[criterion][p], lower) == "ahead"
                       for q in platforms if q != p) for p in platforms}


def decide(measures: Measures, priorities: Priorities, among: Sequence[str]) -> Decision:
    """The platform(s) the measures favour among `among` on these priorities, or where it stops."""
    field = tuple(among)
    if not field:  # nothing ran here: blocked on nothing in particular (decision_text says so)
        return Decision(())
    weights = priorities.expanded_weights
    if weights is not None:
        return _decide_weighted(measures, weights, field)
    contenders, steps, tied = field, [], []
    for criterion in priorities.criteria:
        if len(contenders) == 1:
            break
        places = _places(measures, criterion, contenders)
        kept = tuple(p for p in contenders if places[p] == 1)
        unknown = _unknown_among(measures, criterion, kept)
        if unknown:
            return Decision((), tuple(steps), tuple(tied), criterion, unknown, contenders)
        if len(kept) < len(contenders):
            steps.append(Step(criterion, kept, tuple(p for p in contenders if p not in kept)))
        else:
            tied.append(criterion)
        contenders = kept
    return Decision(contenders, tuple(steps), tuple(tied))


def _decide_weighted(measures: Measures, weights: Mapping[str, float], field: tuple[str, ...]) -> Decision:
    """The smallest weighted sum of places; only when every criterion weighed orders the whole field."""
    places = {}
    for criterion in sorted(weights, key=lambda c: -weights[c]):
        unknown = _unknown_among(measures, criterion, field)
        if unknown:
            return Decision((), blocked=criterion, unknown=unknown, contenders=field)
        places[criterion] = _places(measures, criterion, field)
    sums = {p: sum(weights[c] * places[c][p] for c in places) for p in field}
    best = min(sums.values())
    chosen = tuple(p for p in field if sums[p] == best)
    steps = tuple(
        Step(c, chosen, tuple(p for p in field if places[c][p] > max(places[c][q] for q in chosen)))
        for c in places
        if any(places[c][p] > max(places[c][q] for q in chosen) for p in field)
    )
    return Decision(chosen, steps, tuple(c for c in places if len(set(places[c].values())) == 1))


def how_to_measure(criterion: str) -> str:
    if criterion in ("checklist", "pipelines"):
        return STUDY_WORD
    command = MEASURED_BY.get(criterion)
    return command[0] if command else "counted in the repository"


# --- Table B.11 ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    platform: str
    rank: int | None  # 1 + the platforms ahead of it with support; None: no run on this cluster
    tiers: dict[str, int | None]  # criterion -> 1 + platforms ahead of it (None: not measured)
    reasons: dict[str, str]  # criterion -> its figure and who it ties with
    unranked_against: tuple[str, ...] = ()  # platforms it cannot be ordered against (unknown first)


def tiers(measures: Mapping[str, Measure], criterion: str, field: Sequence[str] | None = None
          ) -> tuple[dict[str, int | None], dict[str, list[str]]]:
    """Per platform: 1 + the platforms ahead of it with support (None when not measured: never placed
    after the measured for it), and the platforms it cannot be told from although their figures differ."""
    lower = LOWER_FIRST[criterion]
    platforms = list(field if field is not None else measures)
    found: dict[str, int | None] = {}
    ties: dict[str, list[str]] = {}
    for p in platforms:
        m = measures[p]
        found[p] = None if not m.measured else 1 + sum(
            compare(measures[q], m, lower) == "ahead" for q in platforms if q != p)
        ties[p] = [q for q in platforms if q != p and m.measured and measures[q].measured
                   and measures[q].value != m.value and compare(measures[q], m, lower) in ("tied", "unknown")]
    return found, ties


def _ahead(measures: Measures, criteria: Sequence[str], p: str, q: str) -> bool | None:
    """Lexicographically: True when p is ahead of q, False when not, None when it cannot be told."""
    for criterion in criteria:
        found = compare(measures[criterion][p], measures[criterion][q], LOWER_FIRST[criterion])
        if found != "tied":
            return {"ahead": True, "behind": False}.get(found)
    return False


def rank(comparison: Comparison, priorities: Priorities) -> list[Placed]:
    """The platforms in order: 1 + the platforms ahead of each with support (lexicographic over the
    ordered criteria, or the weighted sum of places); a platform with no run here is not ranked."""
    criteria = priorities.criteria
    field = comparison.ranked_field
    per_criterion = {c: tiers(comparison.measures[c], c, field) for c in criteria}
    weights = priorities.expanded_weights
    placed = []
    for p in comparison.platforms:
        reasons = {}
        for c in criteria:
            m = comparison.measures[c][p]
            place = per_criterion[c][0].get(p)
            tied = per_criterion[c][1].get(p, [])
            mark = ""
            if not m.measured:
                mark = f" (not measured here: {how_to_measure(c)})"
            elif tied:
                names = ", ".join(DISPLAY_NAMES.get(q, q) for q in tied)
                mark = f" (not ranked against {names}: within noise or too few runs)"
            elif m.published:
                mark = " (ranked on the printed means: spread not published)"
            reasons[c] = f"#{place}: {m.shown}{mark}" if place is not None else f"{m.shown}{mark}"
        if p not in field:
            placed.append(Placed(p, None, {c: None for c in criteria}, reasons))
            continue
        others = [q for q in field if q != p]
        if weights is None:
            ahead = sum(bool(_ahead(comparison.measures, criteria, q, p)) for q in others)
            unranked = tuple(q for q in others if _ahead(comparison.measures, criteria, q, p) is None
                             and _ahead(comparison.measures, criteria, p, q) is None)
        else:
            def total(x: str) -> float:
                return sum(weights[c] * (per_criterion[c][0][x] or 0) for c in criteria)
            unknown = {c for c in criteria if _unknown_among(comparison.measures, c, field)}
            ahead = sum(total(q) < total(p) for q in others) if not unknown else 0
            unranked = tuple(others) if unknown else ()
        placed.append(Placed(p, 1 + ahead, {c: per_criterion[c][0][p] for c in criteria}, reasons, unranked))
    order = {p: i for i, p in enumerate(comparison.platforms)}
    return sorted(placed, key=lambda x: (x.rank is None, x.rank or 0, order[x.platform]))


def _names(platforms: Sequence[str]) -> str:
    return " and ".join(DISPLAY_NAMES.get(p, p) for p in platforms)


def decision_text(decision: Decision, measures: Measures) -> str:
    """'X' / 'X and Y share first place: ...' / 'not decidable yet: ...'."""
    if len(decision.chosen) == 1:
        return _names(decision.chosen)
    if decision.chosen:
        return (f"{_names(decision.chosen)} share first place: the data do not separate them on any "
                "criterion asked")
    if decision.blocked is None:
        return "not decidable yet: no platform has run here"
    criterion = decision.blocked
    missing = [p for p in decision.unknown if not measures[criterion][p].measured]
    why = (f"{criterion} is not measured for {_names(missing)}" if missing
           else f"{criterion} rests on too few runs to order {_names(decision.unknown)}")
    return f"not decidable yet: {why} ({how_to_measure(criterion)})"


def recommendation_table(comparison: Comparison, priorities: Priorities) -> Table:
    placed = rank(comparison, priorities)
    decision = decide(comparison.measures, priorities, comparison.ranked_field)
    found = decision_text(decision, comparison.measures)
    summary = (f"Recommended for {priorities.described}: {found}" if len(decision.chosen) == 1
               else f"For {priorities.described}: {found}")
    how = (
        "Ordered priorities: the first criterion decides, each next one only breaks the ties left; where a "
        "criterion cannot order the platforms still in (not measured, or too few runs), the decision stops."
        if priorities.weights is None
        else "Weights: the sum of weight × place on each criterion decides, smaller first; only when every "
        "criterion weighed orders every platform that ran."
    )
    rows = []
    for x in placed:
        shown_rank = "not ranked (no run here)" if x.rank is None else str(x.rank)
        if x.unranked_against:
            shown_rank += f"; not ranked against {_names(x.unranked_against)}"
        rows.append([text(shown_rank), text(DISPLAY_NAMES.get(x.platform, x.platform)),
                     *(text(x.reasons[c]) for c in priorities.criteria)])
    composites = "; ".join(f"{name} = {', '.join(parts)}" for name, parts in COMPOSITES.items())
    return Table(
        "B.11",
        "table-b.11-recommendation",
        f"Recommendation for the priorities {priorities.described} (beyond the study)",
        ["Rank", "Platform", *priorities.criteria],
        rows,
        [
            summary + ".",
            how,
            "A place (#) on a criterion is 1 + the platforms ahead of it with "
            f"support: on a measured time, {MIN_RUNS_FOR_SPREAD} or more runs each and min-max "
            "intervals apart; counts and yes/no always order; a platform not measured on it gets no place. "
            f"{composites}. Criteria: " + "; ".join(f"{c}: {w}" for c, w in CRITERIA.items()) + ".",
        ],
    )


def check_study_conclusion(comparison: Comparison) -> list[str]:
    """Each of the study's conclusions (5.6, 5.7) against the decision its priorities give here."""
    lines = []
    for conclusion in study_qualitative()["conclusions"]:
        priorities = Priorities(tuple(conclusion["priorities"]))
        decision = decide(comparison.measures, priorities, comparison.ranked_field)
        claim = (
            f"Study (section {conclusion['section']}): {DISPLAY_NAMES[conclusion['platform']]} for "
            f"{conclusion['for']} (priorities: {priorities.described})"
        )
        if decision.chosen == (conclusion["platform"],):
            lines.append(f"{claim}: reproduced.")
        elif decision.chosen:
            lines.append(f"{claim}: differs, computed first: {_names(decision.chosen)}.")
        else:
            lines.append(f"{claim}: differs, {decision_text(decision, comparison.measures)}.")
    return lines


def with_recommendation(comparison: Comparison, priorities: Priorities | None) -> Comparison:
    if priorities is not None:
        comparison.recommendation = recommendation_table(comparison, priorities)
    return comparison


__all__ = ["COMPOSITES", "KNOWN", "LOWER_FIRST", "MEASURED_BY", "Decision", "Placed", "Priorities", "Step",
           "better", "compare", "decide", "decision_text", "expand", "how_to_measure",
           "order_from", "parse_priorities", "rank", "recommendation_table", "tiers", "weights_from",
           "with_recommendation"]
