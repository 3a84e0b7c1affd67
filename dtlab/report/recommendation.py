"""Table B.11: the platforms ranked on the criteria the user puts first (`bench.report --priorities`),
a place given only where the data support it; and the study's conclusions checked against that ranking."""

from __future__ import annotations

import math
from collections.abc import Mapping
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


LOWER_FIRST = {
    "speed": True,
    "startup": True,
    "recovery": True,
    "reproducibility": False,
    "adoption": True,
    "footprint": True,
    "operations": False,
    "pipelines": False,
}


# --- priorities and the recommendation -------------------------------------------------------------


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


def _unknown(name: str, where: str) -> DtlabError:
    return DtlabError(
        f"bench.report: --priorities {where}: unknown criterion {name!r}; known: {', '.join(CRITERIA)}"
    )


def parse_priorities(spec: str) -> Priorities:
    """`speed,recovery,operations` (ordered) or a YAML file of {criterion: weight > 0}; one-line errors."""
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
        if not isinstance(data, dict) or not data:
            raise DtlabError(
                f"bench.report: --priorities {spec}: must map criteria to weights, e.g. 'speed: 3'"
            )
        weights = {}
        for name, weight in data.items():
            if name not in CRITERIA:
                raise _unknown(str(name), spec)
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
                raise DtlabError(
                    f"bench.report: --priorities {spec}: {name}: weight must be a number > 0, got {weight!r}"
                )
            weights[name] = float(weight)
        order = tuple(sorted(weights, key=lambda c: -weights[c]))
        return Priorities(order, weights)
    names = [name.strip() for name in spec.split(",")]
    if not spec or any(not name for name in names):
        raise DtlabError(
            f"bench.report: --priorities {spec!r}: give criteria separated by commas, "
            f"e.g. speed,recovery,operations"
        )
    for name in names:
        if name not in CRITERIA:
            raise _unknown(name, spec)
    if len(set(names)) != len(names):
        raise DtlabError(f"bench.report: --priorities {spec}: a criterion is named twice")
    return Priorities(tuple(names))


@dataclass(frozen=True)
class Placed:
    platform: str
    rank: int
    tiers: dict[str, int]  # criterion -> 1 + platforms ahead of it (the unmeasured after the measured)
    reasons: dict[str, str]  # criterion -> its figure and who it ties with


def tiers(measures: Mapping[str, Measure], criterion: str) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Per platform: 1 + the platforms ahead of it with support, and the platforms it cannot be told from
    although their figures differ (within noise / too few runs)."""
    lower = LOWER_FIRST[criterion]
    measured = [p for p, m in measures.items() if m.measured]
    found, ties = {}, {}
    for p, m in measures.items():
        if not m.measured:
            found[p] = len(measured) + 1
            ties[p] = []
            continue
        found[p] = 1 + sum(bool(better(measures[q], m, lower)) for q in measured if q != p)
        ties[p] = [
            q
            for q in measured
            if q != p
            and measures[q].value != m.value
            and not better(measures[q], m, lower)
            and not better(m, measures[q], lower)
        ]
    return found, ties


def rank(comparison: Comparison, priorities: Priorities) -> list[Placed]:
    """The platforms in order: lexicographic over the places on the ordered criteria, or the weighted sum
    of the places; equal keys share a rank."""
    per_criterion = {c: tiers(comparison.measures[c], c) for c in priorities.order}
    keys: dict[str, tuple[float, ...]] = {}
    found: dict[str, dict[str, int]] = {}
    reasons: dict[str, dict[str, str]] = {}
    for p in comparison.platforms:
        found[p] = {c: per_criterion[c][0][p] for c in priorities.order}
        if priorities.weights is None:
            keys[p] = tuple(found[p][c] for c in priorities.order)
        else:
            keys[p] = (sum(priorities.weights[c] * found[p][c] for c in priorities.order),)
        reasons[p] = {}
        for c in priorities.order:
            m = comparison.measures[c][p]
            tied = per_criterion[c][1][p]
            mark = ""
            if not m.measured:
                mark = " (not measured: placed after the measured)" if found[p][c] > 1 else ""
            elif tied:
                names = ", ".join(DISPLAY_NAMES.get(q, q) for q in tied)
                mark = f" (not ranked against {names}: within noise or too few runs)"
            elif m.published:
                mark = " (ranked on the printed means: spread not published)"
            reasons[p][c] = f"#{found[p][c]}: {m.shown}{mark}"
    placed = [
        Placed(p, 1 + sum(keys[q] < keys[p] for q in keys), found[p], reasons[p])
        for p in comparison.platforms
    ]
    return sorted(placed, key=lambda x: (x.rank, comparison.platforms.index(x.platform)))


def recommendation_table(comparison: Comparison, priorities: Priorities) -> Table:
    placed = rank(comparison, priorities)
    first = [x.platform for x in placed if x.rank == 1]
    names = " and ".join(DISPLAY_NAMES.get(p, p) for p in first)
    summary = (
        f"Recommended for {priorities.described}: {names}"
        if len(first) == 1
        else f"For {priorities.described}, {names} share first place: the data do not separate them "
        "on any criterion asked"
    )
    how = (
        "Ordered priorities: the first criterion decides, each next one only breaks the ties left."
        if priorities.weights is None
        else "Weights: the sum of weight × place on each criterion decides, smaller first."
    )
    rows = [
        [
            text(str(x.rank)),
            text(DISPLAY_NAMES.get(x.platform, x.platform)),
            *(text(x.reasons[c]) for c in priorities.order),
        ]
        for x in placed
    ]
    return Table(
        "B.11",
        "table-b.11-recommendation",
        f"Recommendation for the priorities {priorities.described} (beyond the study)",
        ["Rank", "Platform", *priorities.order],
        rows,
        [
            summary + ".",
            how,
            "A place (#) on a criterion is 1 + the platforms ahead of it with "
            f"support: on a measured time, {MIN_RUNS_FOR_SPREAD} or more runs each and min-max "
            "intervals apart; counts and yes/no always order. Criteria: "
            + "; ".join(f"{c}: {w}" for c, w in CRITERIA.items())
            + ".",
        ],
    )


def check_study_conclusion(comparison: Comparison) -> list[str]:
    """Each of the study's conclusions (5.6, 5.7) against the ranking its priorities give here."""
    lines = []
    for conclusion in study_qualitative()["conclusions"]:
        priorities = Priorities(tuple(conclusion["priorities"]))
        placed = rank(comparison, priorities)
        first = [x.platform for x in placed if x.rank == 1]
        claim = (
            f"Study (section {conclusion['section']}): {DISPLAY_NAMES[conclusion['platform']]} for "
            f"{conclusion['for']} (priorities: {priorities.described})"
        )
        if first == [conclusion["platform"]]:
            lines.append(f"{claim}: reproduced.")
        else:
            computed = " and ".join(DISPLAY_NAMES.get(p, p) for p in first)
            lines.append(f"{claim}: differs, computed first: {computed}.")
    return lines


def with_recommendation(comparison: Comparison, priorities: Priorities | None) -> Comparison:
    if priorities is not None:
        comparison.recommendation = recommendation_table(comparison, priorities)
    return comparison
