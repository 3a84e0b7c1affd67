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

from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from trainer.strategies.base import Strategy


class _FullyShardedData(Strategy):
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

    def full_state(self, optimizer):
        # cpu_offload: the whole state lands on rank 0 alone, in host memory (the others get {}).
        model_state, optimizer_state = get_state_dict(
            self.model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return (model_state, optimizer_state) if self.rank == 0 else None

    def load_full_state(self, model_state, optimizer_state, optimizer):
        # The core has already sent the one checkpoint to every rank (no shared disk), so each rank
        # cuts its own shards from the whole state; broadcast_from_rank0 would send it a second time.
        set_state_dict(self.model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state,
                       options=StateDictOptions(full_state_dict=True))


class FullyShardedReshardAfterForward(_FullyShardedData):
    reshard_after_forward = True


class FullyShardedNoReshard(_FullyShardedData):
    reshard_after_forward = False
