"""The search launchers for real (issue #54): dtlab's sweep (one trial at a time, one process) with and
without its ASHA rule, and Ray Tune's ASHAScheduler on a loopback Ray cluster (two 1-CPU workers: two
trials at once), over the same plan. Every way trains the same trials to the same per-epoch numbers; each
stop is the one dtlab's rule makes for the reports in the order they came; a bad plan is one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import TINY, run, trainer_env, write_config
from trainer.config import TrainConfig
from trainer.launchers.sweep import PROG
from trainer.search import METRIC, SEARCH_FILE_NAME, Asha

pytestmark = pytest.mark.slow  # three searches of 2-3 trials (~4 min on 2 cores)

REPO = Path(__file__).resolve().parents[2]
# 1,024 reviews: enough for a good learning rate to leave chance after one epoch and a tiny one not to.
TRIALS = [{"learning_rate": 1e-3}, {"learning_rate": 1e-5}, {"learning_rate": 3e-4}]
PLAN = {"trials": TRIALS, "budget_epochs": 2, "grace_epochs": 1, "reduction_factor": 2}
SEARCH_TIMEOUT_S = 600


def search_files(tmp_path: Path, token_cache: Path, early_stopping: str, trials=TRIALS) -> tuple[Path, Path]:
    cfg = TrainConfig(**{**TINY, "generated_train_size": 1024, "output_dir": str(tmp_path / "out"),
                         "cache_dir": str(token_cache)}).validate()
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({**PLAN, "trials": trials, "early_stopping": early_stopping}))
    return write_config(cfg, tmp_path / "run.yml"), plan


def sweep(tmp_path: Path, token_cache: Path, early_stopping: str, trials=TRIALS) -> dict:
    config, plan = search_files(tmp_path, token_cache, early_stopping, trials)
    run([sys.executable, "-m", "trainer.launchers.sweep", "--config", str(config), "--search", str(plan)])
    return json.loads((tmp_path / "out" / SEARCH_FILE_NAME).read_text())


def accuracies(search: dict) -> dict[int, list[float]]:
    return {trial["number"]: [epoch[METRIC] for epoch in trial["epochs"]] for trial in search["trials"]}


def replayed_early_stops(search: dict) -> dict[int, int]:
    """dtlab's ASHA rule fed the search's reports in the order they ended: each trial the rule stops before
    the budget, and the epoch it stops after. A "stop" at the budget's own epoch ends nothing early (Ray's
    ASHA ends every trial there): when two trials share the slots, the one reporting second at the last rung
    is told so."""
    rule, stops = Asha(search["rungs"], PLAN["reduction_factor"]), {}
    reports = sorted((epoch["ended"], trial["number"], epoch["epoch"], epoch[METRIC])
                     for trial in search["trials"] for epoch in trial["epochs"])
    for _, number, epoch, metric in reports:
        if rule.report(number, epoch, metric) == "stop" and epoch < PLAN["budget_epochs"]:
            stops.setdefault(number, epoch)
    return stops


@pytest.fixture(scope="module")
def sweep_with_asha(tmp_path_factory, token_cache) -> dict:
    return sweep(tmp_path_factory.mktemp("sweep-asha"), token_cache, "asha")


def test_the_sweep_with_dtlabs_asha_stops_the_trial_the_rule_stops_and_keeps_the_best(sweep_with_asha):
    search = sweep_with_asha
    assert search["way"] == "sweep-asha"
    assert search["counts"] == {"started": 3, "stopped_early": 1, "failed": 0}
    stopped = [trial for trial in search["trials"] if trial["stopped_early"]]
    assert [trial["number"] for trial in stopped] == [1] and len(stopped[0]["epochs"]) == 1  # lr 1e-5
    assert replayed_early_stops(search) == {1: 1}
    best = max(search["trials"], key=lambda trial: trial["epochs"][-1][METRIC])
    assert search["best"]["number"] == best["number"] and search["best"]["epochs"] == 2
    assert search["best"][METRIC] > 0.8 and 0 < search["best"]["reached_s"] <= search["wall_s"]
    assert 0.5 < search["busy_fraction"] <= 1.0  # one slot, busy but for the launcher's own start


def test_the_sweep_without_early_stopping_trains_every_trial_to_the_same_numbers(tmp_path, token_cache,
                                                                                  sweep_with_asha):
    plain = sweep(tmp_path, token_cache, "none", trials=TRIALS[1:2])  # the trial ASHA stopped, alone
    assert plain["way"] == "sweep" and plain["counts"] == {"started": 1, "stopped_early": 0, "failed": 0}
    assert [len(trial["epochs"]) for trial in plain["trials"]] == [2]
    stopped = accuracies(sweep_with_asha)[1]
    assert len(stopped) == 1 and accuracies(plain)[0][:1] == stopped  # the same numbers while both ran


def test_ray_tune_runs_the_same_trials_to_the_same_numbers_and_stops_as_the_rule_does(
        tmp_path, token_cache, loopback_ray, sweep_with_asha):
    config, plan = search_files(tmp_path, token_cache, "asha")
    env = {**trainer_env(), **loopback_ray.env, "PYTHONPATH": str(REPO)}
    answer = subprocess.run([sys.executable, "-m", "trainer.launchers.ray_tune", "--config", str(config),
                             "--search", str(plan), "--address", loopback_ray.address],
                            env=env, capture_output=True, text=True, timeout=SEARCH_TIMEOUT_S)
    assert answer.returncode == 0, answer.stderr[-3000:]
    tuned = json.loads((tmp_path / "out" / SEARCH_FILE_NAME).read_text())
    assert tuned["way"] == "ray-tune" and tuned["slots"] == 2 and tuned["counts"]["started"] == 3
    assert tuned["counts"]["failed"] == 0
    swept = accuracies(sweep_with_asha)
    for number, epochs in accuracies(tuned).items():  # one process a trial both ways: the same numbers
        shared = min(len(epochs), len(swept[number]))
        assert epochs[:shared] == swept[number][:shared], number
    early = replayed_early_stops(tuned)  # Tune's stops are the rule's, for the order its reports came in
    for trial in tuned["trials"]:
        assert trial["stopped_early"] == (trial["number"] in early), trial
        assert len(trial["epochs"]) == early.get(trial["number"], PLAN["budget_epochs"]), trial
    assert tuned["best"]["number"] == sweep_with_asha["best"]["number"]  # the same best, whatever the order
    assert "[search] trial 3/3" in answer.stdout


def test_a_bad_plan_ends_the_sweep_with_one_line_before_any_trial(tmp_path, token_cache):
    """The launcher's way of saying it (each refusal: tests/harness/test_search.py)."""
    config, path = search_files(tmp_path, token_cache, "asha")
    path.write_text(json.dumps({**PLAN, "trials": [{"epochs": 3}]}))
    answer = run([sys.executable, "-m", "trainer.launchers.sweep", "--config", str(config), "--search",
                  str(path)], check=False)
    lines = answer.stderr.strip().splitlines()
    assert answer.returncode == 2 and len(lines) == 1, answer.stderr
    assert lines[0].startswith(f"{PROG}: error: argument --search: {path}: a trial sets epochs"), lines
    out = tmp_path / "out"  # the config's own check makes it; refused before any trial wrote in it
    assert not out.exists() or not any(out.iterdir())
