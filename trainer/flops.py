"""The model FLOPs of training the classifier, from its shapes: MFU's numerator (issue #55).

Counted as PaLM's MFU and torch's FLOP counter count them: the matrix multiplies (2 FLOPs a
multiply-add) of the forward pass, and twice those for the backward pass (the gradients of both operands);
per review at its own length, so a batch's padding is not model work. Embedding lookups, softmax, layer
norm and activations are left out. The shapes are a BertConfig's numbers; torch is imported only to
measure a CPU's peak (MFU's denominator on a node without a declared GPU peak).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

BACKWARD_PER_FORWARD = 2  # d(input) and d(weight): two multiplies of the forward's size
PEAK_GEMM_SIZE, PEAK_ROUNDS, PEAK_ROUND_S = 512, 5, 0.05


@dataclass(frozen=True)
class EncoderShape:
    """What the FLOPs depend on: a BERT encoder with its pooler and classification head."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_labels: int

    @classmethod
    def of(cls, config: Mapping | object) -> EncoderShape:
        """From a transformers BertConfig, or a mapping with its names."""
        get = config.get if isinstance(config, Mapping) else (lambda name: getattr(config, name))
        return cls(*(int(get(name)) for name in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                                  "num_labels")))


def forward_flops(shape: EncoderShape, length: int) -> int:
    """One review of `length` tokens through the model, forward."""
    return _forward(shape, count=1, tokens=length, squares=length * length)


def training_flops(shape: EncoderShape, lengths: Iterable[int]) -> int:
    """Forward and backward of every review once (one epoch over a split of these token lengths)."""
    lengths = [int(length) for length in lengths]
    forward = _forward(shape, count=len(lengths), tokens=sum(lengths), squares=sum(n * n for n in lengths))
    return (1 + BACKWARD_PER_FORWARD) * forward


def _forward(shape: EncoderShape, count: int, tokens: int, squares: int) -> int:
    """`count` reviews of `tokens` tokens in all (and `squares`, the sum of their squared lengths)."""
    hidden, inner = shape.hidden_size, shape.intermediate_size
    projections = 4 * tokens * hidden * hidden  # query, key, value and the attention output
    attention = 2 * squares * hidden  # scores (Q K^T) and the weighted values, over all heads
    feed_forward = 2 * tokens * hidden * inner
    head = hidden * hidden + hidden * shape.num_labels  # the pooler and the classifier, on [CLS]
    return 2 * (shape.num_hidden_layers * (projections + attention + feed_forward) + count * head)


def measured_cpu_peak() -> tuple[float, str]:
    """(FLOPs per second, how it was measured): fp32 matrix multiplies on this process's torch threads, the
    best of a few short rounds. A CPU has no declared peak a report could trust (its clock, its vector
    units, what the VM passes through), so the run measures the rate its own threads reach."""
    import torch

    size = PEAK_GEMM_SIZE
    left, right = torch.randn(size, size), torch.randn(size, size)
    torch.matmul(left, right)  # the first call pays for allocation
    best = 0.0
    for _ in range(PEAK_ROUNDS):
        count, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < PEAK_ROUND_S:
            torch.matmul(left, right)
            count += 1
        best = max(best, 2 * size**3 * count / elapsed)
    threads = torch.get_num_threads()
    return best, (f"measured: fp32 GEMM {size}x{size} on {threads} thread{'s' if threads > 1 else ''} "
                  f"of rank 0, the best of {PEAK_ROUNDS} rounds of {PEAK_ROUND_S * 1000:.0f} ms")
