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

import numpy as np

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


__all__ = ["LANES", "WINDOW", "StreamOrder"]
