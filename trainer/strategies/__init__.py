"""Parallelism strategies: how the one training core spreads the model, its gradients and its optimizer
state over the workers. One module per strategy behind one interface (base.Strategy); the core asks
the strategy and names none.

The names exist once, here: TrainConfig's `strategy` choices and result.json's enum read them.
No torch at import time: trainer.config imports this list, and the Spark driver imports the config.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from trainer.strategies.base import Strategy

DEFAULT = "ddp"
# name -> (module, class), in the order results and reports list them.
_REGISTRY = {
    "ddp": ("ddp", "DataParallel"),
    "zero1": ("zero1", "ZeroStage1"),
    "fsdp": ("fsdp", "FullyShardedReshardAfterForward"),
    "fsdp_no_reshard": ("fsdp", "FullyShardedNoReshard"),
    "tensor": ("tensor", "TensorParallel"),
    "pipeline": ("pipeline", "PipelineParallel"),
}
NAMES = tuple(_REGISTRY)


def load(name: str, device: torch.device, rank: int, world_size: int) -> Strategy:
    """The strategy called `name` (one of NAMES; the config has checked it), for this rank."""
    module_name, class_name = _REGISTRY[name]
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, class_name)(name, device, rank, world_size)
