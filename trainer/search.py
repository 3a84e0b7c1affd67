"""A hyperparameter search's trials as the launchers run them (issue #54, scenario C), and what they record.

The harness (dtlab/search.py) draws the trials once and writes them as a search plan (JSON); every way that
runs a search reads that plan, so Ray Tune, dtlab's sequential sweep and Determined's searcher train the same
configurations:

    {"trials": [{"learning_rate": 0.001, "warmup_steps": 4}, ...], "budget_epochs": 4, "grace_epochs": 1,
     "reduction_factor": 2, "early_stopping": "asha"}

`Asha` is asynchronous successive halving as Ray Tune's ASHAScheduler decides it (one bracket; a trial
reaching a rung stops when its metric is below the rung's (1 - 1/rf) percentile of the metrics recorded
there so far), tested decision for decision against Ray's (tests/harness/test_search.py). The sweep applies
it itself, so the sweep with the rule shows what a platform's scheduler adds beyond the rule.

Each way writes search.json (SEARCH_FILE_NAME): per trial its options, each epoch's validation accuracy and
wall-clock time, whether it stopped early or failed; the best trial; the wall time to the best and to the
end; and the cluster's busy fraction (trial-seconds x workers per trial over slots x the search's seconds).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from trainer.config import ConfigError, TrainConfig
from trainer.options import from_dict
from trainer.result import write_json_atomically

EARLY_STOPPING = ("asha", "none")
METRIC = "val_accuracy"  # higher is better; every way ranks and stops trials on it
SEARCH_FILE_NAME = "search.json"
# What a trial's options may not set: the plan owns the epochs, the launcher each trial's directories.
NOT_SEARCHED = ("epochs", "seed", "output_dir", "checkpoint_dir", "cache_dir", "framework")


def rung_epochs(grace: int, budget: int, factor: int) -> list[int]:
    """ASHA's milestones in epochs, grace x rf^k up to the budget: Ray's ASHAScheduler makes
    int(log(max_t / grace) / log(rf) + 1) rungs (one bracket)."""
    count = int(math.log(budget / grace) / math.log(factor) + 1)
    return [grace * factor ** k for k in range(count)]


class Asha:
    """Asynchronous successive halving over one search, decided as trials report their epochs (higher metric
    is better). `report` answers "continue" or "stop" for a trial's metric after an epoch."""

    def __init__(self, rungs: list[int], factor: int):
        self.factor = factor
        self.recorded: dict[int, dict[Any, float]] = {rung: {} for rung in rungs}

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


@dataclasses.dataclass(frozen=True)
class SearchPlan:
    trials: tuple[dict[str, Any], ...]
    budget_epochs: int
    grace_epochs: int
    reduction_factor: int
    early_stopping: str

    @classmethod
    def load(cls, path: str | Path) -> SearchPlan:
        """The plan the harness wrote; ConfigError in one line for a file that is not one."""
        try:
            raw = json.loads(Path(path).read_text())
            plan = cls(tuple(raw["trials"]), raw["budget_epochs"], raw["grace_epochs"],
                       raw["reduction_factor"], raw.get("early_stopping", "asha"))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ConfigError(f"{path}: not a search plan ({type(error).__name__}: {error})") \
                from None
        if not plan.trials or plan.early_stopping not in EARLY_STOPPING:
            raise ConfigError(f"{path}: needs one or more trials and early_stopping in "
                              f"{', '.join(EARLY_STOPPING)}")
        if not 1 <= plan.grace_epochs <= plan.budget_epochs or plan.reduction_factor < 2:
            raise ConfigError(f"{path}: needs 1 <= grace_epochs <= budget_epochs and "
                              "reduction_factor >= 2")
        for options in plan.trials:
            owned = sorted(set(options) & set(NOT_SEARCHED))
            if owned:
                raise ConfigError(f"{path}: a trial sets {owned[0]}, the plan's or launcher's own")
        return plan

    def rungs(self) -> list[int]:
        return rung_epochs(self.grace_epochs, self.budget_epochs, self.reduction_factor)

    def asha(self) -> Asha | None:
        return Asha(self.rungs(), self.reduction_factor) if self.early_stopping == "asha" else None

    def trial_config(self, base: TrainConfig, number: int, output_root: str | Path) -> TrainConfig:
        """Trial `number` (0-based): the base options with the trial's, trained for the budget, no
        checkpoints, its output in output_root/trial-NN; the tokens' cache is the base's, shared by all."""
        cache_dir = base.cache_dir or str(Path(base.output_dir).absolute().parent / "token-cache")
        return from_dict({**base.as_dict(), **self.trials[number], "epochs": self.budget_epochs,
                          "output_dir": str(Path(output_root, f"trial-{number:02d}")), "checkpoint_dir": None,
                          "cache_dir": cache_dir})


def trial_record(number: int, options: dict, started: float, epochs: list[dict], budget: int,
                 error: str | None = None) -> dict:
    """One trial: `epochs` holds {epoch, val_accuracy, ended} per finished epoch, in order."""
    ended = epochs[-1]["ended"] if epochs else started
    return {"number": number, "options": options, "started": started, "ended": ended, "epochs": epochs,
            "stopped_early": error is None and len(epochs) < budget, "error": error}


def search_result(way: str, label: str, plan: SearchPlan, trials: list[dict], started: float,
                  ended: float, slots: int, workers_per_trial: int) -> dict:
    """search.json's content: the trials, the best (highest last METRIC; the lower number on a tie), the
    times to it and to the end, and how busy the cluster's slots were."""
    finished = [trial for trial in trials if trial["epochs"]]
    best = max(finished, key=lambda trial: (trial["epochs"][-1][METRIC], -trial["number"]), default=None)
    busy = sum(trial["ended"] - trial["started"] for trial in trials) * workers_per_trial
    return {
        "way": way, "label": label, "metric": METRIC, "early_stopping": plan.early_stopping,
        "budget_epochs": plan.budget_epochs, "rungs": plan.rungs(), "slots": slots,
        "workers_per_trial": workers_per_trial, "started": started, "ended": ended, "wall_s": ended - started,
        "trials": sorted(trials, key=lambda trial: trial["number"]),
        "counts": {"started": len(trials), "stopped_early": sum(t["stopped_early"] for t in trials),
                   "failed": sum(t["error"] is not None for t in trials)},
        "best": None if best is None else {
            "number": best["number"], "options": best["options"], METRIC: best["epochs"][-1][METRIC],
            "epochs": len(best["epochs"]), "reached_s": best["ended"] - started},
        "busy_fraction": busy / (slots * (ended - started)) if ended > started else 0.0,
    }


def write_search_result(result: dict, output_dir: str | Path) -> Path:
    """Written atomically, so a reader never sees half a search."""
    return write_json_atomically(result, Path(output_dir) / SEARCH_FILE_NAME)



def trial_line(trial: dict, total: int) -> str:
    """One line per finished trial, for the run's log."""
    shown = ", ".join(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
                      for name, value in trial["options"].items())
    if trial["error"] is not None:
        return f"[search] trial {trial['number'] + 1}/{total} ({shown}) failed: {trial['error']}"
    last = trial["epochs"][-1] if trial["epochs"] else None
    ended = f"stopped early after epoch {last['epoch']}" if trial["stopped_early"] else "trained every epoch"
    accuracy = f", {METRIC} {last[METRIC]:.4f}" if last else ""
    return f"[search] trial {trial['number'] + 1}/{total} ({shown}): {ended}{accuracy}"
