"""The one interface the training core calls for every strategy."""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict


class Strategy:
    """Wraps the model for training, builds the optimizer, names the model to evaluate, and turns the
    training state into one full state on rank 0 (and back), so the one-file checkpoint serves all."""

    # Whether a launcher whose own optimizer averages the gradients (TrainHooks.syncs_gradients,
    # Horovod) may run it: only where the strategy leaves the gradients to the launcher.
    runs_under_gradient_syncing_launcher = False
    # True when evaluating gathers weights across ranks: then every rank runs as many validation
    # forwards as the rank with the most batches (shares differ by one sample), or the others wait.
    collective_evaluation = False
    # Whether fp16's GradScaler may scale the loss: its skipped steps must agree on every rank, which holds
    # where every rank sees every gradient's inf (all-reduced or gathered), not where ranks hold disjoint
    # parameters and check only their own (pipeline stages).
    supports_loss_scaling = True

    def __init__(self, name: str, device: torch.device, rank: int, world_size: int):
        self.name, self.device, self.rank, self.world_size = name, device, rank, world_size
        self.model: torch.nn.Module | None = None

    @property
    def data_parallel_size(self) -> int:
        """How many distinct shares of the data the ranks train and validate on: one per rank unless
        ranks split the model and so see the same batches (tensor parallelism: 1)."""
        return self.world_size

    @property
    def data_parallel_rank(self) -> int:
        """Which of those shares this rank sees (0 <= it < data_parallel_size)."""
        return self.rank

    @property
    def reports_metrics(self) -> bool:
        """Whether this rank computes the loss and logits it counts (pipeline: the last stage only). Of
        the ranks that see a share and report, the lowest counts it in the global metrics."""
        return True

    def wrap_model(self, model: torch.nn.Module, hooks) -> torch.nn.Module:
        """The module to train (its forward and backward synchronise as the strategy does)."""
        raise NotImplementedError

    @property
    def eval_model(self) -> torch.nn.Module:
        """The module validation runs (no gradient sync needed): the bare model by default."""
        return self.model

    def build_optimizer(self, optimizer_class: type[torch.optim.Optimizer], groups: list[dict],
                        **options) -> torch.optim.Optimizer:
        """The optimizer over the parameter groups the core chose (after wrap_model)."""
        return optimizer_class(groups, **options)

    def gradient_sync_skipped(self) -> contextlib.AbstractContextManager:
        """The context of a micro-step whose gradients are kept, not yet synchronised (gradient accumulation's
        micro-steps before the last of a step): the strategy's own way to skip its gradient all-reduce; none
        to skip where ranks see the same batches or a launcher's optimizer syncs (Horovod counts passes)."""
        return contextlib.nullcontext()

    def gradient_sync(self, optimizer_steps: int) -> dict | None:
        """What this rank's gradient all-reduce sent per optimizer step over the run ({bytes_per_step,
        counted}), where the strategy's gradients go through one (ddp, zero1); None elsewhere."""
        return None

    def forward_backward(self, batch: dict, forward, backward, autocast) -> torch.Tensor:
        """One step's forward and backward on this rank's batch: the loss to report (the batch's mean).
        forward(batch) and backward(loss, batch) are the core's; autocast() its precision context."""
        loss = forward(batch)
        backward(loss, batch)
        return loss

    def logits(self, model: torch.nn.Module, batch: dict, autocast) -> torch.Tensor | None:
        """Validation's logits for this batch from the eval model; None on a rank that holds none."""
        with autocast():
            return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    def full_state(self, optimizer: torch.optim.Optimizer) -> tuple[dict, dict] | None:
        """(model state, optimizer state), whole, on rank 0; None elsewhere. Every rank calls it."""
        raise NotImplementedError

    def load_full_state(self, model_state: dict, optimizer_state: dict,
                        optimizer: torch.optim.Optimizer) -> None:
        """Restore what full_state gave; every rank calls it with the whole state."""
        raise NotImplementedError


class OneDataShare:
    """For a strategy whose ranks split the model between them (tensor, pipeline): every rank sees the same
    batches, one data-parallel share of the whole global batch. Mixed in before the Strategy base."""

    @property
    def data_parallel_size(self) -> int:
        return 1

    @property
    def data_parallel_rank(self) -> int:
        return 0


class DistributedTensorState(Strategy):
    """For a strategy whose parameters are DTensors (sharded across ranks): the whole state gathered
    and restored by torch.distributed.checkpoint.state_dict."""

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
