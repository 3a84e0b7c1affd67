"""Batches: each rank's share of the tokenized split, grouped by length, padded to its longest member.

Apart from trainer.data (the tokens), which imports no torch: a platform's ETL tasks (Spark's executors'
Python workers, Ray Data's tasks) tokenize with it and would otherwise pay for torch's import.
"""

from __future__ import annotations

import numpy as np
import torch

from trainer.config import TrainConfig
from trainer.data import TokenizedSplit

COMPILED_PAD_MULTIPLE = 64  # length buckets: at most 512/64 = 8 widths, so few graphs to compile or capture
CUDA_PAD_MULTIPLE = 8  # tensor cores


def padding_multiple(cfg: TrainConfig, is_cuda: bool) -> int:
    """What a batch's width is padded to a multiple of: the run's choice, else its compile's or device's."""
    return cfg.pad_to_multiple_of or (
        COMPILED_PAD_MULTIPLE if cfg.compile != "no" else CUDA_PAD_MULTIPLE if is_cuda else 1)


class LengthGroupedBatchSampler(torch.utils.data.Sampler):
    """Batches from this rank's share of a DistributedSampler, grouped by length.

    Each rank takes the sampler's indices for the epoch (so the per-rank split and its seed are
    the sampler's), sorts them by length within groups of `group_batches` batches, cuts
    batches, and shuffles the batch order with a generator seeded by (seed, epoch). Every rank
    uses the same batch order, so at each step all ranks hold batches of similar length.
    """

    def __init__(self, sampler, lengths: np.ndarray, batch_size: int, seed: int, group_batches: int = 64,
                 group_by_length: bool = True):
        self.sampler = sampler
        self.lengths = lengths
        self.batch_size = batch_size
        self.seed = seed
        self.group_batches = group_batches
        self.group_by_length = group_by_length
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self):
        indices = np.fromiter(iter(self.sampler), dtype=np.int64)
        if not self.group_by_length:
            starts = range(0, len(indices), self.batch_size)
            yield from (indices[i:i + self.batch_size].tolist() for i in starts)
            return
        group = self.batch_size * self.group_batches
        batches = []
        for start in range(0, len(indices), group):
            chunk = indices[start:start + group]
            chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]
            batches.extend(chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size))
        order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        yield from (batches[i].tolist() for i in order.tolist())


def validation_batches(lengths: np.ndarray, rank: int, world_size: int, batch_size: int) -> list[list[int]]:
    """This rank's share of the test split, no padding samples, longest first (less padding)."""
    by_length = np.argsort(-lengths, kind="stable")
    mine = by_length[rank::world_size]  # every sample exactly once across ranks; shares differ by <= 1
    return [mine[i:i + batch_size].tolist() for i in range(0, len(mine), batch_size)]


class PaddedBatches(torch.utils.data.Dataset):
    """Indexed by a list of sample indices; returns the batch padded to its longest member."""

    def __init__(self, split: TokenizedSplit, pad_id: int = 0, pad_to_multiple_of: int = 1):
        self.split = split
        self.pad_id = pad_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        starts, lengths = self.split.offsets[indices], self.split.lengths[indices]
        width = int(lengths.max())
        width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = np.full((len(indices), width), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(indices), width), dtype=np.int64)
        for row, (start, length) in enumerate(zip(starts, lengths, strict=True)):
            input_ids[row, :length] = self.split.ids[start:start + length]
            attention_mask[row, :length] = 1
        return {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention_mask),
                "labels": torch.from_numpy(self.split.labels[indices])}
