"""A run's checkpoint across its ranks: what every rank saves after each epoch, and the resume that reads the
newest one back, on whichever rank's node holds it (trainer/checkpoint.py has the files themselves).

Both take the core's run (trainer.core._Run): its ranks, hooks, config, strategy, optimizer, scheduler,
scaler and fingerprints, which the state is of.
"""

from __future__ import annotations

import contextlib
import socket
from typing import TYPE_CHECKING

import torch.distributed as dist

from trainer import checkpoint, progress
from trainer.config import ConfigError
from trainer.distributed import all_reduce_sum, gather

if TYPE_CHECKING:
    from trainer.core import _Run


def resume(run: _Run) -> tuple[int, float, list[dict]]:
    """(epochs done, elapsed training-span seconds, their metrics) from the latest checkpoint."""
    state, source = None, 0
    if run.rank == 0:
        path = run.hooks.resume_path()
        if path is not None:
            run.log(f"resuming from {path}")
            state = checkpoint.load(path)
    if run.world_size > 1:
        source = _newest_checkpoint_holder(run, state["epoch"] if state else 0)
        if source == run.rank != 0:
            path = checkpoint.latest_checkpoint(run.cfg.checkpoint_dir)
            print(f"{progress.LOG_PREFIX}resuming from {path} on {socket.gethostname()} (rank {source}: "
                  "rank 0's node holds an older checkpoint or none)", flush=True)
            state = checkpoint.load(path)
    holder = [state]
    if run.world_size > 1:  # one rank reads; the others receive it, so no shared disk is needed
        dist.broadcast_object_list(holder, src=source, device=run.device if run.is_cuda else None)
    state = holder[0]
    if state is None:
        return 0, 0.0, []
    _check_compatible(run, state)
    if state["world_size"] != run.world_size:  # elastic: the full state fits any world size
        run.log(f"elastic: resuming {state['world_size']} workers' checkpoint on {run.world_size}")
    run.strategy.load_full_state(state["model"], state["optimizer"], run.optimizer)
    run.scheduler.load_state_dict(state["scheduler"])
    run.scaler.load_state_dict(state["scaler"])
    # A rank beyond the writers' takes a writer's generators: a new world size is a new data order.
    checkpoint.restore_rng_states(state["rng"][run.rank % len(state["rng"])])
    return state["epoch"], state["elapsed_s"], state["epoch_metrics"]


def _check_compatible(run: _Run, state: dict) -> None:
    if state["config_hash"] != run.config_hash:
        raise ConfigError(f"checkpoint_dir: the checkpoint was written by a different config "
                          f"({state['config_hash']} != {run.config_hash}); use an empty checkpoint_dir")
    if state.get("data_fingerprint", run.data_fingerprint) != run.data_fingerprint:
        raise ConfigError(f"checkpoint_dir: the checkpoint was trained on other tokens (data and "
                          f"tokenizer fingerprint {state['data_fingerprint']} != "
                          f"{run.data_fingerprint}); use an empty checkpoint_dir")
    if state["world_size"] != run.world_size and not run.cfg.elastic:
        raise ConfigError(f"checkpoint_dir: the checkpoint was written by {state['world_size']} workers, "
                          f"this run has {run.world_size}; resume with the same world size")


def _newest_checkpoint_holder(run: _Run, rank0_epoch: int) -> int:
    """The rank whose node holds the newest checkpoint in checkpoint_dir (rank 0 on a tie). Spark and
    Ray restart a worker group on any nodes, so rank 0 may now run where the checkpoint is not."""
    own = 0
    if run.rank != 0 and (found := checkpoint.latest_checkpoint(run.cfg.checkpoint_dir)):
        own = checkpoint.epoch_of(found)
    epochs = gather(rank0_epoch if run.rank == 0 else own)
    return max(range(len(epochs)), key=lambda rank: (epochs[rank], -rank))


def save(run: _Run, epoch: int, elapsed: float, epoch_metrics: list[dict]) -> None:
    """Every rank calls it after each epoch; rank 0 writes the whole state where its hooks say, if they do."""
    rng = gather(checkpoint.rng_states())  # every rank's generators, for an exact resume
    # Rank 0's hooks say where to write, or not at all; every rank learns whether, since a sharded
    # strategy gathers the whole state on all of them (and should not when nothing is written).
    writing = run.hooks.checkpoint_path(epoch) if run.rank == 0 else contextlib.nullcontext(None)
    with writing as directory:
        if all_reduce_sum([float(directory is not None)], run.device)[0] == 0:
            return
        full_state = run.strategy.full_state(run.optimizer)
        if run.rank != 0:
            return
        model_state, optimizer_state = full_state
        checkpoint.save({
            "format": checkpoint.CHECKPOINT_FORMAT, "config_hash": run.config_hash,
            "data_fingerprint": run.data_fingerprint,
            "world_size": run.world_size, "epoch": epoch, "elapsed_s": elapsed,
            "epoch_metrics": epoch_metrics, "rng": rng, "model": model_state,
            "optimizer": optimizer_state, "scheduler": run.scheduler.state_dict(),
            "scaler": run.scaler.state_dict(),
        }, directory)
    if run.cfg.output_dir:
        progress.mark_checkpointed(run.cfg.output_dir, epoch)
