"""dtlab.search (issue #54, scenario C): one search space and budget, the same trials for every way, bad input
refused in one line before any trial starts, and dtlab's own ASHA rule deciding as Ray Tune's does."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import yaml

from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.search import parse_search
from trainer.config import ConfigError
from trainer.search import Asha, SearchPlan

# The smoke profile's trainer options, as a search profile would start from them
MATRIX = yaml.safe_load((paths.REPO_ROOT / "experiments/matrix.yml").read_text())
SMOKE_TRAINER = MATRIX["profiles"]["smoke"]["trainer"]

WHERE = "experiments/matrix.yml: profile tune"
SEARCH = {"space": {"learning_rate": {"loguniform": [1.0e-4, 3.0e-3]}, "warmup_steps": {"choice": [0, 4, 16]},
                    "weight_decay": {"uniform": [0.0, 0.1]}},
          "trials": 8, "budget_epochs": 4, "grace_epochs": 1, "reduction_factor": 2, "seed": 3}


def test_every_way_gets_the_same_trials_drawn_once_from_the_seed_within_the_space():
    spec = parse_search(SEARCH, SMOKE_TRAINER, WHERE)
    trials = spec.trial_options()
    assert trials == parse_search(SEARCH, SMOKE_TRAINER, WHERE).trial_options()  # the same every time
    assert len(trials) == 8 and len({tuple(sorted(t.items())) for t in trials}) == 8
    for trial in trials:
        assert 1.0e-4 <= trial["learning_rate"] <= 3.0e-3 and trial["warmup_steps"] in (0, 4, 16)
        assert 0.0 <= trial["weight_decay"] <= 0.1
    # loguniform: the draws spread over the decades, not bunched at the top as a uniform's would be
    assert min(t["learning_rate"] for t in trials) < 1.0e-3
    assert parse_search({**SEARCH, "seed": 4}, SMOKE_TRAINER, WHERE).trial_options() != trials
    assert spec.rungs() == [1, 2, 4]


@pytest.mark.parametrize(("change", "said"), [
    ({"space": {"learning_rate": {"choice": [1.0e-3, -0.1]}}},
     "space: learning_rate -0.1 would be refused by the trainer: learning_rate: must be > 0"),
    ({"budget_epochs": 0}, "budget_epochs must be a whole number of epochs, at least 1, got 0"),
    ({"budget_epochs": 0.5}, "budget_epochs must be a whole number of epochs, at least 1, got 0.5"),
    ({"space": {"learning_rate": {"uniform": [1.0e-3, 1.0e-4]}}},
     "space: learning_rate: uniform [0.001, 0.0001] is empty or upside down (low must be below high)"),
    ({"space": {"learning_rate": {"loguniform": [0, 1.0e-3]}}},
     "space: learning_rate: loguniform needs low > 0"),
    ({"space": {"epochs": {"choice": [1, 2]}}}, "space: epochs is the search's or the harness's own"),
    ({"space": {"learning_rate": {"normal": [0, 1]}}}, "space: learning_rate must be one of {choice: [...]}"),
    ({"trails": 8}, "unknown key trails; the keys are space, trials, budget_epochs"),
    ({"grace_epochs": 5}, "grace_epochs 5 is over budget_epochs 4"),
    ({"reduction_factor": 1}, "reduction_factor must be a whole number >= 2, got 1"),
])
def test_a_search_the_trainer_or_the_budget_cannot_run_is_refused_in_one_line(change, said):
    with pytest.raises(DtlabError) as refused:
        parse_search({**SEARCH, **change}, SMOKE_TRAINER, WHERE)
    message = str(refused.value)
    assert message.startswith(f"{WHERE}: search: {said}"), message
    assert "\n" not in message


def test_a_drawn_trial_the_trainer_refuses_is_named_with_its_values():
    """Each value alone is the trainer's, the two together are not."""
    space = {"grad_compression": {"choice": ["fp16"]}, "sparse_embedding_sync": {"choice": [True]}}
    with pytest.raises(DtlabError) as refused:
        parse_search({**SEARCH, "space": space}, SMOKE_TRAINER, WHERE)
    assert str(refused.value) == (
        f"{WHERE}: search: trial 1 (grad_compression 'fp16', sparse_embedding_sync True) would be refused by "
        "the trainer: grad_compression: not measured or tested together with sparse_embedding_sync (which "
        "all-reduces the word embeddings' rows itself); set one of them off")


