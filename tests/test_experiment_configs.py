"""The Determined experiment configs under experiments/determined/: valid offline, the study's protocol,
1-slot and 2-slot variants, a startup hook that installs the dependencies, and clear errors."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
