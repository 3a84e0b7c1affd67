"""Scenario C's hyperparameter search (issue #54): one search space and one budget, declared once, and the
same trials for every way that runs them (Ray Tune, Determined's searcher, dtlab's plain sequential sweep).

A search section reads:

    search:
      space:                                  # trainer options, each a choice or a range
        learning_rate: {loguniform: [1.0e-4, 3.0e-3]}
        warmup_steps: {choice: [0, 4, 16]}
      trials: 8                               # configurations drawn, the same for every way
      budget_epochs: 4                        # the most epochs one trial trains
      grace_epochs: 1                         # ASHA's first rung: no trial stops before it
      reduction_factor: 2                     # ASHA keeps the top 1/rf at each rung
      seed: 0                                 # draws the trials

Everything a trial would be refused for is refused here, in one line, before any trial starts: a value the
trainer refuses (a negative learning rate), a budget under one epoch, a range upside down.

`Asha` is the early-stopping rule dtlab applies itself to the sequential sweep, so the sweep with the rule
shows what a platform's scheduler adds beyond it: asynchronous successive halving as Ray Tune's
ASHAScheduler decides it (one bracket; a trial reaching a rung stops when its metric is below the rung's
(1 - 1/rf) percentile of the metrics recorded there so far), tested decision for decision against Ray's.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from typing import Any

from dtlab.errors import DtlabError
from trainer.config import ConfigError
from trainer.options import from_dict

KINDS = ("choice", "uniform", "loguniform")
KEYS = ("space", "trials", "budget_epochs", "grace_epochs", "reduction_factor", "seed")
# What a trial's options may not set: the search owns its epochs (budget_epochs), the harness the rest.
NOT_SEARCHED = ("epochs", "seed", "output_dir", "checkpoint_dir", "cache_dir", "framework")


@dataclasses.dataclass(frozen=True)
class Dimension:
    name: str
    kind: str
    values: tuple

    def draw(self, rng: random.Random):
        if self.kind == "choice":
            return self.values[rng.randrange(len(self.values))]
        low, high = self.values
        if self.kind == "uniform":
            return rng.uniform(low, high)
        return math.exp(rng.uniform(math.log(low), math.log(high)))


@dataclasses.dataclass(frozen=True)
class SearchSpec:
    space: tuple[Dimension, ...]
    trials: int
    budget_epochs: int
    grace_epochs: int
    reduction_factor: int
    seed: int

    def trial_options(self) -> list[dict[str, Any]]:
        """The trials' options, drawn once from `seed`: every way runs these, in this order."""
        rng = random.Random(self.seed)
        return [{dimension.name: dimension.draw(rng) for dimension in self.space} for _ in range(self.trials)]

    def rungs(self) -> list[int]:
        """ASHA's milestones in epochs: grace x rf^k up to the budget."""
        return [self.grace_epochs * self.reduction_factor ** k
                for k in range(_rung_count(self.grace_epochs, self.budget_epochs, self.reduction_factor))]