class _Trial:
    def __init__(self, trial_id: str):
        self.trial_id = trial_id


@pytest.mark.parametrize("seed", range(20))
def test_dtlabs_asha_decides_every_report_as_ray_tunes_asha_bracket(seed):
    """Trials report their epochs interleaved in a random order, as asynchronous workers would; each report
    gets the same answer from dtlab's rule and from Ray's own bracket (ray.tune's ASHA), until it stops."""
    from ray.tune.schedulers.async_hyperband import _Bracket

    rng = random.Random(seed)
    grace, budget, factor = rng.choice([(1, 4, 2), (1, 9, 3), (2, 8, 2), (1, 16, 2)])
    budgets = {"budget_epochs": budget, "grace_epochs": grace, "reduction_factor": factor}
    spec = parse_search({**SEARCH, **budgets}, SMOKE_TRAINER, WHERE)
    ours = Asha(spec.rungs(), factor)
    theirs = _Bracket(min_t=grace, max_t=budget, reduction_factor=factor, s=0)
    quality = {f"t{n}": rng.random() for n in range(rng.randint(4, 12))}
    epoch = dict.fromkeys(quality, 0)
    running = list(quality)
    decisions = 0
    while running:
        trial = rng.choice(running)
        epoch[trial] += 1
        metric = quality[trial] * (1 - math.exp(-epoch[trial])) + rng.gauss(0, 0.02)
        decided = ours.report(trial, epoch[trial], metric)
        assert decided == theirs.on_result(_Trial(trial), epoch[trial], metric).lower(), (trial, epoch[trial])
        decisions += 1
        if decided == "stop" or epoch[trial] == budget:
            running.remove(trial)
    assert decisions >= len(quality)


def test_the_plan_every_way_reads_holds_the_drawn_trials_and_the_budget(tmp_path):
    spec = parse_search(SEARCH, SMOKE_TRAINER, WHERE)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(spec.plan("none")))
    plan = SearchPlan.load(path)
    assert list(plan.trials) == spec.trial_options() and plan.rungs() == spec.rungs() == [1, 2, 4]
    assert plan.asha() is None and SearchPlan.load(_written(tmp_path, spec.plan())).asha() is not None
    with pytest.raises(DtlabError, match="early stopping 'median'"):
        spec.plan("median")


PLAN = {"trials": [{"learning_rate": 1e-3}], "budget_epochs": 2, "grace_epochs": 1, "reduction_factor": 2}


@pytest.mark.parametrize(("plan", "said"), [
    ({**PLAN, "trials": [{"epochs": 3}]}, "a trial sets epochs, the plan's or launcher's own"),
    ({**PLAN, "trials": []}, "needs one or more trials"),
    ({**PLAN, "early_stopping": "hyperband"}, "early_stopping in asha, none"),
    ({**PLAN, "grace_epochs": 3}, "needs 1 <= grace_epochs <= budget_epochs"),
    ({**PLAN, "reduction_factor": 1}, "reduction_factor >= 2"),
    ({"trials": [{}]}, "not a search plan (KeyError"),
    ("not json", "not a search plan (JSONDecodeError"),
])
def test_a_plan_no_launcher_could_run_is_refused_in_one_line_naming_the_file(tmp_path, plan, said):
    path = _written(tmp_path, plan)
    with pytest.raises(ConfigError) as refused:
        SearchPlan.load(path)
    assert str(refused.value).startswith(f"{path}: ") and said in str(refused.value)
    assert "\n" not in str(refused.value)


def _written(tmp_path, plan) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(plan if isinstance(plan, str) else json.dumps(plan))
    return path
