"""Loaders whose batches depend only on (seed, step): exact resume, and the same global batch for any number
of processes or workers.

The training stream is an endless concatenation of per-epoch permutations; step s takes stream positions
[s·B, (s+1)·B). Each process takes its slice of that global batch (and each accumulation micro-step its slice
of that), so the union over processes is the global batch a single process would see. Every sample's
augmentation is seeded by its stream position, never by a worker's RNG. Resuming at step s therefore only needs
s: the "data position" stored in checkpoints.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .sources import DECODE_ERRORS, ImageSplit

Key = tuple[int, int]  # (image index, augmentation seed)
_SUBSTITUTE_TRIES = 16


class TransformedSplit(Dataset):
    """Applies a transform to a split. `__getitems__` returns a whole batch as a dict (the DataLoader calls it
    with one micro-batch of keys), timed so the run can report how fast the data side can go."""

    def __init__(self, split: ImageSplit, transform: Any):
        self.split, self.transform = split, transform

    def __len__(self) -> int:
        return len(self.split)

    def _load(self, index: int, bad: list[str]) -> tuple[Any, int]:
        """The image at `index`, or, if it cannot be decoded, the next readable one (deterministic, so that a
        resumed run sees the same substitute); each failure is reported once per batch in `bad`."""
        n = len(self.split)
        for k in range(_SUBSTITUTE_TRIES):
            i = (index + k) % n
            try:
                return self.split.load(i, self.transform.min_source_size), i
            except DECODE_ERRORS:
                bad.append(self.split.describe(i))
        raise OSError(f"{_SUBSTITUTE_TRIES} consecutive unreadable images from {self.split.describe(index)}")

    def __getitems__(self, keys: list[Key]) -> dict[str, Any]:
        start = time.perf_counter()
        bad: list[str] = []
        images, labels = [], []
        for index, seed in keys:
            img, used = self._load(index, bad)
            images.append(self.transform(img, random.Random(seed)))
            labels.append(self.split.labels[used])
        batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)  # (N, 3, H, W) uint8
        return {
            "images": batch.contiguous(),
            "labels": torch.as_tensor(np.array(labels, dtype=np.int64)),
            "valid": torch.tensor([seed >= 0 for _, seed in keys]),  # False: padding of an evaluation shard
            "load_seconds": time.perf_counter() - start,
            "bad": bad,
        }

    def __getitem__(self, key: Key) -> dict[str, Any]:
        return self.__getitems__([key])


def _keep_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """collate_fn: `__getitems__` already built the batch."""
    return batch


class StepSampler:
    """Batch sampler over training steps [start_step, total_steps): yields this process's micro-batches."""

    def __init__(
        self, num_images: int, global_batch: int, seed: int, start_step: int, total_steps: int,
        rank: int = 0, world: int = 1, accum: int = 1,
    ):
        if global_batch % (world * accum):
            raise ValueError(
                f"batch size {global_batch} is not divisible by processes x accumulation = {world} x {accum}"
            )
        self.n, self.batch, self.seed = num_images, global_batch, seed
        self.start, self.total = start_step, total_steps
        self.rank, self.world, self.accum = rank, world, accum
        self.micro = global_batch // (world * accum)
        self._perm: tuple[int, np.ndarray] | None = None

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n))
        return self._perm[1]

    def global_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(image indices, stream positions) of step's global batch."""
        positions = np.arange(step * self.batch, (step + 1) * self.batch, dtype=np.int64)
        epochs, offsets = positions // self.n, positions % self.n
        indices = np.empty_like(positions)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            indices[sel] = self._permutation(int(epoch))[offsets[sel]]
        return indices, positions

    def __iter__(self) -> Iterator[list[Key]]:
        for step in range(self.start, self.total):
            indices, positions = self.global_batch(step)
            for j in range(self.accum):
                lo = (j * self.world + self.rank) * self.micro
                seeds = (self.seed << 40) + positions[lo : lo + self.micro]  # unique per draw, any epoch
                yield [(int(i), int(s)) for i, s in zip(indices[lo : lo + self.micro], seeds, strict=True)]

    def __len__(self) -> int:
        return (self.total - self.start) * self.accum


class ShardSampler:
    """Evaluation: this process's share (every world-th image), in order, in batches. Shorter shards are
    padded with keys marked invalid (seed -1) so that every process runs the same number of forward passes
    (FSDP needs all of them in each one) while sums over processes count every image exactly once."""

    def __init__(self, num_images: int, batch_size: int, rank: int = 0, world: int = 1):
        per_rank = -(-num_images // world)
        keys = [(i, 0) for i in range(rank, num_images, world)]
        self.keys = keys + [(0, -1)] * (per_rank - len(keys))
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[list[Key]]:
        for lo in range(0, len(self.keys), self.batch_size):
            yield self.keys[lo : lo + self.batch_size]

    def __len__(self) -> int:
        return -(-len(self.keys) // self.batch_size)


def _ignore_sigterm(worker_id: int) -> None:
    """Workers leave preemption to the main process: it finishes the step, saves a checkpoint and then shuts
    the workers down. A worker killed first would make the main process fail instead."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def make_loader(dataset: TransformedSplit, sampler: Any, workers: int, device: torch.device) -> DataLoader:
    """Worker processes (persistent: no re-fork per evaluation), pinned memory for fast copies to CUDA.
    The loader gets a generator of its own: by default each new iterator draws its base seed from the global
    RNG, which would shift the dropout stream of a resumed run against the uninterrupted one."""
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=_keep_batch,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        worker_init_fn=_ignore_sigterm if workers > 0 else None,
        generator=torch.Generator().manual_seed(0),  # unused by the samples: they are seeded per key
    )
