"""tensor: tensor parallelism on DTensor (torch.distributed.tensor.parallel), Megatron-style, over all
ranks (tensor degree = world size, no data parallelism). In each encoder layer the attention's query,
key and value and the MLP's first dense are split column-wise (each rank computes its heads and its
slice of the MLP), the attention's and the MLP's output dense row-wise (partial sums, all-reduced).
Embeddings, LayerNorms, pooler and classifier stay whole on every rank.

Every rank sees the same batches: the core asks data_parallel_size, and batches data_parallel_size
shares of the global batch (batch_size x world size, as under every other strategy).
"""

from __future__ import annotations

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trainer.config import ConfigError
from trainer.strategies import split_refusal
from trainer.strategies.base import DistributedTensorState, OneDataShare

# Per encoder layer (HF BertLayer): module path -> how it is split.
_LAYER_PLAN = {
    "attention.self.query": ColwiseParallel(),
    "attention.self.key": ColwiseParallel(),
    "attention.self.value": ColwiseParallel(),
    "attention.output.dense": RowwiseParallel(),
    "intermediate.dense": ColwiseParallel(),
    "output.dense": RowwiseParallel(),
}


class TensorParallel(OneDataShare, DistributedTensorState):
    collective_evaluation = True  # every forward all-reduces the row-wise layers' outputs, validation too

    def wrap_model(self, model, hooks):
        refusal = split_refusal(hooks.cfg, model.config.to_dict(), self.world_size)
        if refusal:
            raise ConfigError(refusal)
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        for layer in model.base_model.encoder.layer:
            parallelize_module(layer, mesh, _LAYER_PLAN)
            # The attention reshapes its projections by these: each rank now holds its heads only.
            attention = layer.attention.self
            attention.num_attention_heads //= self.world_size
            attention.all_head_size //= self.world_size
        self.model = model
        return model

    def build_optimizer(self, optimizer_class, groups, **options):
        # A fused or foreach step refuses a group mixing DTensors (the split layers) with plain tensors
        # (the rest): each group becomes two with the same settings. AdamW is elementwise, so no number
        # changes.
        split = []
        for group in groups:
            for sharded in (True, False):
                params = [p for p in group["params"] if isinstance(p, DTensor) == sharded]
                if params:
                    split.append({**group, "params": params})
        return optimizer_class(split, **options)
