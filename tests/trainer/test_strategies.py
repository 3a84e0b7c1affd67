"""Parallelism strategies against ddp, for real: 2 CPU workers on gloo under torchrun, the same global
batch, fp32, dropout off, one seed; then each killed after its first checkpoint and resumed."""

import json
import subprocess
import sys

import pytest
import torch

from tests.trainer.conftest import (
    TINY,
    StopAfter,
    final_weights,
    kill_after_first_checkpoint,
    max_weight_difference,
    run,
    stage_model_directory,
    torchrun_command,
    trainer_env,
    write_config,
)
from trainer import strategies
from trainer.config import SCHEMA, ConfigError, TrainConfig, config_hash
from trainer.core import TrainHooks, train
from trainer.data import load_tokenizer
from trainer.model import build_model
from trainer.result import load_schema

SHARDING = [name for name in strategies.NAMES if name != strategies.DEFAULT]
# (largest relative difference from ddp allowed in any epoch's train loss, val loss or val accuracy,
# largest absolute difference in any final weight). Measured on CPU, 2 gloo workers, torch 2.13.0
# (accuracy 0.59, 0.54, 0.94 over these runs' 3 epochs).
# - zero1 and the FSDP two: 0.0 for each, bit for bit. With two ranks the gradient average is one
#   addition and a halving, exact whichever collective computes it (all-reduce, reduce-scatter), and
#   AdamW is elementwise, so sharding its state or the weights changes no arithmetic. The bound leaves
#   room for more ranks or NCCL, where a sum of three or more gradients may round differently.
# - tensor: not bit for bit. Each rank multiplies by half of a matrix and the halves' partial sums are
#   all-reduced, and one rank's batch of 16 reviews is padded to its longest where ddp's two batches of 8
#   are padded each to its own, so sums run in another order: measured 2.1e-7 in the losses (0.0 in
#   accuracy) and 2.8e-5 in a weight after 3 epochs of AdamW.
TOLERANCE = {
    "zero1": (1e-6, 1e-6),  # measured 0.0: DDP's all-reduce, AdamW stepped per shard, weights broadcast
    "fsdp": (1e-6, 1e-6),  # measured 0.0: reduce-scattered gradients, sharded AdamW, all-gather per layer
    "fsdp_no_reshard": (1e-6, 1e-6),  # measured 0.0: as fsdp, one all-gather fewer per layer
    "tensor": (1e-6, 1e-4),  # measured 2.1e-7 and 2.8e-5: split matmuls, partial sums all-reduced
}
# 129 test reviews: rank 0 validates 65 (9 batches of 8), rank 1 64 (8), so a sharded model's validation
# must join the other rank's weight gathers once more. Batches not grouped by length: then the batch of 16
# both tensor ranks see holds the reviews ddp's two ranks' batches of 8 hold together (grouped, each ddp
# rank sorts its own half).
COMPARED = dict(TINY, dropout=0.0, epochs=3, generated_test_size=129, group_by_length=False)


def test_every_strategy_has_a_stated_tolerance_and_one_list_of_names():
    assert set(TOLERANCE) == set(SHARDING)
    assert list(SCHEMA["properties"]["strategy"]["enum"]) == list(strategies.NAMES)
    assert load_schema()["properties"]["hyperparameters"]["properties"]["strategy"]["enum"] == list(
        strategies.NAMES)


def test_the_strategy_enters_the_config_hash_once_set_away_from_the_default():
    # The default adds nothing, so runs recorded before the option existed keep their hash.
    hashes = {config_hash(TrainConfig(strategy=name)) for name in strategies.NAMES}
    assert len(hashes) == len(strategies.NAMES)
    assert config_hash(TrainConfig(strategy=strategies.DEFAULT)) == config_hash(TrainConfig())


def test_an_unknown_strategy_is_refused_in_one_line(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "trainer.launchers.torchrun", "--strategy", "zero3",
         "--output-dir", str(tmp_path)], env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip() == (
        "trainer: error: strategy: must be one of ddp, zero1, fsdp, fsdp_no_reshard, tensor; got 'zero3'")


@pytest.mark.parametrize("strategy", SHARDING)
def test_sparse_embedding_sync_is_refused_with_another_strategy(make_config, strategy):
    with pytest.raises(ConfigError, match=f"^sparse_embedding_sync: an optimisation of strategy ddp's "
                                          f"gradient all-reduce, not of {strategy}; set it to false$"):
        make_config(strategy=strategy, sparse_embedding_sync=True)


def test_tensor_parallelism_over_workers_that_do_not_divide_the_heads_is_refused_in_one_line(
        make_config, tmp_path):
    # A BERT with 3 heads, staged as a local model directory, over 2 workers (this machine refuses more
    # workers than CPUs): every worker refuses before its first step.
    from transformers import BertConfig, BertForSequenceClassification

    wordpiece = load_tokenizer(make_config())
    shape = BertConfig(vocab_size=wordpiece.get_vocab_size(), hidden_size=96, num_hidden_layers=1,
                       num_attention_heads=3, intermediate_size=384, num_labels=2)
    stage_model_directory(BertForSequenceClassification(shape), wordpiece, tmp_path / "model")
    cfg = make_config(model=str(tmp_path / "model"), strategy="tensor", epochs=1)
    command = torchrun_command(2, "--config", str(write_config(cfg, tmp_path / "run.yml")))
    completed = run(command, check=False)
    assert completed.returncode != 0
    errors = {line for line in completed.stderr.splitlines() if line.startswith("trainer: error:")}
    assert errors == {"trainer: error: strategy: tensor splits the model's 3 attention heads over the 2 "
                      "workers, which does not divide them; use a world size that divides 3, or another "
                      "strategy"}, completed.stderr
    assert not (tmp_path / "out" / "result.json").exists()


