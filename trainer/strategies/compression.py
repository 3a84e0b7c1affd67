"""Gradient compression on DDP's all-reduce (grad_compression): torch's own communication hooks, fp16 and bf16
compression and PowerSGD, each wrapped to count the bytes it hands to all-reduce, so a run records what its
gradient sync sent per optimizer step (result.json's gradient_sync). Strategies ddp and zero1 (DDP's buckets);
Horovod's fp16 compression is its launcher's (trainer/launchers/horovod.py)."""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

# PowerSGD's error feedback and warm start need a first step or more of plain all-reduce (torch refuses < 2).
POWERSGD_START_ITER = 2
# torch's default: a matrix is compressed only where rank x (rows + columns) x 2 < rows x columns.
POWERSGD_MIN_COMPRESSION_RATE = 2


class CountingHook:
    """A DDP communication hook (`hook`) that compresses as `compression` says, counting the bytes sent."""

    def __init__(self, compression: str, powersgd_rank: int):
        self.compression = compression
        self.bytes_sent = 0
        self.state = None
        if compression == "powersgd":
            self.state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=powersgd_rank,
                start_powerSGD_iter=POWERSGD_START_ITER, min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE)

    def hook(self, state, bucket):
        if self.compression == "fp16":
            self.bytes_sent += bucket.buffer().numel() * 2
            return default_hooks.fp16_compress_hook(None, bucket)
        if self.compression == "bf16":
            self.bytes_sent += bucket.buffer().numel() * 2
            return default_hooks.bf16_compress_hook(None, bucket)
        self.bytes_sent += self._powersgd_bytes(bucket)
        return powerSGD_hook.powerSGD_hook(self.state, bucket)

    def _powersgd_bytes(self, bucket) -> int:
        """What powerSGD_hook sends for this bucket: the whole buffer while it warms up; afterwards each
        gradient viewed as rows x columns either whole (1-D, or where compressing would not pay) or as its
        two factors P (rows x rank) and Q (columns x rank), in the gradient's dtype."""
        if self.state.iter < self.state.start_powerSGD_iter:
            return bucket.buffer().numel() * bucket.buffer().element_size()
        sent, rank = 0, self.state.matrix_approximation_rank
        for gradient in bucket.gradients():
            size = gradient.element_size()
            if gradient.ndim <= 1:
                sent += gradient.numel() * size
                continue
            rows = gradient.shape[0]
            columns = gradient.numel() // rows
            low_rank = min(rows, columns, rank)
            if low_rank * (rows + columns) * self.state.min_compression_rate < rows * columns:
                sent += low_rank * (rows + columns) * size
            else:
                sent += rows * columns * size
        return sent


def uncompressed_bytes(model: torch.nn.Module, element_size: int | None = None) -> int:
    """What one all-reduce of every trainable gradient sends, each in its own dtype (or `element_size`)."""
    return sum(parameter.numel() * (element_size or parameter.element_size())
               for parameter in model.parameters() if parameter.requires_grad)
