"""What a launcher may change in the training core (trainer.core): TrainHooks and its defaults."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from trainer import checkpoint
from trainer.config import DATA_PATHS, DEFAULT_DATA_PATH, DEFAULT_FRAMEWORK, PLATFORM_DATA_PATH, TrainConfig
from trainer.data import SPLITS, TokenizedSplit, tokenized_splits


class TrainHooks:
    """What a launcher may change. The defaults are plain torchrun behaviour.

    resume_path() and checkpoint_path() are called on rank 0 only (the checkpoint is read there
    and broadcast, so nodes need no shared disk); on_epoch_end() on rank 0 only; should_stop()
    on every rank after every epoch's checkpoint (the answers are OR-ed across ranks).
    The core sets `self.cfg` before calling any of them.
    """

    framework: str = DEFAULT_FRAMEWORK
    framework_label: str = "ddp (torchrun)"
    cfg: TrainConfig | None = None
    # True when the launcher's own optimizer averages the gradients (Horovod's DistributedOptimizer):
    # the core then trains wrap_model's module instead of stock DDP's.
    syncs_gradients: bool = False
    # TrainConfig.data_path values this launcher trains on: the DataLoader's own tokens, and where the
    # platform has its own ETL (Spark, Ray), its tokens (trainer/platform_data.py).
    data_paths: tuple[str, ...] = (DEFAULT_DATA_PATH,)
    # The platform ETL's wall-clock marks on the driver (etl_started, etl_ended): in result.json's timeline.
    data_marks: dict | None = None
    # With syncs_gradients: the grad_compression values the launcher's optimizer can apply (others refused).
    gradient_compressions: tuple[str, ...] = ("none",)

    def tokenized_splits(self, log) -> dict[str, TokenizedSplit]:
        """Both splits' tokens; default: the trainer's own, from its cache or tokenized into it."""
        return tokenized_splits(self.cfg, log=log)

    def resume_path(self) -> Path | None:
        """Checkpoint directory or file to resume from; default: the latest in cfg.checkpoint_dir."""
        return checkpoint.latest_checkpoint(self.cfg.checkpoint_dir)

    def checkpoint_path(self, epoch: int) -> contextlib.AbstractContextManager[Path | None]:
        """Directory to write this epoch's checkpoint into; None skips it (checkpointing off)."""
        if self.cfg.checkpoint_dir is None:
            return contextlib.nullcontext(None)
        return checkpoint.atomic_epoch_dir(self.cfg.checkpoint_dir, epoch)

    def on_epoch_end(self, epoch: int, metrics: dict) -> None:
        """Global metrics of a finished epoch: val_loss, val_accuracy, train_time_s, val_time_s, ..."""

    def should_stop(self) -> bool:
        """True to stop after this epoch's checkpoint (preemption, early stop); train() then returns None."""
        return False

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """With syncs_gradients: the module to train (the core's DDP otherwise)."""
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer,
                       model: torch.nn.Module) -> torch.optim.Optimizer:
        """With syncs_gradients: the optimizer that averages the gradients across ranks."""
        return optimizer

    def gradient_sync(self, model: torch.nn.Module) -> dict | None:
        """With syncs_gradients: what the launcher's optimizer sends per optimizer step ({bytes_per_step,
        counted})."""
        return None

    def optimizer_step(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        """One optimizer step through the loss scaler (a no-op scaler unless fp16)."""
        scaler.step(optimizer)


class PlatformRowsHooks(TrainHooks):
    """A launcher whose platform has its own ETL (trainer/platform_data.py): with data_path platform its
    tokens are the rows the driver's ETL handed over (`platform_rows`), else the trainer's own. `etl_run`:
    the driver's EtlRun (None on the loader path)."""

    data_paths = DATA_PATHS

    def __init__(self, etl_run=None):
        self.etl_run = etl_run
        self.data_marks = etl_run.marks if etl_run else None

    def platform_rows(self, split: str):
        """One split's rows (a pyarrow Table of platform_data.TOKEN_COLUMNS, in any order)."""
        raise NotImplementedError

    def tokenized_splits(self, log) -> dict[str, TokenizedSplit]:
        if self.cfg.data_path != PLATFORM_DATA_PATH:
            return super().tokenized_splits(log)
        from trainer.platform_data import splits_from_tables  # here: pyarrow only where it is used

        log(f"tokens {self.etl_run.tokens_fingerprint}: the platform ETL's rows")
        tables = {split: self.platform_rows(split) for split in SPLITS}
        return splits_from_tables(self.cfg, tables, self.etl_run.tokens_fingerprint)
