"""ddp: stock DistributedDataParallel, the study's strategy and the default. Every rank holds the whole
model and optimizer state; gradients are all-reduced (averaged) in buckets during backward."""

from __future__ import annotations

import contextlib

import torch

from trainer.strategies.base import Strategy
from trainer.strategies.compression import CountingHook, uncompressed_bytes


def powersgd_on_gloo(cfg, device: torch.device) -> bool:
    """PowerSGD's callbacks wait for their next all-reduce on the process group's own worker threads (torch's
    powerSGD_hook: .get_future().wait() inside a .then() callback), and Gloo has two of them: two buckets'
    callbacks waiting at once deadlock the step. Seen on 2026-12-01 in the full tier (a 1-worker run in
    process hung in Reducer::finalize_backward, both Gloo threads in PythonFutureWrapper::wait). One bucket
    keeps at most one callback waiting. Gloo's only: on CUDA (NCCL) DDP's buckets stay as it makes them."""
    return cfg.grad_compression == "powersgd" and device.type != "cuda"


def one_bucket_mb(model: torch.nn.Module) -> float:
    """A bucket cap that holds every gradient: DDP then builds one bucket, and rebuilds it as one too (a cap
    of its own also sets the first bucket's, which is otherwise 1 MiB)."""
    return uncompressed_bytes(model) / 2**20 + 1


class DataParallel(Strategy):
    runs_under_gradient_syncing_launcher = True

    def wrap_model(self, model, hooks):
        self.model = model
        if hooks.syncs_gradients:  # the launcher's optimizer averages the gradients (Horovod)
            self.ddp = None
            return hooks.wrap_model(model)
        # Stock DDP at every world size, 1 included: the study's 1-GPU baseline ran DDP under torchrun.
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        buckets = {"bucket_cap_mb": one_bucket_mb(model)} if powersgd_on_gloo(hooks.cfg, self.device) else {}
        self.ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=device_ids, static_graph=hooks.cfg.ddp_static_graph, **buckets)
        self.compression_hook = None
        if hooks.cfg.grad_compression != "none":
            self.compression_hook = CountingHook(hooks.cfg.grad_compression, hooks.cfg.powersgd_rank)
            self.ddp.register_comm_hook(None, self.compression_hook.hook)
        return self.ddp

    def gradient_sync(self, optimizer_steps: int) -> dict | None:
        if self.ddp is None:  # the launcher's optimizer syncs (Horovod): its hooks say what it sends
            return None
        if self.compression_hook is None:
            return {"bytes_per_step": uncompressed_bytes(self.model), "counted": "every trainable gradient"}
        return {"bytes_per_step": self.compression_hook.bytes_sent / max(optimizer_steps, 1),
                "counted": "by the communication hook"}

    def gradient_sync_skipped(self):
        # DDP's own: the gradients accumulate locally, and the next backward outside it all-reduces them.
        return self.ddp.no_sync() if self.ddp is not None else contextlib.nullcontext()

    def full_state(self, optimizer):
        if self.rank != 0:  # every rank holds the same state; rank 0's is the one written
            return None
        return self.model.state_dict(), optimizer.state_dict()

    def load_full_state(self, model_state, optimizer_state, optimizer):
        self.model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
