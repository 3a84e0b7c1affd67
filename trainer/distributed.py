"""The process group the core trains in: which device this rank uses, joining or forming the group,
removing only a group we formed, and the two collectives the loop and the result need."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from trainer.config import ConfigError, TrainConfig


def scheduler_gives_gpus(device: str, gpus_offered: float) -> bool:
    """Whether the workers a scheduler places (Ray's) each ask it for a GPU: for cuda, and for auto when
    the cluster offers any (Ray's cluster_resources()["GPU"]); otherwise every worker runs on CPU."""
    return device == "cuda" or (device == "auto" and gpus_offered >= 1)


def resolve_device(cfg: TrainConfig) -> torch.device:
    """This rank's device: its LOCAL_RANK's GPU, or the CPU; refuses what this node cannot run."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but torch sees no GPU; use device auto or cpu")
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if not use_cuda and cfg.mixed_precision in ("bf16", "fp16"):
        raise ConfigError(f"mixed_precision: {cfg.mixed_precision} is CUDA-only and this run is on cpu; "
                          "use auto or no")
    if not use_cuda:
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if local_world_size > torch.cuda.device_count():  # CUDA-only: one process per GPU
        raise ConfigError(f"world size: {local_world_size} processes on this node but only "
                          f"{torch.cuda.device_count()} GPUs; start at most one process per GPU")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


# A gloo worker thread lets go of a finished collective's tensors after the caller has its result, and a
# tensor Python no longer holds needs the GIL to go. The group's destructor joins those threads while it
# holds the GIL (it runs when the last reference goes: the model's DDP reducer, as train() returns), so a
# worker still waiting for the GIL then deadlocks the process. That hung tests/trainer/test_train.py
# twice on 2026-11-26 (CI's run and a full run here, both in the in-process stop-and-resume test), with
# the trace: main thread in ~ProcessGroupGloo -> thread::join, a pt_gloo_runloop thread in
# ~AsyncAllreduceWork -> decref_pyobject -> take_gil. A moment without the GIL before the group goes lets
# every such worker finish first; after it no collective runs, so none can start waiting again.
GIL_FREE_BEFORE_TEARDOWN_S = 0.1


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[None]:
    """Inside: the launcher's group (env://), or a 1-process group formed here. On leaving, a group
    formed here is destroyed; the launcher's own is left as it was."""
    created = _join_or_form(device)
    try:
        yield
    finally:
        if created and dist.is_initialized():
            time.sleep(GIL_FREE_BEFORE_TEARDOWN_S)  # see above: sleeping releases the GIL
            dist.destroy_process_group()


def _join_or_form(device: torch.device) -> bool:
    """Join the launcher's group (env://), or form a 1-process group; True if we created it."""
    if dist.is_initialized():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    device_id = device if device.type == "cuda" else None
    if "RANK" not in os.environ:  # a plain process: a group of one (os.environ untouched)
        # An in-memory store: no port to pick and bind, so no other process can take it in between.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device_id)
        return True
    if device.type == "cpu":
        slots = len(os.sched_getaffinity(0))
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        if local_world_size > slots:
            raise ConfigError(f"world size: {local_world_size} processes on this node but only {slots} CPUs; "
                              "start at most one process per CPU")
    dist.init_process_group(backend=backend, init_method="env://", device_id=device_id)
    return True


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Each value summed over every rank (float64, so counts stay exact)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def gather(value) -> list:
    """Every rank's `value` (any picklable object), in rank order, on every rank."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def average_touched_rows(gradient: torch.Tensor, input_ids: torch.Tensor, world_size: int) -> None:
    """sparse_embedding_sync: what DDP does for this gradient (divide by world size, all-reduce SUM), on
    the rows of the tokens any rank's batch touched only (the core takes the word embeddings out of DDP)."""
    touched = torch.zeros(gradient.shape[0], dtype=torch.uint8, device=gradient.device)
    touched[input_ids.flatten()] = 1
    dist.all_reduce(touched, op=dist.ReduceOp.MAX)  # rows any rank touched
    rows = touched.nonzero().squeeze(1)
    averaged = gradient.index_select(0, rows).div_(world_size)
    dist.all_reduce(averaged, op=dist.ReduceOp.SUM)
    gradient.index_copy_(0, rows, averaged)
