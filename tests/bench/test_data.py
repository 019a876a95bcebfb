"""`vitlab bench --data`: the loader benchmark on tiny folders and shards made here, vitlab's loader alone and
against timm's. Structure and counting only (images served, images timed, decode failures), never timings."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vitlab.bench.data import DataBenchSettings, run_data_benchmark
from vitlab.cli import main
from vitlab.data.pack import pack_shards

BATCH = 32  # the CLI's default --batch-size
TINY = ["--images", "64", "--image-size", "32", "--repeats", "1"]


def make_folder(root, per_class=16, truncated=False):
    """root/train|val/<class>/*.jpg, two classes, 48x40 JPEGs; with `truncated`, one train JPEG cut in half (its
    header reads, so the folder scan keeps it; its pixels do not decode) in place of a good one."""
    rng = np.random.RandomState(0)
    for split, n in (("train", per_class), ("val", 2)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                pixels = rng.randint(0, 256, (40, 48, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i:02d}.jpg")
    if truncated:
        path = root / "train" / "a" / "00.jpg"
        whole = path.read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("bench-data") / "src")


@pytest.fixture(scope="module")
def shards(tmp_path_factory, folder):
    out = tmp_path_factory.mktemp("bench-shards") / "shards"
    packed = pack_shards(folder, out, shard_size=12_000)  # a few images per shard
    assert packed.shards["train"] > 1
    return out, packed


def run_cli(args, capsys, tmp_path):
    out = tmp_path / "result.json"
    assert main(["bench", *args, "--json", str(out)]) == 0
    return capsys.readouterr().out, json.loads(out.read_text())


def test_folder_prints_rate_and_first_batch(folder, capsys, tmp_path):
    text, res = run_cli(["--data", str(folder), "--workers", "0", *TINY], capsys, tmp_path)
    assert "img/s median" in text and "first batch s median" in text and "| vitlab |" in text
    assert res["source"]["kind"] == "folder" and res["source"]["train_images"] == 32
    [m] = res["measurements"]
    [run] = m["runs"]
    assert run["images"] == 64  # what was asked: 2 batches of 32
    assert run["timed_images"] == 64 - BATCH  # the first batch (one per worker, at least one) is not timed
    assert run["failures"] == 0 and run["first_batch_s"] > 0 and run["images_per_s"] > 0
    assert m["per_worker"] == pytest.approx(m["images_per_s"])  # 0 workers: the main process loads


def test_shards(shards, capsys, tmp_path):
    out, packed = shards
    text, res = run_cli(["--data", str(out), "--workers", "0", *TINY], capsys, tmp_path)
    assert res["source"] == {"kind": "shards", "train_images": packed.counts["train"],
                             "shards": packed.shards["train"], "notes": []}
    assert f"{packed.shards['train']} shards" in text
    assert [r["images"] for r in res["measurements"][0]["runs"]] == [64]


def test_decode_failures_are_counted(tmp_path, capsys):
    """32 training images, one undecodable, 64 images asked: two epochs, so the bad one is drawn (and replaced by
    the next readable image) exactly twice."""
    src = make_folder(tmp_path / "src", truncated=True)
    _, res = run_cli(["--data", str(src), "--workers", "0", *TINY], capsys, tmp_path)
    [run] = res["measurements"][0]["runs"]
    assert run["images"] == 64 and run["failures"] == 2


def test_compare_timm_on_a_folder_alternates_repeats(folder):
    lines = []
    served = []
    res = run_data_benchmark(DataBenchSettings(str(folder), workers=0, images=64, image_size=32, repeats=2,
                                               compare="timm"), on_repeat=lines.append, on_batch=served.append)
    assert [line.split(":")[0] for line in lines] == ["vitlab repeat 1/2", "timm repeat 1/2", "timm repeat 2/2",
                                                      "vitlab repeat 2/2"]
    assert sum(served) == 4 * 64 and served == [BATCH] * 8
    ours, theirs = res.get("vitlab"), res.get("timm")
    assert [r.images for r in ours.runs] == [r.images for r in theirs.runs] == [64, 64]
    assert ours.failures == 0 and theirs.failures is None  # timm's skips are not observable
    ratios = res.ratios()
    pairs = [a.images_per_s / b.images_per_s for a, b in zip(ours.runs, theirs.runs, strict=True)]
    assert ratios["images/s"]["per_repeat"] == pytest.approx(pairs)
    first = [b.first_batch_s / a.first_batch_s for a, b in zip(ours.runs, theirs.runs, strict=True)]
    assert ratios["first batch"]["per_repeat"] == pytest.approx(first)
    table = res.table()
    assert "| timm | timm create_dataset('', root=...) |" in table and "| - |" in table
    assert "vitlab/timm images/s: per repeat" in table and "timm/vitlab seconds to the first batch" in table


def test_compare_timm_on_shards_reads_every_shard_format_timm_accepts(shards):
    out, packed = shards
    res = run_data_benchmark(DataBenchSettings(str(out), workers=0, images=64, image_size=32, repeats=1,
                                               compare="timm"))
    assert [r.images for r in res.get("timm").runs] == [64]
    for note in res.source["notes"]:  # timm given the shard list when it cannot read vitlab's _info.json
        assert "_info.json" in note and "explicit list" in note


@pytest.mark.parametrize("args, message", [
    (["--data", "/no/such/folder"], "does not exist"),
    (["--data", "{src}", "--images", "32", "--workers", "0"], "--images 32 makes 1 batch"),
    (["--data", "digits", "--compare", "timm", "--images", "64", "--workers", "0"], "image folders and WebDataset"),
])
def test_bad_input_is_one_line(args, message, folder, capsys):
    args = [a.replace("{src}", str(folder)) for a in args]
    assert main(["bench", *args, "--image-size", "32", "--repeats", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitlab bench: error:") and message in err and "\n" not in err
