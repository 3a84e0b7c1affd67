"""ddp: stock DistributedDataParallel, the study's strategy and the default. Every rank holds the whole
model and optimizer state; gradients are all-reduced (averaged) in buckets during backward."""

from __future__ import annotations

import contextlib

import torch

from trainer.strategies.base import Strategy


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
        return self.ddp

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
