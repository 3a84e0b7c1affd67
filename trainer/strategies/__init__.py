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
    from collections.abc import Mapping

    import torch

    from trainer.config import TrainConfig
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


def pipeline_microbatches(cfg: TrainConfig, world_size: int) -> int:
    """Strategy pipeline's microbatches per step: cfg's, or by default one per stage (the world size)."""
    return cfg.microbatches or world_size


def split_refusal(cfg: TrainConfig, shape: Mapping[str, int], world_size: int) -> str | None:
    """Why cfg's strategy cannot split a model of this shape (Hugging Face config names: num_attention_heads,
    intermediate_size, num_hidden_layers) over world_size workers with cfg's batch, as one line; None when
    it can. The trainer refuses with it before training; the harness before a matrix starts, for every
    shape it knows without loading the model (trainer.config.known_model_shape)."""
    if cfg.strategy == "tensor":
        for count, what in ((shape["num_attention_heads"], "attention heads"),
                            (shape["intermediate_size"], "MLP intermediate size")):
            if count % world_size:
                return (f"strategy: tensor splits the model's {count} {what} over the {world_size} "
                        f"workers, which does not divide them; use a world size that divides {count}, "
                        "or another strategy")
    if cfg.strategy == "pipeline":
        layers = shape["num_hidden_layers"]
        if layers < world_size:
            return (f"strategy: pipeline puts at least one of the model's {layers} encoder layers on each of "
                    f"the {world_size} workers; use at most {layers} workers, or another strategy")
        microbatches, global_batch = pipeline_microbatches(cfg, world_size), cfg.batch_size * world_size
        if global_batch % microbatches:
            return (f"microbatches: {microbatches} does not divide the global batch of {global_batch} "
                    f"(batch_size x {world_size} workers); use a divisor of it")
        if cfg.pipeline_schedule == "1f1b" and microbatches < world_size:
            return (f"microbatches: 1f1b needs at least one per stage ({world_size}), got {microbatches}; "
                    "raise it or use pipeline_schedule gpipe")
    return None
