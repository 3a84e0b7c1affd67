"""fsdp and fsdp_no_reshard: FSDP2 (torch.distributed.fsdp.fully_shard). Each rank stores a shard of
every parameter, its gradient and its optimizer state; a layer's parameters are all-gathered for its
forward and backward, and gradients are reduce-scattered.

- fsdp: parameters resharded after forward and gathered again for backward (ZeRO stage 3-like: the
  least memory, the most traffic).
- fsdp_no_reshard: parameters kept gathered from forward to backward (ZeRO stage 2-like: the whole
  model unsharded during a step, one all-gather fewer per layer).

Each encoder layer is its own FSDP unit (so one layer at a time is gathered), the root holds the
embeddings, pooler and classifier.
"""

from __future__ import annotations

import contextlib

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from trainer.strategies.base import DistributedTensorState


class _FullyShardedData(DistributedTensorState):
    reshard_after_forward: bool
    collective_evaluation = True  # the sharded model gathers its layers in every forward, validation too

    def wrap_model(self, model, hooks):
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        for layer in model.base_model.encoder.layer:
            fully_shard(layer, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        self.model = model
        return model

    @property
    def eval_model(self):
        return self.model  # no unsharded copy: that would hold the whole model on every rank

    @contextlib.contextmanager
    def gradient_sync_skipped(self):
        # FSDP2's own: no reduce-scatter in these backwards (the unsharded gradients accumulate); the next
        # backward with sync on reduces them.
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)


class FullyShardedReshardAfterForward(_FullyShardedData):
    reshard_after_forward = True


class FullyShardedNoReshard(_FullyShardedData):
    reshard_after_forward = False
