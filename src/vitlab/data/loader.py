"""Loaders whose batches depend only on (seed, step): exact resume, and the same global batch for any number
of processes or workers.

The training stream is an endless concatenation of per-epoch permutations; step s takes stream positions
[s·B, (s+1)·B). Each process takes its slice of that global batch (and each accumulation micro-step its slice
of that), so the union over processes is the global batch a single process would see. Every sample's
augmentation is seeded by its stream position, never by a worker's RNG. Resuming at step s therefore only needs
s: the "data position" stored in checkpoints.

An image that cannot be decoded is handled by what the loader serves. A training batch takes the next readable
image in its place (a batch must stay full, and a resumed run must see the same substitute). An evaluation
batch marks it invalid instead, so that it is left out and not counted: a substitute would be counted twice
and an accuracy over a replaced image is not the accuracy of the split. `UnreadableImages` then reports the
skipped files as one warning, or fails under --strict.
"""

from __future__ import annotations

import atexit
import gc
import random
import signal
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from vitlab.data.errors import describe_paths, log
from vitlab.data.folder import bomb_limit
from vitlab.data.sources import DECODE_ERRORS, PIXELS_ENV, ImageSplit, pixel_budget
from vitlab.data.transforms import EvalTransform, as_size
from vitlab.errors import DataError, setting

Key = tuple[int, int]  # (image index, augmentation seed)
_SUBSTITUTE_TRIES = 16


class TransformedSplit(Dataset):
    """Applies a transform to a split. `__getitems__` returns a whole batch as a dict (the DataLoader calls it
    with one micro-batch of keys), timed so the run can report how fast the data side can go.

    `skip_unreadable`: an undecodable image is marked invalid (evaluation) rather than replaced by the next
    readable one (training). Default: skip for an EvalTransform, replace otherwise."""

    def __init__(self, split: ImageSplit, transform: Any, skip_unreadable: bool | None = None):
        self.split, self.transform = split, transform
        self.skip_unreadable = isinstance(transform, EvalTransform) if skip_unreadable is None else skip_unreadable
        self.reported: set[str] = set()  # files already warned about (main process: a run evaluates often)
        pixel_budget()  # a bad VITLAB_MAX_IMAGE_PIXELS is one line here, not an error in a loader worker

    @property
    def strict(self) -> bool:
        return self.split.strict

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
            except DECODE_ERRORS as err:
                bad.append(self._unreadable(i, err))
        raise OSError(f"{_SUBSTITUTE_TRIES} consecutive unreadable images from {self.split.describe(index)}")

    def _load_or_skip(self, index: int, bad: list[str]) -> Any:
        """The image at `index`, or None (reported in `bad`) if it cannot be decoded."""
        try:
            return self.split.load(index, self.transform.min_source_size)
        except DECODE_ERRORS as err:
            bad.append(self._unreadable(index, err))
            return None

    def _unreadable(self, index: int, err: BaseException) -> str:
        """How an unreadable image is named in warnings: one over the image budget says so (it is not broken data)."""
        if isinstance(err, Image.DecompressionBombError):
            return f"{self.split.describe(index)} (over the image budget of {bomb_limit()}: {PIXELS_ENV} raises it)"
        return self.split.describe(index)

    def __getitems__(self, keys: list[Key]) -> dict[str, Any]:
        start = time.perf_counter()
        bad: list[str] = []
        images, labels, valid = [], [], []
        for index, seed in keys:
            if self.skip_unreadable:
                img, used = self._load_or_skip(index, bad), index
            else:
                img, used = self._load(index, bad)
            # Skipped: a black placeholder keeps the batch's shape; `valid` leaves it out of every sum.
            images.append(self.transform(img, random.Random(seed)) if img is not None else None)
            labels.append(self.split.labels[used])
            valid.append(seed >= 0 and img is not None)  # seed < 0: padding of an evaluation shard
        shape = next((a.shape for a in images if a is not None), (*as_size(self.transform.image_size), 3))
        images = [a if a is not None else np.zeros(shape, dtype=np.uint8) for a in images]
        batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)  # (N, 3, H, W) uint8
        return {
            "images": batch.contiguous(),
            "labels": torch.as_tensor(np.array(labels, dtype=np.int64)),
            "valid": torch.tensor(valid),
            "load_seconds": time.perf_counter() - start,
            "bad": bad,
        }

    def __getitem__(self, key: Key) -> dict[str, Any]:
        return self.__getitems__([key])


class UnreadableImages:
    """An evaluation's account of the images its loader left out: an error at the first one under --strict
    (the split's `strict`), else one warning line naming them when the evaluation ends, each file once per
    loader (a training run evaluates the same split many times)."""

    def __init__(self, loader: Any):
        self.dataset = getattr(loader, "dataset", None)
        self.files: list[str] = []

    def add(self, bad: list[str]) -> None:
        if bad and getattr(self.dataset, "strict", False):
            raise DataError(f"{len(bad)} unreadable image(s) in evaluation: {describe_paths(bad)} "
                            f"({setting('strict')})")
        self.files += bad

    def report(self) -> None:
        seen = getattr(self.dataset, "reported", set())
        new = [f for f in dict.fromkeys(self.files) if f not in seen]
        if new:
            log.warning("evaluation skipped %d unreadable image(s), not counted: %s", len(new), describe_paths(new))
            seen.update(new)


def _keep_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """collate_fn: `__getitems__` already built the batch."""
    return batch


