"""The training order of a source stored in blocks (tar shards, Arrow files): a stream, as WebDataset readers
read shards, but still a function of (seed, epoch) alone.

A global permutation sends every sample to a random place of a random shard: on a network disk that is one
seek per image. For a source in blocks each epoch's order is instead:

1. the blocks in a random order drawn from (seed, epoch), dealt like cards to `lanes` lanes
   (the k-th block to lane k mod lanes);
2. each lane reads its blocks one after another through a shuffle window: a sample moves at most `window`
   places from where it is stored. That is what a WebDataset shuffle buffer of that size does, but it is
   computed from indices, so resuming at any step decodes nothing it skips;
3. the stream takes `chunk` = batch // lanes consecutive samples from each lane in turn, so a global batch holds
   one chunk of every lane. Process r of W trains on a contiguous W-th of each global batch (loader.StepSampler)
   and so reads only its own lanes' shards; each loader worker takes a contiguous part of its process's share
   (StepSampler `parts`) and so reads only its own lanes' shards too.

The order depends on the blocks, the seed, the epoch and the batch size, never on the number of processes or
workers: the same global batches for any world size, and exact resume from the step alone. Lanes that run out
before the others (blocks differ in length) simply drop out of the rotation until the epoch ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vitlab.data.errors import log

LANES = 16  # blocks read at once per epoch; a global batch mixes this many shards
WINDOW = 1024  # samples: how far the shuffle window moves a sample from its stored place


@dataclass(frozen=True)
class StreamOrder:
    """Callable epoch -> the order (sample indices) in which training reads the source in that epoch."""

    blocks: tuple[int, ...]  # lengths of the runs of consecutive samples stored together, in index order
    seed: int
    batch_size: int  # the global batch: one chunk of every lane
    lanes: int = LANES
    window: int = WINDOW

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", tuple(int(b) for b in self.blocks))
        if not self.blocks or min(self.blocks) < 0 or self.lanes < 1 or self.window < 0 or self.batch_size < 1:
            raise ValueError(f"a stream needs blocks, lanes >= 1, window >= 0 and a batch size; got {self}")

    @property
    def num_lanes(self) -> int:
        return min(self.lanes, len(self.blocks))

    @property
    def chunk(self) -> int:
        return max(1, self.batch_size // self.num_lanes)

    def __call__(self, epoch: int) -> np.ndarray:
        blocks = np.asarray(self.blocks, dtype=np.int64)
        starts = np.cumsum(blocks) - blocks
        rng = np.random.default_rng([self.seed, epoch, 0x5EED])
        dealt = rng.permutation(len(blocks))  # dealt[k]: the k-th block of the epoch, to lane k mod lanes
        lanes = self.num_lanes
        by_lane = np.argsort(np.arange(len(blocks)) % lanes, kind="stable")  # deal positions grouped by lane
        seq, seq_lane = dealt[by_lane], (np.arange(len(blocks)) % lanes)[by_lane]
        lengths = blocks[seq]
        n = int(lengths.sum())
        first = np.cumsum(lengths) - lengths  # where each block starts in the lane-major sequence
        index = np.repeat(starts[seq] - first, lengths) + np.arange(n)  # sample indices, lane after lane
        lane = np.repeat(seq_lane, lengths)
        lane_start = np.searchsorted(lane, np.arange(lanes))
        place = np.arange(n) - lane_start[lane]  # position within the lane as stored
        jittered = place + self.window * rng.random(n)  # sorting by this is a shuffle window of `window`
        within = np.lexsort((jittered, lane))  # lane-major, each lane shuffled locally
        index, lane = index[within], lane[within]
        place = np.arange(n) - lane_start[lane]
        turn = (place // self.chunk) * lanes + lane  # the chunks of all lanes in rotation
        return index[np.lexsort((place, turn))]


def sorted_by_label(labels: np.ndarray) -> bool:
    """Whether neighbouring samples share their label far more often than in a random order (a class-sorted
    folder packed as it was listed). Random order: a share of sum_c p_c^2; sorted: nearly 1."""
    labels = np.asarray(labels)
    if len(labels) < 2:
        return False
    same = float(np.mean(labels[1:] == labels[:-1]))
    random = float(np.sum((np.bincount(labels) / len(labels)) ** 2))
    return same > random + (1.0 - random) / 2


def training_order(split: Any, seed: int, batch_size: int, source: str = "the data") -> StreamOrder | None:
    """The stream order for a split stored in blocks, None for a seeded permutation (arrays, image files).
    Storage sorted by class gets the permutation too, with a warning: a stream reads a few blocks at a time,
    so its batches would hold a few classes (WebDataset writers shuffle before writing; `vitlab shards` does)."""
    blocks = split.storage_blocks()
    if blocks is None or not len(blocks):
        return None
    if sorted_by_label(split.labels):
        log.warning("%s stores its samples sorted by class: reading it as a stream would give batches of a few "
                    "classes, so training draws a random permutation instead (one seek per image; re-pack with "
                    "vitlab shards, which shuffles, to stream it)", source)
        return None
    return StreamOrder(tuple(int(b) for b in blocks), seed, batch_size)


__all__ = ["LANES", "WINDOW", "StreamOrder", "sorted_by_label", "training_order"]
