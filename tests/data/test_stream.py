"""The stream order of sources in blocks (vitlab.data.stream): a loop transcription of its three rules, the
locality it promises (each process and worker reads its own shards, a sample moves at most `window`), the
same global batches for any number of processes and workers, and shard batches that hold exactly the images of
the source files the order names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitlab.data import StepSampler, build_datasets
from vitlab.data.loader import PartsLoader, TransformedSplit, join_batches, make_loader
from vitlab.data.pack import pack_shards
from vitlab.data.stream import StreamOrder
from vitlab.data.transforms import EvalTransform


def transcription(blocks, seed, epoch, batch, lanes, window):
    """The documented rules with lists and loops (same random draws, in the same order)."""
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    dealt = list(rng.permutation(len(blocks)))
    lanes = min(lanes, len(blocks))
    starts = [sum(blocks[:b]) for b in range(len(blocks))]
    lane_samples = [[] for _ in range(lanes)]
    for k, b in enumerate(dealt):  # dealt like cards
        lane_samples[k % lanes] += list(range(starts[b], starts[b] + blocks[b]))
    jitter = rng.random(sum(blocks))  # drawn lane after lane, in stored order
    shuffled, used = [], 0
    for samples in lane_samples:
        keys = [j + window * jitter[used + j] for j in range(len(samples))]
        shuffled.append([samples[j] for j in sorted(range(len(samples)), key=lambda j: keys[j])])
        used += len(samples)
    chunk, out, turn = max(1, batch // lanes), [], 0
    while any(turn * chunk < len(s) for s in shuffled):  # one chunk of every lane still reading, in turn
        for s in shuffled:
            out += s[turn * chunk:(turn + 1) * chunk]
        turn += 1
    return np.array(out)


@pytest.mark.parametrize("blocks,batch,lanes,window", [
    ((5, 7, 3, 9, 4), 8, 2, 2), ((10,) * 12, 16, 4, 5), ((1, 30, 2, 0, 8, 8), 6, 16, 0), ((50,), 10, 16, 7),
])
def test_order_equals_a_loop_transcription(blocks, batch, lanes, window):
    for epoch in (0, 3):
        order = StreamOrder(blocks, 11, batch, lanes, window)(epoch)
        np.testing.assert_array_equal(order, transcription(list(blocks), 11, epoch, batch, lanes, window))
        assert sorted(order) == list(range(sum(blocks)))  # every sample once per epoch


def test_epochs_and_seeds_give_other_orders():
    order = StreamOrder((100,) * 20, 0, 64)
    assert not np.array_equal(order(0), order(1))
    assert not np.array_equal(order(0), StreamOrder((100,) * 20, 1, 64)(0))
    np.testing.assert_array_equal(order(2), StreamOrder((100,) * 20, 0, 64)(2))


def test_each_process_and_worker_reads_its_own_shards():
    """64 equal shards, batch 64 over 16 lanes: every global batch is one chunk of 4 from each lane, so each of
    2 processes x 2 workers loads its micro-batch part from 4 lanes, i.e. 4 shards (the lanes' current ones)."""
    blocks = (256,) * 64
    shard = np.repeat(np.arange(64), 256)
    order = StreamOrder(blocks, 5, 64, lanes=16, window=64)
    samplers = [StepSampler(sum(blocks), 64, 5, 0, 40, rank=r, world=2, order=order, parts=2) for r in (0, 1)]
    per_rank = [list(s) for s in samplers]
    shards_of = {(r, w): set() for r in (0, 1) for w in (0, 1)}
    for r in (0, 1):
        for i, part in enumerate(per_rank[r]):
            shards_of[(r, i % 2)] |= {int(shard[k]) for k, _ in part}
            assert len({int(shard[k]) for k, _ in part}) <= 4 + 1  # 4 lanes; a lane may cross into its next shard
    for a in shards_of:
        for b in shards_of:
            if a != b:
                assert not shards_of[a] & shards_of[b], (a, b)  # no shard is read by two workers
    one = [k for part in StepSampler(sum(blocks), 64, 5, 0, 40, order=order) for k in part]
    both = {k for parts in per_rank for part in parts for k in part}
    assert set(one) == both and len(one) == 40 * 64  # the same global batches as one process


def test_a_sample_moves_at_most_the_window_within_its_lane():
    blocks, window = (300,) * 8, 40
    order = StreamOrder(blocks, 2, 16, lanes=4, window=window)(0)
    chunk = 4
    for lane in range(4):  # lane l's samples are the l-th chunk of every turn
        mine = np.concatenate([order[t * 16 + lane * chunk: t * 16 + (lane + 1) * chunk] for t in range(600 // chunk)])
        stored = np.concatenate([np.arange(b * 300, (b + 1) * 300) for b in _lane_blocks(blocks, 2, 0, 4, lane)])
        place = {int(s): j for j, s in enumerate(stored)}
        assert sorted(place) == sorted(int(s) for s in mine)
        assert max(abs(place[int(s)] - j) for j, s in enumerate(mine)) <= window


def _lane_blocks(blocks, seed, epoch, lanes, lane):
    dealt = np.random.default_rng([seed, epoch, 0x5EED]).permutation(len(blocks))
    return dealt[lane::lanes]


def test_parts_join_to_the_micro_batches():
    order = StreamOrder((13, 17, 9), 0, 12)
    whole = list(StepSampler(39, 12, 0, 2, 9, accum=2, order=order))
    parts = list(StepSampler(39, 12, 0, 2, 9, accum=2, order=order, parts=4))
    assert len(parts) == 4 * len(whole)
    assert [sum(parts[4 * i: 4 * i + 4], []) for i in range(len(whole))] == whole
    assert list(StepSampler(39, 12, 0, 5, 9, order=order)) == list(StepSampler(39, 12, 0, 0, 9, order=order))[5:]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from tests.data.test_shards import make_source

    base = tmp_path_factory.mktemp("stream")
    src, _ = make_source(base / "src", per_class=12, corrupt=False)
    pack_shards(src, base / "out", shard_size=3000)
    return src, base / "out"


def test_shard_batches_hold_the_source_images_the_order_names(packed):
    """Two workers, each loading its part: every training image equals the source file the stream order names
    (found by the sample key, the file's <class>/<name>)."""
    src, out = packed
    shards, folder = build_datasets(str(out)).train, build_datasets(str(src)).train
    blocks = shards.storage_blocks()
    assert len(blocks) >= 4 and blocks.sum() == len(shards) == len(folder)
    transform = EvalTransform((8, 8))
    order = StreamOrder(tuple(blocks), 3, 12)
    sampler = StepSampler(len(shards), 12, 3, 0, 6, order=order, parts=2)
    loader = PartsLoader(make_loader(TransformedSplit(shards, transform), sampler, 2, torch.device("cpu")), 2)
    keys = list(StepSampler(len(shards), 12, 3, 0, 6, order=order))
    from pathlib import Path

    by_key = {f"{Path(p).parent.name}/{Path(p).stem}": j for j, p in enumerate(folder.paths)}
    for batch, step_keys in zip(loader, keys, strict=True):
        files = [by_key[shards.keys[i]] for i, _ in step_keys]
        expected = np.stack([transform(folder.load(j, transform.min_source_size), None) for j in files])
        np.testing.assert_array_equal(batch["images"].permute(0, 2, 3, 1).numpy(), expected)
        assert batch["labels"].tolist() == [int(folder.labels[j]) for j in files]


def test_join_batches_keeps_order_and_sums_load_time():
    a = {"images": torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "labels": torch.tensor([1, 2]),
         "valid": torch.tensor([True, False]), "load_seconds": 0.5, "bad": ["x"]}
    b = {"images": torch.ones(1, 3, 4, 4, dtype=torch.uint8), "labels": torch.tensor([3]),
         "valid": torch.tensor([True]), "load_seconds": 0.25, "bad": []}
    j = join_batches([a, b])
    assert j["labels"].tolist() == [1, 2, 3] and j["valid"].tolist() == [True, False, True]
    assert j["images"][2].min() == 1 and j["load_seconds"] == 0.75 and j["bad"] == ["x"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_join_batches_of_pinned_parts_is_pinned():
    parts = [{"images": torch.full((n, 3, 4, 4), n, dtype=torch.uint8).pin_memory(), "labels": torch.arange(n),
              "valid": torch.ones(n, dtype=torch.bool), "load_seconds": 0.0, "bad": []} for n in (2, 3)]
    j = join_batches(parts)
    assert j["images"].is_pinned() and j["images"].shape == (5, 3, 4, 4)
    assert j["images"][:2].eq(2).all() and j["images"][2:].eq(3).all()


def test_a_loader_dropped_mid_epoch_does_not_hang_the_exit():
    """Loader workers ignore SIGTERM (the main process handles preemption); multiprocessing's exit would send
    them SIGTERM and wait forever, so vitlab shuts them down first."""
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from vitlab.data import StepSampler, build_datasets, make_loader\n"
        "from vitlab.data.loader import TransformedSplit\n"
        "from vitlab.data.transforms import EvalTransform\n"
        "train = build_datasets('digits').train\n"
        "loader = make_loader(TransformedSplit(train, EvalTransform((8, 8))), StepSampler(len(train), 8, 0, 0, 50),"
        " 2, torch.device('cpu'))\n"
        "print(next(iter(loader))['images'].shape[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "8", done.stderr


def test_class_sorted_storage_is_not_streamed(caplog):
    """Shards written class after class would give streamed batches of a few classes: such a split is read in
    a random permutation instead, with one warning line; shuffled storage streams."""
    import logging

    from vitlab.data.sources import ImageSplit
    from vitlab.data.stream import sorted_by_label, training_order

    class Blocks(ImageSplit):
        def storage_blocks(self):
            return np.full(10, 60)

    rng = np.random.RandomState(0)
    by_class = np.repeat(np.arange(10), 60)
    shuffled = by_class[rng.permutation(600)]
    assert sorted_by_label(by_class) and not sorted_by_label(shuffled)
    assert sorted_by_label(np.repeat([0, 1], 300)) and not sorted_by_label(rng.randint(0, 2, 600))  # 2 classes
    with caplog.at_level(logging.WARNING, logger="vitlab.data"):
        assert training_order(Blocks("train", by_class, []), 0, 32, "/data/wds") is None
    assert len(caplog.records) == 1 and "/data/wds stores its samples sorted by class" in caplog.text
    order = training_order(Blocks("train", shuffled, []), 0, 32)
    assert isinstance(order, StreamOrder) and order.blocks == (60,) * 10
    assert training_order(ImageSplit("train", shuffled, []), 0, 32) is None  # no blocks: a permutation
