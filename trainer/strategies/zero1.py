"""zero1: ZeRO stage 1, torch's ZeroRedundancyOptimizer over DDP. Gradients are all-reduced as in ddp;
each rank keeps the optimizer state (AdamW's two moments) of its share of the parameters only, steps
that share, and broadcasts the updated parameters to the others."""

from __future__ import annotations

from torch.distributed.optim import ZeroRedundancyOptimizer

from trainer.strategies.ddp import DataParallel


class ZeroStage1(DataParallel):
    runs_under_gradient_syncing_launcher = False  # the launcher's optimizer would not be sharded

    def build_optimizer(self, optimizer_class, groups, **options):
        return ZeroRedundancyOptimizer(groups, optimizer_class=optimizer_class, **options)

    def full_state(self, optimizer):
        optimizer.consolidate_state_dict(to=0)  # a collective: every rank sends its share to rank 0
        return super().full_state(optimizer)

    def load_full_state(self, model_state, optimizer_state, optimizer):
        super().load_full_state(model_state, optimizer_state, optimizer)  # ZeRO keeps this rank's share
        # ZeroRedundancyOptimizer moves every 0-dim state (AdamW's step) to the CPU, which fused AdamW on
        # CUDA refuses (seen on an H200, torch 2.11); the local optimizer's own load puts each where it
        # belongs (a copy: the values stay bit for bit).
        optimizer.optim.load_state_dict(optimizer.optim.state_dict())
