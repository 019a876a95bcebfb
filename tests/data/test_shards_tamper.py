"""Shard folders read and written as untrusted: a shard replaced by another of the same size is
told apart by its content, not read under its predecessor's labels; `vitlab shards` holds its output folder
against a second packer; settings (--shard-size) are never mixed in one folder, also after an interrupted pack."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitlab.cli import main
from vitlab.data.pack import pack_shards, parse_size
from vitlab.data.shards import open_shard_set, shard_split

SHARD_SIZE = "5KB"


def make_uniform_source(root: Path, classes: int = 3, per_class: int = 12) -> Path:
    """root/c<k>/img<i>.png, every file the same size (uncompressed PNG of 16x16 noise, names of one length), so
    that shards holding as many samples have the same size, as shards of a real set often nearly do."""
    rng = np.random.RandomState(0)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.randint(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"c{c}" / f"img{i:02d}.png", compress_level=0)
    return root


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("uniform")
    src = make_uniform_source(base / "src")
    out = base / "out"
    pack_shards(src, out, parse_size(SHARD_SIZE))
    return src, out


def hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.tar"))}


def same_size_pair(folder: Path) -> tuple[Path, Path]:
    """Two different shards of one size."""
    by_size: dict[int, list[Path]] = {}
    for p in sorted(folder.glob("train-*.tar")):
        by_size.setdefault(p.stat().st_size, []).append(p)
    pair = next(v for v in by_size.values() if len(v) > 1)
    assert pair[0].read_bytes() != pair[1].read_bytes()
    return pair[0], pair[1]


def test_a_shard_replaced_by_another_of_the_same_size_is_refused(packed, tmp_path, capsys):
    """`cp train-00000k.tar train-000000.tar`: read before as k's images under 0's labels, with exit 0."""
    _, out = packed
    shards = tmp_path / "shards"
    shutil.copytree(out, shards)
    first, other = same_size_pair(shards)
    shutil.copyfile(other, first)  # what cp does: same size, new content
    with pytest.raises(ValueError, match="is not the shard its index describes"):
        shard_split(open_shard_set(str(shards)), "train")
    capsys.readouterr()
    run = tmp_path / "run"
    assert main(["train", "--data", str(shards), "--val-fraction", "0.25", "--out", str(run), "--model", "ViT-Ti/4",
                 "--depth", "1", "--width", "32", "--heads", "2", "--mlp-dim", "64", "--image-size", "8",
                 "--batch-size", "8", "--steps", "1", "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert f"shard {first} is not the shard its index describes (its content differs: replaced or modified after " \
           "packing); restore it, or re-pack the shards into a new folder" in err
    assert not (run / "metrics.jsonl").exists()  # nothing trained


def test_an_intact_shard_folder_still_reads_after_being_copied_elsewhere(packed, tmp_path):
    """The fingerprint is of the content alone: a copy (new inodes and times) of the folder reads as before."""
    _, out = packed
    moved = tmp_path / "moved"
    shutil.copytree(out, moved, copy_function=shutil.copyfile)
    split = shard_split(open_shard_set(str(moved)), "train")
    assert len(split) == 36
    assert Counter(split.labels.tolist()) == {0: 12, 1: 12, 2: 12}


def test_a_shard_replaced_in_place_with_its_times_kept_is_indexed_again(packed, tmp_path):
    """A folder of tars without _info.json: the cached index (size, time, inode) is refreshed by content too, so
    `cp -p`-like replacements (same size, same inode, the old modification time) are not read with stale labels."""
    _, out = packed
    plain = tmp_path / "plain"
    plain.mkdir()
    for p in out.glob("*.tar"):
        shutil.copyfile(p, plain / p.name)
    first, other = same_size_pair(plain)
    before = open_shard_set(str(plain)).entries[first]
    replacement = open_shard_set(str(plain)).entries[other]
    st = first.stat()
    with open(first, "r+b") as f:  # in place: the inode stays
        f.write(other.read_bytes())
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the time
    assert (first.stat().st_ino, first.stat().st_size, first.stat().st_mtime_ns) == (st.st_ino, st.st_size,
                                                                                       st.st_mtime_ns)
    after = open_shard_set(str(plain)).entries[first]
    assert after["keys"] == replacement["keys"] != before["keys"]
    assert after["labels"] == replacement["labels"]


def test_a_second_packer_into_the_same_folder_is_refused(packed, tmp_path, capsys):
    src, _ = packed
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / ".vitlab-shards.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a packer at work (the lock `vitlab shards` takes)
        os.write(fd, b"4242\n")
        capsys.readouterr()
        assert main(["shards", str(src), str(out), "--shard-size", SHARD_SIZE]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0
        assert f"{out} is being packed by another vitlab shards (process 4242); wait for it to end, or pack into " \
               "another folder" in err
        assert not list(out.glob("*.tar")) and not (out / "_info.json").exists()  # nothing written
    finally:
        os.close(fd)
    assert main(["shards", str(src), str(out), "--shard-size", SHARD_SIZE]) == 0  # free again: packs
    assert hashes(out) == hashes(packed[1])


def test_another_shard_size_into_a_packed_folder_is_refused(packed, tmp_path, capsys):
    src, out = packed
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = hashes(copy)
    capsys.readouterr()
    assert main(["shards", str(src), str(copy), "--shard-size", "12KB"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{copy} holds shards packed with shard_size 5000, this run asks for 12000" in err
    assert hashes(copy) == before


def test_another_shard_size_after_an_interrupted_pack_is_refused(packed, tmp_path, monkeypatch, capsys):
    """Killed before _info.json was first written: its settings were nowhere, so a re-run with another
    --shard-size adopted the shards written so far and went on with its own size."""
    from vitlab.data import pack as pack_mod

    src, _ = packed
    out = tmp_path / "out"
    real_add, calls = pack_mod._Recorder.add, []

    def add_then_die(self, name, members, consumed):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(name)
        real_add(self, name, members, consumed)

    monkeypatch.setattr(pack_mod, "INFO_EVERY_S", 1e9)
    monkeypatch.setattr(pack_mod._Recorder, "add", add_then_die)
    with pytest.raises(KeyboardInterrupt):
        pack_shards(src, out, parse_size(SHARD_SIZE))
    monkeypatch.setattr(pack_mod._Recorder, "add", real_add)
    before = hashes(out)
    assert len(before) == 2
    capsys.readouterr()
    assert main(["shards", str(src), str(out), "--shard-size", "12KB"]) == 2
    assert "holds shards packed with shard_size 5000, this run asks for 12000" in capsys.readouterr().err
    assert hashes(out) == before
    assert main(["shards", str(src), str(out), "--shard-size", SHARD_SIZE]) == 0  # the same settings resume
    assert hashes(out) == hashes(packed[1])