class StepSampler:
    """Batch sampler over training steps [start_step, total_steps): yields this process's micro-batches."""

    def __init__(
        self, num_images: int, global_batch: int, seed: int, start_step: int, total_steps: int,
        rank: int = 0, world: int = 1, accum: int = 1, order: Callable[[int], np.ndarray] | None = None,
        parts: int = 1,
    ):
        """`order`: epoch -> the epoch's sample order (a StreamOrder for shards); default a seeded permutation.
        `parts`: each micro-batch is yielded as that many contiguous parts, one per loader worker (PartsLoader
        joins them again), so that every worker loads a part of every step and, under a StreamOrder, only
        its own lanes' shards."""
        if global_batch % (world * accum):
            raise ValueError(
                f"batch size {global_batch} is not divisible by processes x accumulation = {world} x {accum}"
            )
        self.n, self.batch, self.seed = num_images, global_batch, seed
        self.start, self.total = start_step, total_steps
        self.rank, self.world, self.accum = rank, world, accum
        self.micro = global_batch // (world * accum)
        self.parts = max(1, min(parts, self.micro))
        self.order = order
        self._perm: tuple[int, np.ndarray] | None = None

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            perm = self.order(epoch) if self.order is not None else \
                np.random.default_rng([self.seed, epoch]).permutation(self.n)
            if len(perm) != self.n:
                raise ValueError(f"the epoch order has {len(perm)} samples, the split {self.n}")
            self._perm = (epoch, perm)
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
                keys = [(int(i), int(s)) for i, s in zip(indices[lo : lo + self.micro], seeds, strict=True)]
                bounds = np.linspace(0, len(keys), self.parts + 1).round().astype(int)
                for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                    yield keys[a:b]

    def __len__(self) -> int:
        return (self.total - self.start) * self.accum * self.parts


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


class PartsLoader:
    """Iterates a DataLoader over a StepSampler with `parts` > 1 and joins each micro-batch's parts again. The
    DataLoader hands consecutive batches to its workers in turn, so with as many parts as workers, worker k
    always loads part k: all workers work on the same step (the first batch comes sooner) and each reads its
    own lanes."""

    def __init__(self, loader: DataLoader, parts: int):
        self.loader, self.parts = loader, parts
        self.dataset = loader.dataset

    @property
    def _iterator(self) -> Any:  # the running workers, for shutting them down
        return getattr(self.loader, "_iterator", None)

    def __len__(self) -> int:
        return len(self.loader) // self.parts

    def __iter__(self) -> Iterator[dict[str, Any]]:
        batches = iter(self.loader)
        while True:
            group = []
            for _ in range(self.parts):
                try:
                    group.append(next(batches))
                except StopIteration:
                    if group:
                        raise RuntimeError("a micro-batch ended part-way: sampler and loader disagree") from None
                    return
            yield join_batches(group)


def join_batches(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One batch from consecutive parts (images, labels and valid in order; load time summed over workers)."""
    if len(parts) == 1:
        return parts[0]
    chunks = [p["images"] for p in parts]
    if chunks[0].is_pinned():  # joined straight into pinned memory: one copy, not a join and then a pinning copy
        images = torch.empty((sum(len(c) for c in chunks), *chunks[0].shape[1:]), dtype=chunks[0].dtype,
                             pin_memory=True)
        torch.cat(chunks, out=images)
    else:
        images = torch.cat(chunks)
    return {
        "images": images,
        "labels": torch.cat([p["labels"] for p in parts]),
        "valid": torch.cat([p["valid"] for p in parts]),
        "load_seconds": sum(p["load_seconds"] for p in parts),
        "bad": [f for p in parts for f in p["bad"]],
    }


def _init_worker(worker_id: int) -> None:
    """Workers leave preemption to the main process: it finishes the step, saves a checkpoint and then shuts
    the workers down. A worker killed first would make the main process fail instead.

    The objects a worker inherits from the main process (every one vitlab's imports made) are frozen out of its
    garbage collector: a collection would otherwise walk them all, writing to every page they live on and so
    copying the parent's heap into the worker, which slows a worker's first batch whenever the collection falls
    in the worker rather than in the main process (BENCHMARKS.md "Bounds and choices in the code")."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    gc.freeze()


_WITH_WORKERS: weakref.WeakSet[DataLoader] = weakref.WeakSet()


@atexit.register  # registered after multiprocessing's own exit hook, so it runs first
def _stop_workers_at_exit() -> None:
    """Shut down the workers of loaders still alive at exit. Multiprocessing would terminate them with SIGTERM,
    which they ignore (see _init_worker), and then wait for them forever: a loader dropped mid-epoch by a
    caller that never closed it would hang the interpreter's exit."""
    for loader in list(_WITH_WORKERS):
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()


def make_loader(dataset: TransformedSplit, sampler: Any, workers: int, device: torch.device) -> DataLoader:
    """Worker processes (persistent: no re-fork per evaluation), pinned memory for fast copies to CUDA.
    The loader gets a generator of its own: by default each new iterator draws its base seed from the global
    RNG, which would shift the dropout stream of a resumed run against the uninterrupted one."""
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=_keep_batch,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        worker_init_fn=_init_worker if workers > 0 else None,
        generator=torch.Generator().manual_seed(0),  # unused by the samples: they are seeded per key
    )
    if workers > 0:
        _WITH_WORKERS.add(loader)
    return loader
