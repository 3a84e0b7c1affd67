"""Per-epoch checkpoints: one `checkpoint.pt` per epoch directory, written atomically.

Layout under cfg.checkpoint_dir:  epoch-0001/checkpoint.pt, epoch-0002/checkpoint.pt, ...
A directory appears only by rename after its file is complete, so a crash leaves either the
old latest checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

CHECKPOINT_FILE_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = 1
KEEP_LATEST = 2  # the newest two, in case the newest is on a disk that fills up mid-copy
_EPOCH_DIR = re.compile(r"^epoch-(\d{4,})$")


def epoch_dir_name(epoch: int) -> str:
    return f"epoch-{epoch:04d}"


def epoch_of(epoch_dir: Path) -> int:
    """The epoch an epoch directory (as latest_checkpoint gives it) holds."""
    return int(_EPOCH_DIR.match(epoch_dir.name).group(1))


def latest_checkpoint(checkpoint_dir: str | Path | None) -> Path | None:
    """The newest complete epoch directory in checkpoint_dir, or None."""
    if checkpoint_dir is None or not Path(checkpoint_dir).is_dir():
        return None
    complete = [(int(m.group(1)), p) for p in Path(checkpoint_dir).iterdir()
                if (m := _EPOCH_DIR.match(p.name)) and (p / CHECKPOINT_FILE_NAME).is_file()]
    return max(complete)[1] if complete else None


@contextlib.contextmanager
def atomic_epoch_dir(checkpoint_dir: str | Path, epoch: int):
    """Yield a staging directory; on success it becomes checkpoint_dir/epoch-NNNN and old ones go."""
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{epoch_dir_name(epoch)}-", dir=checkpoint_dir))
    try:
        yield staging
        final = checkpoint_dir / epoch_dir_name(epoch)
        if final.exists():  # a rerun of the same epoch: move the old one aside first
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    complete = sorted((int(m.group(1)), p) for p in checkpoint_dir.iterdir()
                      if (m := _EPOCH_DIR.match(p.name)))
    for _, old in complete[:-KEEP_LATEST]:
        shutil.rmtree(old, ignore_errors=True)


def checkpoint_file(path: str | Path) -> Path:
    """Accept a checkpoint directory (as hooks give it) or the file itself."""
    path = Path(path)
    return path / CHECKPOINT_FILE_NAME if path.is_dir() else path


def save(state: dict, directory: str | Path) -> Path:
    target = Path(directory) / CHECKPOINT_FILE_NAME
    staging = target.with_name(f".{target.name}.partial")
    torch.save(state, staging)
    staging.replace(target)  # the file is whole even if the caller's directory is not staged
    return target


def load(path: str | Path) -> dict:
    # weights_only=False: our own file, and the numpy RNG state is not a plain tensor.
    return torch.load(checkpoint_file(path), map_location="cpu", weights_only=False)


def rng_states() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():  # CUDA-only: the device generators
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_states(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # CUDA-only
        torch.cuda.set_rng_state_all(state["cuda"])
