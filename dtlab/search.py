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

`SearchSpec.plan` is what every way's launcher reads (trainer/search.py: the trials, the budget, ASHA's
rungs); trainer.search.Asha is the early-stopping rule dtlab's own sweep applies.
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
from trainer.search import EARLY_STOPPING, NOT_SEARCHED, rung_epochs

KINDS = ("choice", "uniform", "loguniform")
KEYS = ("space", "trials", "budget_epochs", "grace_epochs", "reduction_factor", "seed")


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
        return rung_epochs(self.grace_epochs, self.budget_epochs, self.reduction_factor)

    def plan(self, early_stopping: str = "asha") -> dict[str, Any]:
        """The search plan every way's launcher reads (trainer.search.SearchPlan), as JSON data."""
        if early_stopping not in EARLY_STOPPING:
            raise DtlabError(f"early stopping {early_stopping!r}: one of {', '.join(EARLY_STOPPING)}")
        return {"trials": self.trial_options(), "budget_epochs": self.budget_epochs,
                "grace_epochs": self.grace_epochs, "reduction_factor": self.reduction_factor,
                "early_stopping": early_stopping, "seed": self.seed,
                "space": {one.name: {one.kind: list(one.values)} for one in self.space}}

    @classmethod
    def from_plan(cls, plan: Mapping[str, Any]) -> SearchSpec:
        """The spec a plan was drawn from (its space, trial count, budget, rungs and seed), for a platform
        that draws its own trials from the space (Determined's searcher)."""
        space = tuple(Dimension(name, kind, tuple(values))
                      for name, spec in plan["space"].items() for kind, values in spec.items())
        return cls(space, len(plan["trials"]), plan["budget_epochs"], plan["grace_epochs"],
                   plan["reduction_factor"], plan["seed"])


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

