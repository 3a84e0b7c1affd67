"""Config: YAML + flags, and invalid values failing with one clear line before training starts."""

import subprocess
import sys

import pytest
import torch

from dtlab.paths import REPO_ROOT
from tests.trainer.conftest import TINY, trainer_env
from trainer.config import ConfigError, TrainConfig, config_hash
from trainer.core import auto_precision, train
from trainer.options import parse_args


@pytest.mark.parametrize(("overrides", "message"), [
    ({"epochs": 0}, "epochs: must be an integer >= 1, got 0"),
    ({"batch_size": 0}, "batch_size: must be an integer >= 1, got 0"),
    ({"model": "/nonexistent/bert-tiny"}, "model: local path /nonexistent/bert-tiny does not exist"),
    ({"dataset": "./no-such-imdb"}, "dataset: local path ./no-such-imdb does not exist"),
    ({"max_length": 4096}, "max_length: must be between 8 and 512"),
    ({"mixed_precision": "bf16"}, "mixed_precision: bf16 is CUDA-only"),
    ({"generated_train_size": 500_001}, "generated_train_size: must be between 2 and 500000"),
    ({"device": "tpu"}, "device: must be one of auto, cpu, cuda"),
    ({"compile": "max"}, "compile: must be one of no, default, reduce-overhead"),
    ({"compile": "reduce-overhead"}, "compile: reduce-overhead captures CUDA graphs and is CUDA-only"),
    ({"pad_to_multiple_of": 0}, "pad_to_multiple_of: must be an integer >= 1, got 0"),
    ({"dropout": 1.0}, "dropout: must be in [0, 1) or null (the model's own), got 1.0"),
    ({"learning_rate": 0.0}, "learning_rate: must be > 0, got 0.0"),
    ({"dataset": ""}, "dataset: is empty; give a hub id or a local path"),
    ({"model": "generated:bert-huge"}, "model: must be one of generated:bert-tiny, generated:bert-mini, "
                                       "generated:bert-small, generated:bert-medium; got 'generated:bert-hu"),
    ({"generated_median_words": 3}, "generated_median_words: must be an integer >= 4, got 3"),
    ({"framework": "MPI"},
     "framework: must be a platform's name (lowercase letters, digits, _), got 'MPI'"),
    # Built in code, not parsed: the schema checks the types too.
    ({"batch_size": "32"}, "batch_size: expected int, got '32'"),
    ({"group_by_length": "yes"}, "group_by_length: expected bool, got 'yes'"),
    ({"num_workers": 1.5}, "num_workers: expected int or null, got 1.5"),
])
def test_invalid_values_fail_with_one_line(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as error:
        TrainConfig(**{**TINY, "output_dir": str(tmp_path / "out"), **overrides}).validate()
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_unwritable_output_dir_fails(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match=r"output_dir: .*a-file/out is not writable"):
        TrainConfig(**{**TINY, "output_dir": str(blocker / "out")}).validate()


def test_more_workers_than_cpus_fails_before_the_process_group(make_config, monkeypatch):
    slots = len(__import__("os").sched_getaffinity(0))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(slots + 1))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(slots + 1))
    expected = rf"world size: {slots + 1} processes on this node but only {slots} CPUs"
    with pytest.raises(ConfigError, match=expected):
        train(make_config())
    assert not torch.distributed.is_initialized()


def test_yaml_then_flags(tmp_path):
    config_file = tmp_path / "run.yml"
    config_file.write_text("model: generated:bert-tiny\ndataset: generated\nepochs: 3\nbatch_size: 16\n"
                           f"output_dir: {tmp_path / 'out'}\ncheckpoint_dir: null\n")
    cfg = parse_args(["--config", str(config_file), "--epochs", "5", "--learning-rate", "1e-3",
                      "--group-by-length", "false"])
    assert (cfg.epochs, cfg.batch_size, cfg.learning_rate, cfg.group_by_length) == (5, 16, 1e-3, False)
    assert cfg.checkpoint_dir is None


@pytest.mark.parametrize("config_file", sorted((REPO_ROOT / "experiments" / "trainer").glob("*.yml")),
                         ids=lambda path: path.name)
def test_shipped_trainer_configs_are_valid(config_file, tmp_path):
    cfg = parse_args(["--config", str(config_file), "--output-dir", str(tmp_path / "out")])
    assert cfg.batch_size == 32 and cfg.weight_decay == 0.01  # the study's protocol