def parse_search(raw: Any, trainer: Mapping[str, Any], where: str) -> SearchSpec:
    """A profile's `search:` section, checked against the profile's `trainer:` options; DtlabError names the
    first problem in one line, prefixed with `where` (e.g. "experiments/matrix.yml: profile tune")."""
    def refuse(message: str) -> DtlabError:
        return DtlabError(f"{where}: search: {message}")

    if not isinstance(raw, Mapping):
        raise refuse("must be a mapping with space, trials and budget_epochs")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise refuse(f"unknown key {unknown[0]}; the keys are {', '.join(KEYS)}")
    trials, budget = _whole(raw.get("trials"), "trials", refuse), raw.get("budget_epochs")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise refuse(f"budget_epochs must be a whole number of epochs, at least 1, got {budget!r}: a trial "
                     "trains whole epochs, and ASHA's rungs are epochs")
    grace = _whole(raw.get("grace_epochs", 1), "grace_epochs", refuse)
    if grace > budget:
        raise refuse(f"grace_epochs {grace} is over budget_epochs {budget}")
    factor = raw.get("reduction_factor", 2)
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 2:
        raise refuse(f"reduction_factor must be a whole number >= 2, got {factor!r}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise refuse(f"seed must be a whole number, got {seed!r}")
    space = raw.get("space")
    if not isinstance(space, Mapping) or not space:
        raise refuse("space must map one or more trainer options to {choice: [...]}, {uniform: [low, high]} "
                     "or {loguniform: [low, high]}")
    spec = SearchSpec(tuple(_dimension(name, spec, refuse) for name, spec in space.items()), trials, budget,
                      grace, factor, seed)
    for dimension in spec.space:  # a choice's every value and a range's bounds, drawn or not
        for value in dimension.values:
            try:
                from_dict({**trainer, dimension.name: value, "epochs": budget}, local=False)
            except ConfigError as error:
                raise refuse(f"space: {dimension.name} {value!r} would be refused by the trainer: "
                             f"{error}") from None
    for number, options in enumerate(spec.trial_options(), 1):
        try:
            from_dict({**trainer, **options, "epochs": budget}, local=False)
        except ConfigError as error:
            shown = ", ".join(f"{name} {value!r}" for name, value in options.items())
            raise refuse(f"trial {number} ({shown}) would be refused by the trainer: {error}") from None
    return spec


def _whole(value: Any, key: str, refuse) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise refuse(f"{key} must be a whole number >= 1, got {value!r}")
    return value


def _dimension(name: str, spec: Any, refuse) -> Dimension:
    if name in NOT_SEARCHED:
        raise refuse(f"space: {name} is the search's or the harness's own, not a searched option")
    if not isinstance(spec, Mapping) or len(spec) != 1 or next(iter(spec)) not in KINDS:
        raise refuse(f"space: {name} must be one of {{choice: [...]}}, {{uniform: [low, high]}} or "
                     f"{{loguniform: [low, high]}}, got {spec!r}")
    kind, values = next(iter(spec.items()))
    if not isinstance(values, list) or not values:
        raise refuse(f"space: {name}: {kind} needs a non-empty list, got {values!r}")
    if kind == "choice":
        return Dimension(name, kind, tuple(values))
    if len(values) != 2 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise refuse(f"space: {name}: {kind} needs [low, high], two numbers, got {values!r}")
    low, high = values
    if not low < high:
        raise refuse(f"space: {name}: {kind} [{low}, {high}] is empty or upside down "
                     "(low must be below high)")
    if kind == "loguniform" and low <= 0:
        raise refuse(f"space: {name}: loguniform needs low > 0, got {low}")
    return Dimension(name, kind, (float(low), float(high)))


def _rung_count(grace: int, budget: int, factor: int) -> int:
    # Ray's ASHAScheduler: int(log(max_t / grace) / log(rf) + 1) rungs (one bracket).
    return int(math.log(budget / grace) / math.log(factor) + 1)


class Asha:
    """Asynchronous successive halving over one search, decided as trials report their epochs (higher metric
    is better). `report` answers "continue" or "stop" for a trial's metric after an epoch."""

    def __init__(self, spec: SearchSpec):
        self.factor = spec.reduction_factor
        self.recorded: dict[int, dict[Any, float]] = {rung: {} for rung in spec.rungs()}

    def report(self, trial: Any, epoch: int, metric: float) -> str:
        # The highest rung this epoch reaches and the trial has not been judged at yet, as Ray's bracket.
        for rung in sorted(self.recorded, reverse=True):
            recorded = self.recorded[rung]
            if epoch < rung or trial in recorded:
                continue
            cutoff = _percentile(list(recorded.values()), (1 - 1 / self.factor) * 100) if recorded else None
            recorded[trial] = metric
            return "stop" if cutoff is not None and metric < cutoff else "continue"
        return "continue"


def _percentile(values: list[float], percent: float) -> float:
    """numpy's default (linear) percentile, which Ray's cutoff uses."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * percent / 100
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)
