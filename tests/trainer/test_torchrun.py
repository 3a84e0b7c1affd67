"""The torchrun launcher for real: 2 CPU workers on loopback, DDP equivalence, and a SIGKILLed run resumed."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import (
    SUBPROCESS_TIMEOUT_S,
    final_weights,
    kill_after_first_checkpoint,
    max_weight_difference,
    run,
    torchrun_command,
    trainer_env,
    write_config,
)
from trainer import progress
from trainer.core import train
from trainer.model import build_model
from trainer.result import validate_result


@pytest.fixture(scope="module")
def two_worker_run(tmp_path_factory, token_cache):
    """One unbroken 2-worker run with checkpoints, shared by the tests that compare against it."""
    from tests.trainer.conftest import TINY
    from trainer.config import TrainConfig

    root = tmp_path_factory.mktemp("two-workers")
    cfg = TrainConfig(**{**TINY, "epochs": 3, "output_dir": str(root / "out"), "cache_dir": str(token_cache),
                         "checkpoint_dir": str(root / "ckpt")}).validate()
    completed = run(torchrun_command(2, "--config", str(write_config(cfg, root / "run.yml"))))
    return cfg, root, completed


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_two_workers_under_torchrun(two_worker_run):
    cfg, root, completed = two_worker_run
    result = json.loads((root / "out" / "result.json").read_text())
    validate_result(result)
    assert result["world_size"] == 2
    assert (result["framework_label"], result["backend"]) == ("ddp (torchrun)", "gloo")
    assert len(result["peak_memory_mb"]["rss_per_rank"]) == 2
    # Each sample once per epoch across both workers (256 divides evenly, so no sampler padding).
    assert [m["train_samples"] for m in result["epoch_metrics"]] == [cfg.generated_train_size] * 3
    assert "epoch 3/3" in completed.stdout
    assert completed.stdout.count("final accuracy") == 1  # rank 0 alone reports


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_ddp_averages_gradients_like_one_worker_with_the_double_batch(make_config, tmp_path):
    # SGD, not AdamW: Adam's update ignores the gradient's scale and would hide summed gradients.
    shared = dict(optimizer="sgd", learning_rate=0.5, warmup_steps=0, dropout=0.0, group_by_length=False,
                  epochs=1, generated_train_size=128)
    two = make_config(**shared, batch_size=8, output_dir=str(tmp_path / "two"),
                      checkpoint_dir=str(tmp_path / "c2"))
    run(torchrun_command(2, "--config", str(write_config(two, tmp_path / "two.yml"))))
    one = make_config(**shared, batch_size=16, output_dir=str(tmp_path / "one"),
                      checkpoint_dir=str(tmp_path / "c1"))
    train(one)

    torch.manual_seed(one.seed)
    initial = build_model(one).state_dict()
    two_workers, one_worker = final_weights(tmp_path / "c2", 1), final_weights(tmp_path / "c1", 1)
    assert max_weight_difference(one_worker, initial) > 1e-2  # 8 steps really moved the weights
    assert max_weight_difference(two_workers, one_worker) < 1e-5


@pytest.mark.slow  # a 2-worker run: over 10 s on 2 cores
def test_a_profiled_run_says_where_each_ranks_steady_steps_go(make_config, tmp_path, two_worker_run):
    """profile_steps: torch.profiler over 4 steady steps on both ranks; the unprofiled run has none."""
    cfg = make_config(epochs=1, profile_steps=4, output_dir=str(tmp_path / "profiled"))
    run(torchrun_command(2, "--config", str(write_config(cfg, tmp_path / "profiled.yml"))))
    result = json.loads((tmp_path / "profiled" / "result.json").read_text())
    validate_result(result)
    assert result["framework_label"] == "ddp (torchrun) + step profile"
    profile = result["step_profile"]
    assert (profile["steps"], profile["skipped_first"], len(profile["ranks"])) == (4, 3, 2)
    for rank in profile["ranks"]:
        assert rank["forward_backward_ms"] > 0 and rank["optimizer_ms"] > 0 and rank["data_ms"] > 0
        assert rank["collectives_ms"] > 0  # DDP's gloo all-reduce of the buckets, beside backward
        assert len(rank["top_operators"]) == 5
        for operator in rank["top_operators"]:
            assert operator["ms_per_step"] > 0 and not operator["name"].startswith("dtlab."), operator
        assert rank["peak_memory_mb"] > 0 and rank["operator_time"] == "CPU time on the rank's threads"
    unprofiled = json.loads((two_worker_run[1] / "out" / "result.json").read_text())
    assert unprofiled["step_profile"] is None


# Gradient accumulation (grad_accum_steps, issue 55): k micro-batches of b then one optimizer step must be one
# step of the whole k x b batch. SGD and no dropout, as above; the batches are whole (128 reviews divide),
# and each micro-batch's padding differs from the whole batch's, which the attention mask makes exact up to
# float summation order: the stated tolerance.
ACCUMULATION_TOLERANCE = 1e-5
ACCUMULATION = dict(optimizer="sgd", learning_rate=0.5, warmup_steps=0, dropout=0.0, group_by_length=False,
                    epochs=1, generated_train_size=128)


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_accumulating_k_micro_batches_is_one_step_of_the_k_times_larger_batch(make_config, tmp_path):
    whole = make_config(**ACCUMULATION, batch_size=32, output_dir=str(tmp_path / "whole"),
                        checkpoint_dir=str(tmp_path / "c32"))
    train(whole)
    accumulated = make_config(**ACCUMULATION, batch_size=8, grad_accum_steps=4,
                              output_dir=str(tmp_path / "acc"), checkpoint_dir=str(tmp_path / "c8x4"))
    train(accumulated)
    result = json.loads((tmp_path / "acc" / "result.json").read_text())
    validate_result(result)
    assert result["hyperparameters"]["grad_accum_steps"] == 4
    assert result["framework_label"].endswith(" + 4-step gradient accumulation")
    assert result["epoch_metrics"][0]["train_samples"] == 128

    torch.manual_seed(whole.seed)
    initial = build_model(whole).state_dict()
    one_step_each, accumulated_steps = final_weights(tmp_path / "c32", 1), final_weights(tmp_path / "c8x4", 1)
    assert max_weight_difference(one_step_each, initial) > 1e-2  # 4 steps really moved the weights
    assert max_weight_difference(accumulated_steps, one_step_each) < ACCUMULATION_TOLERANCE


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_ddp_accumulates_under_no_sync_like_one_worker_with_the_whole_global_batch(make_config, tmp_path):
    """2 workers x 8 reviews x 2 micro-batches (DDP's no_sync on the first) against 1 worker x 32."""
    two = make_config(**ACCUMULATION, batch_size=8, grad_accum_steps=2, output_dir=str(tmp_path / "two"),
                      checkpoint_dir=str(tmp_path / "c2"))
    run(torchrun_command(2, "--config", str(write_config(two, tmp_path / "two.yml"))))
    one = make_config(**ACCUMULATION, batch_size=32, output_dir=str(tmp_path / "one"),
                      checkpoint_dir=str(tmp_path / "c1"))
    train(one)
    assert max_weight_difference(final_weights(tmp_path / "c2", 1),
                                 final_weights(tmp_path / "c1", 1)) < ACCUMULATION_TOLERANCE


def stock_and_opted_in(option, make_config, tmp_path) -> dict[bool, tuple[dict, dict]]:
    """{False: stock DDP's, True: with `option` on}: (result.json, final weights) of one 2-worker epoch with
    dropout off and plain SGD, so that any difference in what is averaged shows in the weights."""
    shared = dict(optimizer="sgd", learning_rate=0.5, warmup_steps=0, dropout=0.0, epochs=1,
                  generated_train_size=128)
    runs = {}
    for opted in (False, True):
        out, ckpt = tmp_path / f"out-{opted}", tmp_path / f"ckpt-{opted}"
        cfg = make_config(**shared, **{option: opted}, output_dir=str(out), checkpoint_dir=str(ckpt))
        run(torchrun_command(2, "--config", str(write_config(cfg, tmp_path / f"run-{opted}.yml"))))
        runs[opted] = json.loads((out / "result.json").read_text()), final_weights(ckpt, 1)
    return runs


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_sparse_embedding_sync_is_opt_in_labelled_and_matches_stock_ddp(make_config, tmp_path):
    # The opt-in all-reduces only the touched word-embedding rows; the averaged gradient must be stock DDP's.
    runs = stock_and_opted_in("sparse_embedding_sync", make_config, tmp_path)
    labels = {opted: result["framework_label"] for opted, (result, _) in runs.items()}
    assert labels == {False: "ddp (torchrun)", True: "ddp (torchrun) + sparse embedding sync (dtlab)"}
    assert max_weight_difference(runs[True][1], runs[False][1]) < 1e-5


@pytest.mark.slow  # two 2-worker runs
def test_ddp_static_graph_is_labelled_and_trains_to_stock_ddps_weights(make_config, tmp_path):
    # static_graph changes when DDP plans its buckets, not what it averages: the same weights.
    runs = stock_and_opted_in("ddp_static_graph", make_config, tmp_path)
    (stock, stock_weights), (static, static_weights) = runs[False], runs[True]
    assert [stock["framework_label"], static["framework_label"]] == [
        "ddp (torchrun)", "ddp (torchrun) + DDP static graph"]
    assert "ddp_static_graph" not in stock["hyperparameters"]
    assert static["hyperparameters"]["ddp_static_graph"] is True
    assert static["config_hash"] != stock["config_hash"]
    assert max_weight_difference(static_weights, stock_weights) < 1e-6


def test_one_worker_runs_stock_ddp_as_torchrun_would(make_config):
    from trainer.core import prepared

    with prepared(make_config()) as built:
        assert isinstance(built.parallel_model, torch.nn.parallel.DistributedDataParallel)
        assert built.word_embeddings is None  # the touched-rows sync is off unless asked for


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_killed_run_resumes_to_the_unbroken_result(two_worker_run, tmp_path):
    cfg, unbroken_root, _ = two_worker_run
    killed_cfg = type(cfg)(**{**cfg.as_dict(), "output_dir": str(tmp_path / "out"),
                              "checkpoint_dir": str(tmp_path / "ckpt")})
    command = torchrun_command(2, "--config", str(write_config(killed_cfg, tmp_path / "run.yml")))
    kill_after_first_checkpoint(command, tmp_path / "ckpt")
    assert not (tmp_path / "out" / "result.json").exists()

    completed = run(command)
    resumed = json.loads((tmp_path / "out" / "result.json").read_text())
    unbroken = json.loads((unbroken_root / "out" / "result.json").read_text())
    assert resumed["resumed_from_epoch"] in (1, 2), completed.stdout
    for key in ("val_loss", "val_accuracy", "train_loss"):
        assert [m[key] for m in resumed["epoch_metrics"]] == [m[key] for m in unbroken["epoch_metrics"]], key
    unbroken_weights = final_weights(unbroken_root / "ckpt", 3)
    assert max_weight_difference(final_weights(tmp_path / "ckpt", 3), unbroken_weights) == 0


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_a_rank_whose_node_holds_the_newest_checkpoint_is_the_one_every_rank_resumes_from(
        two_worker_run, tmp_path):
    cfg, unbroken_root, _ = two_worker_run
    shutil.copytree(unbroken_root / "ckpt" / "epoch-0002", tmp_path / "ckpt" / "epoch-0002")
    moved = type(cfg)(**{**cfg.as_dict(), "output_dir": str(tmp_path / "out"),
                         "checkpoint_dir": str(tmp_path / "ckpt")})
    command = torchrun_command(2, "--config", str(write_config(moved, tmp_path / "run.yml")))
    module = command.index("trainer.launchers.torchrun")
    command[module - 1:module + 1] = [str(Path(__file__).with_name("rank0_without_checkpoint.py"))]
    completed = run(command)
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["resumed_from_epoch"] == 2 and "(rank 1: rank 0's node holds" in completed.stdout
    assert max_weight_difference(final_weights(tmp_path / "ckpt", 3),
                                 final_weights(unbroken_root / "ckpt", 3)) == 0
    # What fault plans read: the last checkpointed epoch, and each rank's PID on its node.
    assert (tmp_path / "out" / progress.CHECKPOINTED_FILE).read_text() == "3\n"
    assert sorted(p.name for p in (tmp_path / "out" / progress.RANKS_DIR).iterdir()) == ["0.pid", "1.pid"]


@pytest.mark.slow
def test_the_harness_agent_is_torchrun_with_its_output_and_exit_status(tmp_path, monkeypatch):
    """dtlab starts torchrun as trainer.launchers.agent (no collection at exit): same output and status, and
    no torchelastic_* directory left in the node's temporary directory."""

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))

    def agent(*args: str) -> subprocess.CompletedProcess:
        command = torchrun_command(1, *args)
        assert command[1:3] == ["-m", "torch.distributed.run"]
        command[2] = "trainer.launchers.agent"
        return run(command, check=False)

    helped = agent("--help")
    assert helped.returncode == 0 and "--config" in helped.stdout
    assert list(temporary.iterdir()) == []  # torchrun's log directory went with the agent
    stock = run(torchrun_command(1, "--no-such-flag"), check=False)
    # Stock torchrun leaves its log directory behind: the check above could fail.
    assert [path.name.startswith("torchelastic_") for path in temporary.iterdir()] == [True]
    wrapped = agent("--no-such-flag")
    assert stock.returncode == wrapped.returncode != 0
    assert "--no-such-flag" in wrapped.stderr
    exited = subprocess.run(
        [sys.executable, "-c", "from trainer.launchers._cli import exit_without_final_collection as leave\n"
                               "print('done', end='')\nleave(3)"],
        env=trainer_env(), capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert (exited.returncode, exited.stdout) == (3, "done")
