"""The CUDA path for real: nccl under torchrun, placement, each precision, exact resume, torch.compile.

These run only where torch sees a GPU (the lent GPU machine: see benchmarks/README.md, "GPU") and are
skipped, saying so, everywhere else, CI included. Sizes are small enough for seconds per test.
"""

import json

import pytest
import torch

from tests.trainer.conftest import (
    StopAfter,
    final_weights,
    max_weight_difference,
    run,
    torchrun_command,
    write_config,
)
from trainer.checkpoint import load
from trainer.core import auto_precision, train
from trainer.result import validate_result

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine",
)

# Enough steps that a random bert-tiny learns the generated signal (>= 0.95) in a few epochs.
ON_GPU = dict(
    device="cuda",
    threads=1,
    generated_train_size=1024,
    generated_test_size=256,
    batch_size=32,
    max_length=128,
    learning_rate=1e-3,
    warmup_steps=5,
)


def capability() -> tuple[int, int]:
    return torch.cuda.get_device_capability()


def test_one_worker_under_torchrun_trains_on_the_gpu_with_nccl(make_config, tmp_path, monkeypatch):
    last_gpu = torch.cuda.device_count() - 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(last_gpu))  # as the harness places a rank on its GPU
    cfg = make_config(**ON_GPU, epochs=2, mixed_precision="auto")
    completed = run(torchrun_command(1, "--config", str(write_config(cfg, tmp_path / "run.yml"))))
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    validate_result(result)
    assert (result["device"], result["backend"], result["gpus"], result["world_size"]) == (
        "cuda",
        "nccl",
        1,
        1,
    )
    assert result["framework_label"] == "ddp (torchrun)"
    # auto records what the GPU's tensor cores do natively: bf16 on Ampere and newer.
    assert result["hyperparameters"]["mixed_precision"] == auto_precision(capability())
    assert result["hyperparameters"]["pad_to_multiple_of"] == 8
    assert result["versions"]["cuda"] and result["versions"]["nccl"]
    assert result["versions"]["gpu"].startswith(torch.cuda.get_device_name(last_gpu))
    assert result["peak_memory_mb"]["cuda"] > 1
    # NVML's utilization, sampled during the run (nvidia-ml-py is a trainer dependency): never left null.
    assert result["gpu_utilization_pct"] is not None and 0 <= result["gpu_utilization_pct"] <= 100
    assert "on cuda:0" in completed.stdout  # the one visible GPU is this process's cuda:0


@pytest.mark.skipif(torch.cuda.device_count() != 1, reason="checks the refusal on a machine with one GPU")
def test_two_workers_on_one_gpu_are_refused_with_one_line(make_config, tmp_path):
    # NCCL refuses two ranks on one device ("Duplicate GPU detected"), so the trainer says so first.
    cfg = make_config(**ON_GPU, epochs=1)
    completed = run(
        torchrun_command(2, "--config", str(write_config(cfg, tmp_path / "run.yml"))), check=False
    )
    assert completed.returncode != 0
    assert (
        "world size: 2 processes on this node but only 1 GPUs; start at most one process per GPU"
        in completed.stderr
    )
    assert not (tmp_path / "out" / "result.json").exists()


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_each_precision_trains_and_learns(make_config, tmp_path, precision):
    if precision == "bf16" and capability() < (8, 0):
        pytest.skip(f"bf16 needs compute capability 8.0; this GPU is {capability()}")
    result = train(
        make_config(**ON_GPU, epochs=4, mixed_precision=precision, checkpoint_dir=str(tmp_path / "ckpt"))
    )
    accuracies = [m["val_accuracy"] for m in result["epoch_metrics"]]
    assert max(accuracies) >= 0.9, accuracies  # learns (chance is 0.5); >= 0.95 on an H100
    assert result["hyperparameters"]["mixed_precision"] == precision
    scaler = load(tmp_path / "ckpt" / "epoch-0004")["scaler"]
    if precision == "fp16":  # the GradScaler ran: it keeps a live loss scale
        assert scaler["scale"] > 0
    else:  # bf16 and fp32 need no loss scaling
        assert scaler == {}