@pytest.mark.parametrize(("key", "hint"), [
    ("batch_sise", "did you mean batch_size?"),
    ("frobnicate", "`python -m trainer.launchers.torchrun --help` lists them"),
])
def test_unknown_yaml_key_names_the_key_and_the_closest_option(tmp_path, key, hint):
    config_file = tmp_path / "run.yml"
    config_file.write_text(f"epochs: 2\n{key}: 16\n")
    with pytest.raises(ConfigError) as error:
        parse_args(["--config", str(config_file)])
    assert str(error.value) == f"{config_file}: {key}: unknown trainer option; {hint}"


def test_bad_yaml_type_names_the_key(tmp_path):
    config_file = tmp_path / "run.yml"
    config_file.write_text("epochs: many\n")
    with pytest.raises(ConfigError, match=r"run.yml: epochs: expected int, got 'many'"):
        parse_args(["--config", str(config_file)])


def test_launcher_prints_one_line_and_exits_2(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "trainer.launchers.torchrun", "--model", "generated:bert-tiny",
         "--dataset", "generated", "--epochs", "0", "--output-dir", str(tmp_path / "out")],
        env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == ["trainer: error: epochs: must be an integer >= 1, got 0"]
    assert not (tmp_path / "out" / "result.json").exists()


@pytest.mark.parametrize(("launcher", "argv", "line"), [
    ("torchrun", ["--batch-sise", "16"], "trainer: error: --batch-sise: unknown flag; did you mean "
                                         "--batch-size?"),
    ("torchrun", ["--lerning-rate=0.1"], "trainer: error: --lerning-rate=0.1: unknown flag; did you mean "
                                         "--learning-rate?"),
    # No flag near it (difflib's ratio >= 0.6): --frobnicate was, until --microbatches came.
    ("torchrun", ["--xyzzy"], "trainer: error: --xyzzy: unknown flag; --help lists the valid ones"),
    ("torchrun", ["--epochs"], "trainer: error: argument --epochs: expected one argument (--help lists the "
                               "flags)"),
    ("spark", ["--num-procs", "2"], "python -m trainer.launchers.spark: error: --num-procs: unknown flag; "
                                    "did you mean --num-processes?"),
])
def test_a_mistyped_flag_is_one_line_with_the_closest_flag(launcher, argv, line):
    completed = subprocess.run([sys.executable, "-m", f"trainer.launchers.{launcher}", *argv],
                               env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [line], "one line, not argparse's whole usage"


def test_launcher_help_lists_every_option():
    completed = subprocess.run([sys.executable, "-m", "trainer.launchers.torchrun", "--help"],
                               env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0
    for flag in ("--config", "--batch-size", "--learning-rate", "--checkpoint-dir", "--mixed-precision",
                 "--threads", "--framework-label"):
        assert flag in completed.stdout


@pytest.mark.parametrize(("capability", "expected"), [
    ((6, 1), "no"),    # Pascal, the study's GTX 1060: fp16 arithmetic is a small fraction of fp32's rate
    ((7, 0), "fp16"),  # Volta: fp16 tensor cores, with a GradScaler
    ((7, 5), "fp16"),  # Turing
    ((8, 0), "bf16"),  # Ampere: native bf16
    ((9, 0), "bf16"),  # Hopper
])
def test_auto_precision_follows_the_gpus_native_formats(capability, expected):
    assert auto_precision(capability) == expected


def test_later_speed_options_keep_the_hash_of_runs_recorded_before_them(tmp_path):
    import hashlib
    import json

    # The options every recorded run's hash was made of; a new option must not change these hashes.
    recorded = ("model", "dataset", "generated_train_size", "generated_test_size", "generated_median_words",
                "generated_seed", "epochs", "seed", "batch_size", "learning_rate", "weight_decay",
                "warmup_steps", "max_length", "optimizer", "dropout", "group_by_length", "mixed_precision",
                "num_workers")
    cfg = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "out")}).validate()
    before = json.dumps({key: getattr(cfg, key) for key in recorded}, sort_keys=True)
    assert config_hash(cfg) == hashlib.sha256(before.encode()).hexdigest()[:16]
    compiled = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "out"), "compile": "default"}).validate()
    assert config_hash(compiled) != config_hash(cfg)


def test_generated_data_sizes_count_only_when_it_is_the_dataset():
    hub = {"model": "prajjwal1/bert-tiny", "dataset": "stanfordnlp/imdb", "generated_train_size": 1}
    assert TrainConfig(**hub).validate(local=False).generated_train_size == 1
    with pytest.raises(ConfigError, match=r"^generated_train_size: must be between 2 and 500000, got 1$"):
        TrainConfig(**{**hub, "dataset": "generated"}).validate(local=False)
