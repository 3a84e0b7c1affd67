"""The Horovod launcher for real: horovodrun with Gloo, 2 ranks on loopback, against torchrun's DDP.

Horovod is not in the controller's venv (it is built against the nodes' torch: roles/horovod). The
module builds the wheel with scripts/build-horovod-wheel.sh (once per torch and Python: a cached wheel
is reused) and installs it, with cloudpickle, into a folder of its own on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dtlab import paths
from tests.trainer.conftest import (
    SUBPROCESS_TIMEOUT_S,
    TINY,
    final_weights,
    max_weight_difference,
    run,
    torchrun_command,
    write_config,
)
from trainer.config import TrainConfig
from trainer.core import train
from trainer.model import build_model
from trainer.result import validate_result

GROUP_VARS = yaml.safe_load((paths.REPO_ROOT / "inventory" / "group_vars" / "all.yml").read_text())
BUILD_TIMEOUT_S = 3600  # the first build: about 6 minutes on 2 cores; later ones find the wheel

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def horovod_env(tmp_path_factory, lab_preparation) -> dict[str, str]:
    """The environment a process needs to import the built Horovod beside this venv's torch."""
    if lab_preparation:  # the session lab's bundle compiles the wheel: take it (this venv cannot build it)
        lab_preparation.wait("bundle")
    site = tmp_path_factory.mktemp("horovod-site")
    built = subprocess.run(
        [str(paths.REPO_ROOT / "scripts" / "build-horovod-wheel.sh"), "--python", sys.executable,
         "--out", str(paths.WHEELHOUSE_DIR)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = built.stdout.strip().splitlines()[-1]
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    installed = subprocess.run([*pip, wheel, f"cloudpickle=={GROUP_VARS['horovod_cloudpickle_version']}"],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(paths.REPO_ROOT)]),
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def horovodrun(env: dict[str, str], ranks: int, config: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", str(ranks),
               "-H", f"localhost:{ranks}", sys.executable, "-m", "trainer.launchers.horovod",
               "--config", str(config)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)


def test_two_ranks_under_horovodrun_train_exactly_as_ddp_does(horovod_env, tmp_path, token_cache):
    results = {}
    for name in ("horovod", "ddp"):
        cfg = TrainConfig(**{**TINY, "output_dir": str(tmp_path / name), "cache_dir": str(token_cache),
                             "checkpoint_dir": str(tmp_path / f"{name}-ckpt")}).validate()
        config = write_config(cfg, tmp_path / f"{name}.yml")
        if name == "horovod":
            done = horovodrun(horovod_env, 2, config)
            assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        else:
            run(torchrun_command(2, "--config", str(config)))
        results[name] = json.loads((tmp_path / name / "result.json").read_text())
    horovod, ddp = results["horovod"], results["ddp"]
    validate_result(horovod)
    assert (horovod["framework"], horovod["framework_label"]) == ("horovod", "horovod (horovodrun, Gloo)")
    assert horovod["world_size"] == 2 and len(horovod["peak_memory_mb"]["rss_per_rank"]) == 2
    # Horovod's ring averages what DDP's all-reduce averages: with 2 ranks, to the last bit.
    for key in ("train_loss", "val_loss", "val_accuracy", "train_samples"):
        assert [m[key] for m in horovod["epoch_metrics"]] == [m[key] for m in ddp["epoch_metrics"]], key


@pytest.mark.parametrize("option", ["sparse_embedding_sync", "ddp_static_graph"])
def test_a_ddp_only_option_is_refused_in_one_line(horovod_env, make_config, tmp_path, option):
    config = write_config(make_config(**{option: True}), tmp_path / "ddp-option.yml")
    done = subprocess.run([sys.executable, "-m", "trainer.launchers.horovod", "--config", str(config)],
                          env=horovod_env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"python -m trainer.launchers.horovod: error: {option}: a DDP optimisation; horovod "
        "(horovodrun, Gloo) averages every gradient itself: set it to false")


def test_horovod_accumulates_gradients_over_its_backward_passes_like_the_whole_global_batch(
        horovod_env, make_config, tmp_path):
    """grad_accum_steps 2 under horovodrun (hvd.DistributedOptimizer's backward_passes_per_step: one
    all-reduce per step; Horovod refuses a second backward before step() otherwise) against one worker
    with the whole global batch: 2 ranks x 8 reviews x 2 micro-batches = 32."""
    from tests.trainer.test_torchrun import ACCUMULATION, ACCUMULATION_TOLERANCE

    accumulated = make_config(**ACCUMULATION, batch_size=8, grad_accum_steps=2,
                              output_dir=str(tmp_path / "hvd"), checkpoint_dir=str(tmp_path / "c-hvd"))
    done = horovodrun(horovod_env, 2, write_config(accumulated, tmp_path / "hvd.yml"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    result = json.loads((tmp_path / "hvd" / "result.json").read_text())
    assert result["framework_label"] == "horovod (horovodrun, Gloo) + 2-step gradient accumulation"
    whole = make_config(**ACCUMULATION, batch_size=32, output_dir=str(tmp_path / "one"),
                        checkpoint_dir=str(tmp_path / "c-one"))
    train(whole)
    assert max_weight_difference(final_weights(tmp_path / "c-hvd", 1),
                                 final_weights(tmp_path / "c-one", 1)) < ACCUMULATION_TOLERANCE


def test_horovod_compresses_its_all_reduce_to_fp16_and_refuses_ddps_other_hooks(horovod_env, make_config,
                                                                                 tmp_path):
    """grad_compression fp16 is Horovod's own (hvd.Compression.fp16, half the gradient bytes); bf16 and
    PowerSGD are DDP communication hooks, refused in one line under Horovod."""
    cfg = make_config(grad_compression="fp16", output_dir=str(tmp_path / "fp16"))
    done = horovodrun(horovod_env, 2, write_config(cfg, tmp_path / "fp16.yml"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    result = json.loads((tmp_path / "fp16" / "result.json").read_text())
    validate_result(result)
    assert result["framework_label"] == "horovod (horovodrun, Gloo) + fp16 gradient compression"
    sent = result["gradient_sync"]
    assert (sent["compression"], sent["counted"]) == ("fp16", "every trainable gradient")
    assert sent["bytes_per_step"] == 2 * sum(p.numel() for p in build_model(cfg).parameters())
    config = write_config(make_config(grad_compression="bf16"), tmp_path / "bf16.yml")
    refused = subprocess.run([sys.executable, "-m", "trainer.launchers.horovod", "--config", str(config)],
                             env=horovod_env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        "python -m trainer.launchers.horovod: error: grad_compression: bf16 is a DDP communication hook; "
        "horovod (horovodrun, Gloo) compresses with none or fp16 only")


def test_horovod_elastic_goes_on_with_the_survivor_when_a_rank_is_lost(horovod_env, make_config, tmp_path):
    """Horovod Elastic with the horovod platform's flags (ELASTIC_OPTIONS) on two loopback "hosts": rank 1
    is SIGKILLed once epoch 1 is checkpointed; horovodrun blacklists its host and resets rank 0, whose core
    resumes that checkpoint on 1 rank, in the same horovodrun and the same process (elastic: true)."""
    from dtlab.platforms.horovod import ELASTIC_OPTIONS
    from trainer import progress

    cfg = make_config(epochs=3, checkpoint_dir=str(tmp_path / "ckpt"), elastic=True)
    command = [sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", "2", "--min-np", "1",
               "--max-np", "2", *ELASTIC_OPTIONS, "-H", "localhost:1,127.0.0.1:1", sys.executable, "-m",
               "trainer.launchers.horovod", "--config", str(write_config(cfg, tmp_path / "elastic.yml"))]
    log = tmp_path / "horovodrun.log"
    with log.open("w") as out:
        driver = subprocess.Popen(command, env=horovod_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        rank_1 = Path(cfg.output_dir) / progress.RANKS_DIR / "1.pid"
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
        while not ((Path(cfg.checkpoint_dir) / "epoch-0001").exists() and rank_1.exists()):
            assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        first_process = int((Path(cfg.output_dir) / progress.RANKS_DIR / "0.pid").read_text())
        os.kill(int(rank_1.read_text()), signal.SIGKILL)
        driver.wait(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        driver.kill()
    output = log.read_text()
    assert driver.returncode == 0, output[-4000:]
    result = json.loads((Path(cfg.output_dir) / "result.json").read_text())
    validate_result(result)
    assert result["world_size"] == 1 and result["resumed_from_epoch"] == 1, output[-3000:]
    assert [m["epoch"] for m in result["epoch_metrics"]] == [1, 2, 3]
    assert "elastic: resuming 2 workers' checkpoint on 1" in output
    assert int((Path(cfg.output_dir) / progress.RANKS_DIR / "0.pid").read_text()) == first_process