class _GradientSyncingLauncher(TrainHooks):
    framework_label, syncs_gradients = "horovod (test)", True


def test_a_launcher_that_averages_gradients_itself_runs_ddp_alone(make_config):
    with pytest.raises(ConfigError, match="^strategy: zero1 cannot run under horovod \\(test\\), whose "
                                          "optimizer averages every gradient itself; use strategy ddp$"):
        train(make_config(strategy="zero1", epochs=1), _GradientSyncingLauncher())


@pytest.fixture(scope="module")
def unbroken_runs(tmp_path_factory, token_cache):
    """runs(strategy) -> (its 2-worker result, its checkpoint dir, its config): each run once per module."""
    done = {}

    def runs(strategy: str):
        if strategy not in done:
            root = tmp_path_factory.mktemp(strategy)
            cfg = TrainConfig(**{**COMPARED, "strategy": strategy, "output_dir": str(root / "out"),
                                 "cache_dir": str(token_cache),
                                 "checkpoint_dir": str(root / "ckpt")}).validate()
            run(torchrun_command(2, "--config", str(write_config(cfg, root / "run.yml"))))
            done[strategy] = json.loads((root / "out" / "result.json").read_text()), root / "ckpt", cfg
        return done[strategy]
    return runs


def _relative_difference(left: float, right: float) -> float:
    return abs(left - right) / max(abs(right), 1e-12)


@pytest.mark.slow  # two 2-worker runs of 3 epochs: over a minute on 2 busy cores
@pytest.mark.parametrize("strategy", SHARDING)
def test_a_strategy_trains_as_ddp_does(unbroken_runs, strategy):
    ddp_result, ddp_checkpoints, cfg = unbroken_runs(strategy="ddp")
    result, checkpoints, _ = unbroken_runs(strategy)
    metric_tolerance, weight_tolerance = TOLERANCE[strategy]
    assert result["hyperparameters"]["strategy"] == strategy
    assert result["framework_label"] == f"ddp (torchrun) + strategy {strategy}"
    for key in ("train_loss", "val_loss", "val_accuracy"):
        ours, theirs = ([m[key] for m in r["epoch_metrics"]] for r in (result, ddp_result))
        worst = max(_relative_difference(a, b) for a, b in zip(ours, theirs, strict=True))
        assert worst <= metric_tolerance, (key, ours, theirs)
    assert [m["train_samples"] for m in result["epoch_metrics"]] == [cfg.generated_train_size] * 3
    torch.manual_seed(cfg.seed)
    initial = build_model(cfg).state_dict()
    ddp_weights = final_weights(ddp_checkpoints, 3)
    assert max_weight_difference(ddp_weights, initial) > 1e-2  # the runs really moved the weights
    # The one-file checkpoint holds the whole model, as ddp's does, whatever the strategy sharded.
    assert max_weight_difference(final_weights(checkpoints, 3), ddp_weights) <= weight_tolerance


@pytest.mark.slow  # two 2-worker runs of 3 epochs: over a minute on 2 busy cores
@pytest.mark.parametrize("strategy", SHARDING)
def test_a_strategy_killed_after_its_first_checkpoint_resumes_to_the_unbroken_result(
        unbroken_runs, strategy, tmp_path):
    unbroken, unbroken_checkpoints, cfg = unbroken_runs(strategy)
    killed = TrainConfig(**{**cfg.as_dict(), "output_dir": str(tmp_path / "out"),
                            "checkpoint_dir": str(tmp_path / "ckpt")})
    command = torchrun_command(2, "--config", str(write_config(killed, tmp_path / "run.yml")))
    kill_after_first_checkpoint(command, tmp_path / "ckpt")
    assert not (tmp_path / "out" / "result.json").exists()

    completed = run(command)
    resumed = json.loads((tmp_path / "out" / "result.json").read_text())
    assert resumed["resumed_from_epoch"] in (1, 2), completed.stdout
    for key in ("train_loss", "val_loss", "val_accuracy", "train_samples"):
        assert [m[key] for m in resumed["epoch_metrics"]] == [m[key] for m in unbroken["epoch_metrics"]], key
    resumed_weights = final_weights(tmp_path / "ckpt", 3)
    assert max_weight_difference(resumed_weights, final_weights(unbroken_checkpoints, 3)) == 0


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
@pytest.mark.parametrize("strategy", SHARDING)
def test_on_one_gpu_a_strategy_stopped_and_resumed_ends_with_ddp_numbers(make_config, tmp_path, strategy):
    # nccl, fp32, deterministic kernels: bit for bit (measured on an H200). zero1's resume once failed only
    # here: ZeroRedundancyOptimizer had put fused AdamW's step on the CPU.
    shared = dict(device="cuda", dropout=0.0, deterministic=True, epochs=3)
    ddp = train(make_config(**shared, output_dir=str(tmp_path / "ddp")))
    resumable = make_config(**shared, strategy=strategy, output_dir=str(tmp_path / "out"),
                            checkpoint_dir=str(tmp_path / "ckpt"))
    assert train(resumable, StopAfter(1)) is None
    resumed = train(resumable)
    assert (resumed["resumed_from_epoch"], resumed["backend"]) == (1, "nccl")
    for key in ("train_loss", "val_loss", "val_accuracy"):
        assert [m[key] for m in resumed["epoch_metrics"]] == [m[key] for m in ddp["epoch_metrics"]], key
