"""The Determined experiment configs under experiments/determined/: valid offline, the study's protocol,
1-slot and 2-slot variants, a startup hook that installs the dependencies, and clear errors."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dtlab import search
from dtlab.errors import DtlabError
from dtlab.pins import pinned
from dtlab.platforms.determined import config as detconfig
from trainer.config import TrainConfig

CONFIGS = detconfig.experiment_configs()
STUDY_PROTOCOL = {  # chapter 4.2 of the study; TrainConfig's defaults are the one place they live
    name: getattr(TrainConfig(), name)
    for name in ("batch_size", "learning_rate", "weight_decay", "warmup_steps", "max_length")
}


def test_there_are_one_slot_and_two_slot_variants():
    slots = sorted(detconfig.load_experiment(path)["resources"]["slots_per_trial"] for path in CONFIGS)
    assert slots == [1, 2], [path.name for path in CONFIGS]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_config_is_valid_and_carries_the_study_protocol(path):
    config = detconfig.load_experiment(path)
    hyperparameters = config["hyperparameters"]
    assert {name: hyperparameters[name] for name in STUDY_PROTOCOL} == STUDY_PROTOCOL
    assert hyperparameters["model"] == "prajjwal1/bert-tiny"
    assert hyperparameters["dataset"] == "stanfordnlp/imdb"
    assert hyperparameters["epochs"] == 20
    assert config["searcher"] == {"name": "single", "metric": "val_accuracy", "smaller_is_better": False}
    assert config["entrypoint"].split()[:3] == ["python3", "-m", detconfig.LAUNCH_MODULE]


def _corrupt(tmp_path: Path, edit) -> Path:
    config = yaml.safe_load(CONFIGS[0].read_text())
    edit(config)
    path = tmp_path / "corrupt.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(("edit", "names"), [
    (lambda c: c["resources"].update(slots_per_trial="two"), "resources.slots_per_trial"),
    (lambda c: c["resources"].update(slots_per_trail=2), "slots_per_trail"),
    (lambda c: c.update(searcher_name="single"), "searcher_name"),
    (lambda c: c["searcher"].pop("metric"), "metric"),
    (lambda c: c["hyperparameters"].update(learning_rte=1e-4), "hyperparameters.learning_rte"),
    (lambda c: c["hyperparameters"].update(epochs=0), "hyperparameters.epochs"),
    (lambda c: c["hyperparameters"].update(batch_size="32x"), "hyperparameters.batch_size"),
    (lambda c: c["hyperparameters"].update(checkpoint_dir="/tmp/x"), "hyperparameters.checkpoint_dir"),
    (lambda c: c.update(entrypoint="python3 train.py"), "entrypoint"),
], ids=["wrong-type", "typo-nested", "typo-top", "missing", "unknown-hparam", "bad-epochs", "bad-batch",
        "path-hparam", "entrypoint"])
def test_corrupted_config_fails_with_one_line_naming_the_key(tmp_path, edit, names):
    path = _corrupt(tmp_path, edit)
    with pytest.raises(DtlabError) as caught:
        detconfig.load_experiment(path)
    message = str(caught.value)
    assert names in message and str(path) in message
    assert "\n" not in message


def test_unreadable_yaml_fails_with_one_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(DtlabError, match="not valid YAML"):
        detconfig.load_experiment(path)


def test_validation_creates_nothing_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    detconfig.load_experiment(CONFIGS[0])
    assert list(tmp_path.iterdir()) == []


def test_staged_context_has_the_hook_on_top_and_the_trainer_inside(tmp_path):
    context = detconfig.stage_context(tmp_path / "ctx")
    assert (context / "startup-hook.sh").read_text() == detconfig.STARTUP_HOOK.read_text()
    assert (context / "trainer" / "launchers" / "determined.py").is_file()
    assert not list(context.rglob("__pycache__"))
    requirements = (context / "requirements.txt").read_text()
    assert "torch" in requirements and "determined" in requirements
    staged_pins = (context / "constraints.txt").read_text()
    assert f"torch=={pinned('torch')}" in staged_pins and f"determined=={pinned('determined')}" in staged_pins


def test_startup_hook_installs_the_requirements_with_pip(tmp_path):
    """Source the hook as Determined does, with pip in dry-run against this venv (no index: no network)."""
    context = detconfig.stage_context(tmp_path / "ctx")
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=f"{venv_bin}:{os.environ['PATH']}", DTLAB_PIP_OPTIONS="--dry-run --no-index")
    hook = subprocess.run(["bash", "-c", "source ./startup-hook.sh && echo HOOK-DONE"], cwd=context, env=env,
                          capture_output=True, text=True, timeout=180)
    assert hook.returncode == 0, hook.stderr
    assert "HOOK-DONE" in hook.stdout

    broken = dict(env, DTLAB_PIP_OPTIONS="--dry-run --no-index --find-links /nonexistent")
    (context / "requirements.txt").write_text("dtlab-no-such-package==1.0\n")
    failed = subprocess.run(["bash", "-c", "source ./startup-hook.sh; echo NOT-REACHED"], cwd=context,
                            env=broken, capture_output=True, text=True, timeout=180)
    assert failed.returncode != 0 and "NOT-REACHED" not in failed.stdout
    assert "pip install failed" in failed.stderr


def test_startup_hook_installs_the_torch_build_the_trainer_role_chose(tmp_path):
    """DTLAB_TORCH_REQUIREMENTS (set by the harness, file mounted from the agent) joins the pip install;
    a missing file is refused in one line."""
    context = detconfig.stage_context(tmp_path / "ctx")
    venv_bin = str(Path(sys.executable).parent)
    torch_build = tmp_path / "torch-build.txt"
    torch_build.write_text("dtlab-no-such-torch-build==1.0\n")  # proves the file reaches pip
    env = dict(os.environ, PATH=f"{venv_bin}:{os.environ['PATH']}", DTLAB_PIP_OPTIONS="--dry-run --no-index",
               DTLAB_TORCH_REQUIREMENTS=str(torch_build))
    hook = subprocess.run(["bash", "-c", "source ./startup-hook.sh; echo NOT-REACHED"], cwd=context, env=env,
                          capture_output=True, text=True, timeout=180)
    assert hook.returncode != 0 and "dtlab-no-such-torch-build" in hook.stdout + hook.stderr

    missing = dict(env, DTLAB_TORCH_REQUIREMENTS=str(tmp_path / "absent.txt"))
    refused = subprocess.run(["bash", "-c", "source ./startup-hook.sh; echo NOT-REACHED"], cwd=context,
                             env=missing, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "NOT-REACHED" not in refused.stdout
    assert f"no torch build file {tmp_path / 'absent.txt'} on this agent" in refused.stderr


def test_launcher_hyperparameters_are_trainer_options():
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    for path in CONFIGS:
        assert set(yaml.safe_load(path.read_text())["hyperparameters"]) <= fields


# --- scenario C: the same search on Determined's own searcher (issue #54) ------------------------------

SEARCH = {"space": {"learning_rate": {"loguniform": [1.0e-4, 3.0e-3]},
                    "warmup_steps": {"choice": [0, 4, 16]}},
          "trials": 8, "budget_epochs": 4, "grace_epochs": 1, "reduction_factor": 2, "seed": 0}


def test_a_search_becomes_determined_adaptive_asha_over_the_same_space_budget_and_rungs():
    base = detconfig.load_experiment(CONFIGS[0])
    spec = search.parse_search(SEARCH, base["hyperparameters"], "test")
    searched = detconfig.searcher_experiment(base, spec, "test", concurrent_trials=1)
    assert searched["searcher"] == {
        "name": "adaptive_asha", "metric": "val_accuracy", "smaller_is_better": False, "max_trials": 8,
        "time_metric": "epochs", "max_time": 4, "mode": "aggressive", "divisor": 2, "max_rungs": 3,
        "max_concurrent_trials": 1}
    hyperparameters = searched["hyperparameters"]
    assert hyperparameters["epochs"] == 4 and hyperparameters["warmup_steps"] == {"type": "categorical",
                                                                                   "vals": [0, 4, 16]}
    rate = hyperparameters["learning_rate"]
    assert rate["type"] == "log" and rate["base"] ** rate["minval"] == pytest.approx(1.0e-4)
    assert rate["base"] ** rate["maxval"] == pytest.approx(3.0e-3)
    # Determined's rungs for its one bracket of n (async halving): max_time / divisor^(n-1-k); dtlab's own.
    asha = searched["searcher"]
    count = asha["max_rungs"]
    rungs = [asha["max_time"] / asha["divisor"] ** (count - 1 - k) for k in range(count)]
    assert rungs == spec.rungs() == [1, 2, 4]
    assert base["searcher"]["name"] == "single"  # the study's config is left as it was


@pytest.mark.parametrize(("edit", "names"), [
    (lambda c: c["hyperparameters"].update(learning_rate={"type": "double", "minval": -0.1, "maxval": 0.1}),
     "hyperparameters.learning_rate"),
    (lambda c: c["hyperparameters"].update(warmup_steps={"type": "categorical", "vals": [0, -4]}),
     "hyperparameters.warmup_steps"),
    (lambda c: c["searcher"].pop("max_time"), "searcher: 'max_time' is a required property"),
    (lambda c: c["searcher"].update(max_length={"epochs": 4}), "searcher.max_length: Determined 0.38's"),
], ids=["negative-rate-edge", "negative-warmup-choice", "asha-without-max-time", "asha-with-max-length"])
def test_a_search_the_trainer_or_determined_would_refuse_is_one_line_naming_the_key(edit, names):
    base = detconfig.load_experiment(CONFIGS[0])
    spec = search.parse_search(SEARCH, base["hyperparameters"], "t")
    searched = detconfig.searcher_experiment(base, spec, "t")
    edit(searched)
    with pytest.raises(DtlabError) as caught:
        detconfig.validate_experiment(searched, "search.yaml")
    message = str(caught.value)
    assert message.startswith("search.yaml: ") and names in message and "\n" not in message


def test_a_single_trial_experiment_takes_no_search_fields():
    base = detconfig.load_experiment(CONFIGS[0])
    with pytest.raises(DtlabError, match="searcher.max_trials: only searcher adaptive_asha takes it"):
        detconfig.validate_experiment({**base, "searcher": {**base["searcher"], "max_trials": 4}}, "one.yaml")
