"""Helpers for the trainer tests: tiny configs on generated data, and real torchrun launches.

Every run here is real CPU torch with 1 thread per worker and tiny sizes (max_length 64).
The tokenized splits are cached once per session in a shared directory, as on a real node.
"""

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from trainer.config import TrainConfig
from trainer.core import TrainHooks

# Network safety: nothing in these tests may reach the model or dataset hubs.
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")

# Small enough for seconds per epoch on one core, big enough that accuracy means something.
TINY = dict(model="generated:bert-tiny", dataset="generated", generated_train_size=256,
            generated_test_size=128, generated_median_words=60, max_length=64, batch_size=8, epochs=2,
            learning_rate=1e-3, warmup_steps=4, threads=1, device="cpu", mixed_precision="no")
SUBPROCESS_TIMEOUT_S = 300


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("token-cache")


@pytest.fixture
def make_config(tmp_path, token_cache):
    """make_config(**overrides) -> a validated TrainConfig writing under this test's tmp_path."""
    def make(**overrides) -> TrainConfig:
        values = {**TINY, "output_dir": str(tmp_path / "out"), "cache_dir": str(token_cache), **overrides}
        return TrainConfig(**values).validate()
    return make


def write_config(cfg: TrainConfig, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg.as_dict()))
    return path


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def trainer_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def torchrun_command(nproc: int, *trainer_args: str) -> list[str]:
    """torchrun on loopback with the torchrun launcher module, as a user types it."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={free_loopback_port()}",
            "-m", "trainer.launchers.torchrun", *trainer_args]


def run(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    completed = subprocess.run(command, env=trainer_env(), capture_output=True, text=True,
                               timeout=SUBPROCESS_TIMEOUT_S)
    if check and completed.returncode != 0:
        raise AssertionError(f"{command} exited {completed.returncode}:\n"
                             f"{completed.stdout}\n{completed.stderr}")
    return completed


def stage_model_directory(model, wordpiece, directory: Path) -> Path:
    """A Hugging Face model directory as a user stages one: the model's weights and config, and the
    generated wordpiece tokenizer wrapped as the fast tokenizer AutoTokenizer loads."""
    from transformers import PreTrainedTokenizerFast

    model.save_pretrained(directory)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=wordpiece, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    tokenizer.save_pretrained(directory)
    return directory


def final_weights(checkpoint_dir: Path, epoch: int) -> dict[str, torch.Tensor]:
    state = torch.load(checkpoint_dir / f"epoch-{epoch:04d}" / "checkpoint.pt", weights_only=False)
    return state["model"]


def max_weight_difference(left: dict, right: dict) -> float:
    assert left.keys() == right.keys()
    return max((left[key].double() - right[key].double()).abs().max().item() for key in left)


class StopAfter(TrainHooks):
    """Stops the run after `epoch`, as a preempted or killed run would end."""

    def __init__(self, epoch: int):
        self.stop_epoch, self.seen = epoch, []

    def on_epoch_end(self, epoch, metrics):
        self.seen.append(epoch)

    def should_stop(self):
        return bool(self.seen) and self.seen[-1] >= self.stop_epoch


def kill_after_first_checkpoint(command: list[str], checkpoint_dir: Path) -> None:
    """Start `command` and SIGKILL it and every process under it once epoch 1's checkpoint exists,
    like a node losing power."""
    process = subprocess.Popen(command, env=trainer_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
        while not (checkpoint_dir / "epoch-0001").exists():
            assert process.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within the timeout"
            time.sleep(0.05)
    finally:
        # torchrun starts its workers in their own sessions: SIGKILL each by PID.
        launched = psutil.Process(process.pid)
        members = [*launched.children(recursive=True), launched]
        for member in members:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        process.wait(timeout=60)
        psutil.wait_procs(members, timeout=60)


@contextlib.contextmanager
def running(command: list[str], env: dict, stdout=subprocess.PIPE):
    """`command` in a session of its own while the block runs; then SIGTERM to its group (SIGKILL later)."""
    import signal

    process = subprocess.Popen(command, env=env, stdout=stdout, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