def _unbroken_and_resumed(make_config, tmp_path, **options) -> tuple[dict, dict]:
    # 2 loader processes (the CUDA default), dropout on, fp32: the RNG streams must carry over.
    shared = dict(**ON_GPU, epochs=3, mixed_precision="no", **options)
    unbroken = train(
        make_config(
            **shared, checkpoint_dir=str(tmp_path / "unbroken"), output_dir=str(tmp_path / "unbroken-out")
        )
    )
    resumed_cfg = make_config(
        **shared, checkpoint_dir=str(tmp_path / "resumed"), output_dir=str(tmp_path / "resumed-out")
    )
    assert train(resumed_cfg, StopAfter(epoch=1)) is None
    resumed = train(resumed_cfg)
    assert resumed["resumed_from_epoch"] == 1
    return unbroken, resumed


def test_with_deterministic_kernels_a_resumed_run_matches_an_unbroken_run_bit_for_bit(make_config, tmp_path):
    # With CUDA's default kernels (atomic adds in varying order) two identical fresh runs already differ in
    # the 8th digit of the first epoch's loss, and the gap grows (seen on an H100: 0.127 vs 0.221 validation
    # loss two epochs later), so only deterministic: true can make a resume exact. trainer/README.md says so.
    unbroken, resumed = _unbroken_and_resumed(make_config, tmp_path, deterministic=True)
    for key in ("val_loss", "val_accuracy", "train_loss"):
        assert [m[key] for m in resumed["epoch_metrics"]] == [m[key] for m in unbroken["epoch_metrics"]], key
    difference = max_weight_difference(
        final_weights(tmp_path / "unbroken", 3), final_weights(tmp_path / "resumed", 3)
    )
    assert difference == 0.0


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_run_learns_and_is_labelled(make_config, mode):
    result = train(make_config(**ON_GPU, epochs=3, mixed_precision="auto", compile=mode))
    accuracies = [m["val_accuracy"] for m in result["epoch_metrics"]]
    assert max(accuracies) >= 0.9, accuracies  # learns (chance is 0.5); eager runs reach about 0.95 here
    assert result["framework_label"] == f"ddp (torchrun) + torch.compile ({mode})"
    assert (result["hyperparameters"]["compile"], result["hyperparameters"]["pad_to_multiple_of"]) == (
        mode,
        64,
    )


def test_ddp_static_graph_trains_to_stock_ddps_weights_on_the_gpu(make_config, tmp_path):
    # The opt-in (trainer.config.DDP_OPTIONS) under nccl on a real device: static_graph changes when DDP
    # plans its buckets, not what it averages, so with deterministic kernels the weights are stock DDP's.
    shared = dict(**ON_GPU, epochs=2, mixed_precision="no", deterministic=True)
    results = {}
    for opted in (False, True):
        ckpt = tmp_path / f"ckpt-{opted}"
        results[opted] = train(make_config(**shared, ddp_static_graph=opted, checkpoint_dir=str(ckpt),
                                           output_dir=str(tmp_path / f"out-{opted}")))
        assert results[opted]["backend"] == "nccl"
    assert results[True]["framework_label"] == "ddp (torchrun) + DDP static graph"
    assert [m["val_loss"] for m in results[True]["epoch_metrics"]] == [
        m["val_loss"] for m in results[False]["epoch_metrics"]]
    assert max(m["val_accuracy"] for m in results[True]["epoch_metrics"]) >= 0.9  # learns; chance is 0.5
    difference = max_weight_difference(final_weights(tmp_path / "ckpt-False", 2),
                                       final_weights(tmp_path / "ckpt-True", 2))
    assert difference < 1e-6, difference
