"""ddp: stock DistributedDataParallel, the study's strategy and the default. Every rank holds the whole
model and optimizer state; gradients are all-reduced (averaged) in buckets during backward."""

from __future__ import annotations

import contextlib

import torch

from trainer.strategies.base import Strategy
from trainer.strategies.compression import CountingHook, uncompressed_bytes


class DataParallel(Strategy):
    runs_under_gradient_syncing_launcher = True

    def wrap_model(self, model, hooks):
        self.model = model
        if hooks.syncs_gradients:  # the launcher's optimizer averages the gradients (Horovod)
            self.ddp = None
            return hooks.wrap_model(model)
        # Stock DDP at every world size, 1 included: the study's 1-GPU baseline ran DDP under torchrun.
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                             static_graph=hooks.cfg.ddp_static_graph)
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
