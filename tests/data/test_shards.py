"""WebDataset shards: `vitlab shards` packing (counts, skipped images, atomic resume), reading back the exact
source bytes, indexes built once and cached, one-line errors for broken shards, and training on shards giving
the losses training on the source folder gives."""

from __future__ import annotations

import io
import json
import logging
import shutil
import tarfile

import numpy as np
import pytest
from PIL import Image

from tests.conftest import TINY_VIT_FLAGS
from vitlab.cli import main
from vitlab.data import DataError, load_split, shardindex
from vitlab.data import shards as shards_mod
from vitlab.data.pack import pack_shards, parse_size
from vitlab.data.shards import open_shard_set, shard_split

CLASSES = ("ant", "bee", "cat")


def make_source(root, per_class=13, val_per_class=2, corrupt=True):
    """root/train|val/<class>/ with PNGs and JPEGs of varied sizes; with `corrupt`, one file that is not an image
    and one truncated JPEG (its header reads, its pixels do not)."""
    rng = np.random.RandomState(0)
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.randint(0, 256, (16 + i, 20 + c, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:02d}.{'png' if i % 2 else 'jpg'}")
    bad = []
    if corrupt:
        (root / "train" / "ant" / "zz_garbage.jpg").write_bytes(b"not an image at all")
        whole = (root / "train" / "bee" / "00.jpg").read_bytes()
        (root / "train" / "bee" / "zz_truncated.jpg").write_bytes(whole[: len(whole) // 2])
        bad = [str(root / "train" / "ant" / "zz_garbage.jpg"), str(root / "train" / "bee" / "zz_truncated.jpg")]
    return root, bad


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    base = tmp_path_factory.mktemp("shards")
    src, bad = make_source(base / "src")
    out = base / "out"
    result = pack_shards(src, out, parse_size("6KB"))
    return src, out, bad, result


def test_parse_size():
    assert parse_size("1GB") == 10**9 and parse_size("256MB") == 256 * 10**6 and parse_size("512MiB") == 2**29
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError, match="not a size"):
        parse_size("big")


def test_pack_counts_and_skips_corrupt(tmp_path, caplog, capsys):
    src, bad = make_source(tmp_path / "src")
    with caplog.at_level(logging.WARNING, logger="vitlab.data"):
        assert main(["shards", str(src), str(tmp_path / "out"), "--shard-size", "6KB"]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and all(p in warnings[0] for p in bad)  # one line naming both files
    info = json.loads((tmp_path / "out" / "_info.json").read_text())
    assert info["class_names"] == list(CLASSES)
    train, val = info["splits"]["train"], info["splits"]["val"]
    assert sum(train["shard_lengths"]) == 3 * 13 and sum(val["shard_lengths"]) == 3 * 2
    assert len(train["filenames"]) >= 3 and train["filenames"][0] == "train-000000.tar"
    for name, n in zip(train["filenames"], train["shard_lengths"], strict=True):
        with tarfile.open(tmp_path / "out" / name) as tar:  # counted independently of the index
            assert len([m for m in tar.getnames() if m.endswith(".cls")]) == n
    assert "train: 39 images" in capsys.readouterr().out


def test_samples_read_back_equal_the_source(packed):
    src, out, bad, _ = packed
    split = shard_split(open_shard_set(str(out)), "train")
    folder = load_split(str(src), "train")
    kept = [i for i, p in enumerate(folder.paths) if p not in bad]  # the folder reader keeps the truncated JPEG
    assert len(split) == len(kept) == 39
    from pathlib import Path

    by_key = {f"{Path(p).parent.name}/{Path(p).stem}": j for j, p in enumerate(folder.paths)}
    ids = [by_key[k] for k in split.keys]  # a key is the file's <class>/<name>: traced back to it by eye
    assert sorted(ids) == kept and ids != kept  # every good file once, packed in a shuffled order
    tars = {p: tarfile.open(p) for p in split.shards}
    for i, j in enumerate(ids):
        source = open(folder.paths[j], "rb").read()
        assert split.read_bytes(i) == source
        ext = folder.paths[j].rsplit(".", 1)[1]
        tar = tars[split.shards[split.shard_of[i]]]
        assert tar.extractfile(f"{split.keys[i]}.{ext}").read() == source  # tarfile's own reading agrees
        assert int(tar.extractfile(f"{split.keys[i]}.cls").read()) == split.labels[i] == folder.labels[j]
        np.testing.assert_array_equal(np.asarray(split.load(i)), np.asarray(Image.open(folder.paths[j]).convert("RGB")))
    for tar in tars.values():
        tar.close()
    assert len(shard_split(open_shard_set(str(out)), "val")) == 6


def test_jpeg_draft_decoding_matches_the_folder_reader(tmp_path):
    folder = tmp_path / "src" / "train" / "a"
    folder.mkdir(parents=True)
    Image.fromarray(np.random.RandomState(1).randint(0, 256, (96, 128, 3), dtype=np.uint8)).save(folder / "x.jpg")
    pack_shards(tmp_path / "src", tmp_path / "out", 10**6)
    shard = load_split(str(tmp_path / "out"), "train")
    ref = load_split(str(tmp_path / "src"), "train")
    assert shard.load(0, 24).size == ref.load(0, 24).size == (32, 24)  # drafted at 1/4 scale
    np.testing.assert_array_equal(np.asarray(shard.load(0, 24)), np.asarray(ref.load(0, 24)))


def test_rerun_is_a_noop_and_resumes_after_a_lost_shard(packed, tmp_path):
    src, out, _, first = packed
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in copy.glob("*.tar")}
    again = pack_shards(src, copy, parse_size("6KB"))
    assert again.written == 0 and again.counts == first.counts
    assert {p.name: p.stat().st_mtime_ns for p in copy.glob("*.tar")} == {k: v[0] for k, v in before.items()}
    last = sorted(copy.glob("train-*.tar"))[-1]
    last.unlink()
    resumed = pack_shards(src, copy, parse_size("6KB"))
    assert resumed.written == 1 and resumed.counts == first.counts
    assert last.read_bytes() == before[last.name][1]  # the same shard again, byte for byte
    assert {p.name for p in copy.glob("*.tar")} == set(before)


def _copy_tars(out, dest, prefix="train"):
    dest.mkdir()
    for p in sorted(out.glob(f"{prefix}-*.tar")):
        shutil.copy(p, dest / p.name)
    return sorted(dest.glob("*.tar"))


def test_brace_pattern_and_folder_of_tars_are_indexed_once(packed, tmp_path, monkeypatch):
    _, out, _, _ = packed
    reference = shard_split(open_shard_set(str(out)), "train")
    tars = _copy_tars(out, tmp_path / "plain")
    pattern = str(tmp_path / "plain" / f"train-{{000000..{len(tars) - 1:06d}}}.tar")
    for data in (pattern, str(tmp_path / "plain")):
        split = load_split(data, "train")
        assert (tmp_path / "plain" / "_vitlab_index.json").is_file()
        np.testing.assert_array_equal(split.labels, reference.labels)
        np.testing.assert_array_equal(split.offsets, reference.offsets)
        assert split.read_bytes(5) == reference.read_bytes(5)

    def no_scan(path):
        raise AssertionError(f"{path} scanned again")

    monkeypatch.setattr(shardindex, "scan_shard", no_scan)  # the cached index serves every later start
    assert len(load_split(pattern, "train")) == len(reference)


@pytest.mark.parametrize("info_name", ["_info.json", "_info.yaml"])
def test_timm_style_info_without_offsets(packed, tmp_path, info_name):
    """timm's info file (JSON, or the YAML some wds datasets ship) lists shards and their lengths but no byte
    offsets: the index is built once from the tar headers, and lengths that disagree with the shards, or a file
    that does not parse, are one line."""
    import yaml

    _, out, _, _ = packed
    tars = _copy_tars(out, tmp_path / "timm")
    counts = [len(shard_split(open_shard_set(str(t)), "train")) for t in tars]
    info = {"name": "tiny", "splits": {"train": {"name": "train", "num_samples": sum(counts),
                                                 "filenames": [t.name for t in tars], "shard_lengths": counts}}}
    dump = json.dumps if info_name.endswith(".json") else yaml.safe_dump
    (tmp_path / "timm" / info_name).write_text(dump(info))
    split = load_split(str(tmp_path / "timm"), "train")
    assert len(split) == 39 and split.class_names == ["0", "1", "2"]
    assert (tmp_path / "timm" / "_vitlab_index.json").is_file()
    info["splits"]["train"]["shard_lengths"][0] += 1
    (tmp_path / "timm" / info_name).write_text(dump(info))
    with pytest.raises(DataError, match=f"train-000000.tar holds .* samples, {info_name} says"):
        load_split(str(tmp_path / "timm"), "train")
    (tmp_path / "timm" / info_name).write_text('{"splits": [unclosed\n')
    with pytest.raises(DataError, match=rf"{info_name} is not a shard info file .*; re-run vitlab shards"):
        load_split(str(tmp_path / "timm"), "train")


def _tar(path, members):
    with tarfile.open(path, "w") as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


def test_broken_shards_give_one_line_errors(packed, tmp_path, capsys):
    _, out, _, _ = packed
    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, format="PNG")
    (tmp_path / "nolabel").mkdir()
    _tar(tmp_path / "nolabel" / "train-000000.tar", [("s1.png", png.getvalue()), ("s1.cls", b"0"),
                                                     ("s2.png", png.getvalue())])
    with pytest.raises(DataError, match=r"train-000000.tar sample s2 has no label"):
        load_split(str(tmp_path / "nolabel"), "train")
    tars = _copy_tars(out, tmp_path / "cut")
    with tarfile.open(tars[0]) as tar:
        image = [m for m in tar.getmembers() if not m.name.endswith(".cls")][-1]
    tars[0].write_bytes(tars[0].read_bytes()[: image.offset_data + image.size // 2])  # cut inside the last image
    with pytest.raises(DataError, match=r"truncated .*train-000000.tar.* sample (ant|bee|cat)/\d+ runs past"):
        load_split(str(tmp_path / "cut"), "train")
    cut_info = tmp_path / "cut_info"
    shutil.copytree(out, cut_info)
    shard = cut_info / "train-000001.tar"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(DataError, match=r"truncated shard .*train-000001.tar"):
        load_split(str(cut_info), "train")
    assert main(["train", "--data", str(cut_info), "--out", str(tmp_path / "run"), *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "truncated shard" in err[0] and "train-000001.tar" in err[0]


TINY = [*TINY_VIT_FLAGS,
        "--image-size", "8", "--batch-size", "8", "--warmup", "1", "--workers", "0", "--log-every", "1", "--steps",
        "3", "--seed", "3"]


def _losses(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["split"], r["loss"], r.get("grad_norm")) for r in rows if "loss" in r]


def test_training_on_shards_is_the_same_with_any_number_of_workers(tmp_path, capsys):
    """The stream order and each worker's part of a step depend on (seed, step) only: training on shards with
    no worker process and with two gives the same losses and gradients. (That the batches hold the packed
    files' pixels is tests/data/test_stream.py's.)"""
    src, _ = make_source(tmp_path / "src", per_class=5, corrupt=False)
    assert main(["shards", str(src), str(tmp_path / "out"), "--shard-size", "3KB"]) == 0
    assert main(["train", "--data", str(tmp_path / "out"), "--out", str(tmp_path / "a"), *TINY]) == 0
    assert main(["train", "--data", str(tmp_path / "out"), "--out", str(tmp_path / "b"), *TINY, "--workers", "2"]) == 0
    none, two = _losses(tmp_path / "a"), _losses(tmp_path / "b")
    assert [r[0] for r in none].count("train") == 3 and none == two  # train losses, gradients, val loss


def test_missing_val_split_is_one_line(packed, tmp_path, capsys):
    _, out, _, _ = packed
    _copy_tars(out, tmp_path / "trainonly")
    assert main(["train", "--data", str(tmp_path / "trainonly"), "--out", str(tmp_path / "r"), *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no val split" in err[0] and "--val-fraction" in err[0]


def test_hyperrule_probe_reads_image_sizes_from_shards(packed):
    from vitlab.train.recipes import typical_image_size

    src, out, _, _ = packed
    assert typical_image_size(load_split(str(out), "train")) == typical_image_size(load_split(str(src), "train"))


def test_preempted_shard_run_resumes_bit_exactly(packed, tmp_path, sigterm_during_step):
    """SIGTERM during step 3 of a run on shards, then --resume: the same weights as the uninterrupted run (the
    batches are a function of (seed, step), so the shard reader must serve sample i identically after resume)."""
    from tests.train.test_checkpoint import same_weights, tiny
    from vitlab.train import run

    _, out, _, _ = packed
    data = dict(data=str(out), steps=5, batch_size=8, eval_batch_size=64)
    reference = run(tiny(tmp_path / "ref", **data))
    with sigterm_during_step(3):
        assert run(tiny(tmp_path / "run", **data)).status == "preempted"
    resumed = run(tiny(tmp_path / "run", resume=True, **data))
    assert resumed.status == "completed" and same_weights(reference.weights, resumed.weights)


def test_pattern_inside_a_packed_folder_uses_its_info(packed, tmp_path):
    _, out, _, _ = packed
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    split = load_split(str(copy / "train-{000000..000001}.tar"), "train")
    assert split.class_names == list(CLASSES) and not (copy / "_vitlab_index.json").exists()
    info = json.loads((copy / "_info.json").read_text())
    assert len(split) == sum(info["splits"]["train"]["shard_lengths"][:2])


def test_split_names_from_shard_file_names():
    assert shards_mod._split_of("train-000001.tar") == "train"
    assert shards_mod._split_of("imagenet22k-validation-0003.tar") == "val"
    assert shards_mod._split_of("val_12.tar") == "val" and shards_mod._split_of("000001.tar") == "train"


def test_val_split_detection_for_sweeps_and_fewshot(packed, tmp_path):
    from vitlab.data.datasets import has_val_split

    _, out, _, _ = packed
    _copy_tars(out, tmp_path / "trainonly")
    assert has_val_split(str(out)) and not has_val_split(str(tmp_path / "trainonly"))
    assert not has_val_split(str(out / "train-{000000..000001}.tar"))


def test_non_image_payload_is_skipped_with_the_shard_and_sample_named(tmp_path):
    from vitlab.data import EvalTransform, TransformedSplit

    png = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(png, format="PNG")
    (tmp_path / "wds").mkdir()
    _tar(tmp_path / "wds" / "val-000000.tar", [("a.png", png.getvalue()), ("a.cls", b"0"),
                                               ("b.png", b"<html>not an image</html>"), ("b.cls", b"1")])
    split = load_split(str(tmp_path / "wds"), "val")
    batch = TransformedSplit(split, EvalTransform((8, 8))).__getitems__([(0, 0), (1, 0)])
    assert batch["valid"].tolist() == [True, False]  # left out of the evaluation, not a crash
    with pytest.raises(OSError):
        split.load(1)
    assert split.describe(1) == f"{tmp_path / 'wds' / 'val-000000.tar'}:b"


def test_interrupted_pack_resumes_from_shard_sidecars(packed, tmp_path, monkeypatch):
    """Killed before _info.json was written: the shards already complete (sidecar + tar) are kept."""
    from vitlab.data import pack as pack_mod

    src, out, _, first = packed
    real_add, calls = pack_mod._Recorder.add, []

    def add_then_die(self, name, members, consumed):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(name)
        real_add(self, name, members, consumed)

    monkeypatch.setattr(pack_mod, "INFO_EVERY_S", 1e9)
    monkeypatch.setattr(pack_mod._Recorder, "add", add_then_die)
    with pytest.raises(KeyboardInterrupt):
        pack_shards(src, tmp_path / "out", parse_size("6KB"))
    # _info.json holds the settings from the start (a re-run with others is refused) but lists no shard yet
    assert json.loads((tmp_path / "out" / "_info.json").read_text())["splits"] == {}
    assert len(list((tmp_path / "out").glob("*.tar"))) == 3
    monkeypatch.setattr(pack_mod._Recorder, "add", real_add)
    resumed = pack_shards(src, tmp_path / "out", parse_size("6KB"))
    assert resumed.written == sum(first.shards.values()) - 3 and resumed.counts == first.counts
    assert not (tmp_path / "out" / "_pending").exists()
    for p in out.glob("*.tar"):
        assert (tmp_path / "out" / p.name).read_bytes() == p.read_bytes()


def test_json_labels_and_cli_errors(tmp_path, capsys):
    jpg = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(jpg, format="JPEG")
    (tmp_path / "wds").mkdir()
    _tar(tmp_path / "wds" / "000000.tar", [("x/a.jpg", jpg.getvalue()), ("x/a.json", b'{"label": 2}'),
                                           ("x/b.jpg", jpg.getvalue()), ("x/b.cls", b"1\n")])
    split = load_split(str(tmp_path / "wds"), "train")
    assert split.labels.tolist() == [2, 1] and list(split.keys) == ["x/a", "x/b"]
    assert main(["shards", str(tmp_path / "none"), str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["shards", str(tmp_path), str(tmp_path / "out"), "--shard-size", "lots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a size" in err[0]


def test_a_models_class_list_relabels_shards_by_name(packed):
    _, out, _, _ = packed
    plain = load_split(str(out), "val")
    swapped = load_split(str(out), "val", class_names=["cat", "ant", "bee"])
    assert swapped.class_names == ["cat", "ant", "bee"]
    assert [swapped.class_names[v] for v in swapped.labels] == [plain.class_names[v] for v in plain.labels]
    with pytest.raises(DataError, match="classes unknown to the 2 training classes: cat"):
        load_split(str(out), "val", class_names=["ant", "bee"])


def test_val_fraction_holds_out_whole_shards(packed):
    """--val-fraction on shards holds out whole shards (seed 0), the same ones for training and evaluation;
    one shard alone falls back to a stratified share of each class."""
    from vitlab.data import build_datasets
    from vitlab.data.datasets import evaluation_splits

    _, out, _, _ = packed
    whole = shard_split(open_shard_set(str(out)), "train")
    n_shards = len(whole.shards)
    ds = build_datasets(str(out), val_fraction=0.25)
    held_shards = {whole.shards[k] for k in range(n_shards)} - {ds.train.shards[k] for k in set(ds.train.shard_of)}
    assert len(held_shards) == round(0.25 * n_shards) >= 1
    in_val = {(ds.val.shards[s], k) for s, k in zip(ds.val.shard_of, ds.val.keys, strict=True)}
    assert in_val == {(whole.shards[s], k) for s, k in zip(whole.shard_of, whole.keys, strict=True)
                      if whole.shards[s] in held_shards}  # every sample of the held-out shards, nothing else
    assert len(ds.train) + len(ds.val) == len(whole)
    fit = evaluation_splits(str(out), val_fraction=0.25)
    assert list(fit.test.keys) == list(ds.val.keys) and "whole shards, seed 0" in fit.test_source
    one = whole.subset(np.flatnonzero(whole.shard_of == 0), "train")
    keep, held = one.holdout(0.25)
    assert len(keep) + len(held) == len(one) and len(held) >= 1  # stratified within the one shard


def test_timm_reads_vitlab_shards_by_their_info(tmp_path):
    """timm's WebDataset reader (`create_dataset('wds/…')`) takes vitlab's _info.json as it is (each split
    record names itself) and finds every sample's image (`.JPEG` files are packed as `.jpg`) and label."""
    from timm.data import create_dataset  # its wds reader needs webdataset (in the test extra)

    src, _ = make_source(tmp_path / "src", per_class=4, corrupt=False)
    upper = src / "train" / "ant" / "00.jpg"
    upper.rename(upper.with_suffix(".JPEG"))
    pack_shards(src, tmp_path / "out", parse_size("4KB"))
    ours = shard_split(open_shard_set(str(tmp_path / "out")), "train")
    dataset = create_dataset("wds/tiny", root=str(tmp_path / "out"), split="train", is_training=False,
                             batch_size=1)
    labels = sorted(int(label) for _, label in dataset)
    assert labels == sorted(ours.labels.tolist()) and len(labels) == 12
    assert all(k.rsplit(".", 1)[-1] in ("jpg", "png") for k in tarfile.open(ours.shards[0]).getnames()
               if not k.endswith(".cls"))
