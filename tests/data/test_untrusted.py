"""Data that cannot be turned against the user: a dataset's files stay inside its folder,
sizes read from data files are bounded before anything is allocated (checked under an address-space limit), special
files never block a reader, faults of the storage and of the data are one line, and the silent surprises (stale
cached labels, duplicate keys, shards listed twice, misleading advice) are gone.

Every CLI case asserts the exit code and the one line on stderr; cases that could allocate or hang run in a
subprocess under `resource.setrlimit` with a timeout, so a regression fails instead of exhausting the machine."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.conftest import TINY_VIT_ARGS
from tests.data.test_shards import TINY, make_source
from vitlab.cli import main
from vitlab.data import load_split, shardindex
from vitlab.data.pack import pack_shards, parse_size
from vitlab.data.shards import INDEX_NAME

TIMEOUT_S = 120  # a hang check, never a speed assertion: each case finishes in seconds
HEADROOM_GB = 2  # address space each bounded case may use beyond what its imports mapped


@pytest.fixture(autouse=True)
def private_caches(tmp_path, monkeypatch):
    """No test writes to the user's caches (vitlab's or Hugging Face's)."""
    import datasets

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "vitlab-cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    datasets.disable_progress_bars()


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def digests(root: Path) -> dict[str, str]:
    """Hashes of every regular file under root (what the user owns and vitlab must not change)."""
    return {str(p.relative_to(root)): digest(p) for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def png(k: int, size: tuple[int, int] = (8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((*size, 3), 37 * k % 256, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def samples(n: int, label=lambda k: k % 2) -> list[tuple[str, bytes]]:
    return [m for k in range(n) for m in ((f"s{k}.png", png(k)), (f"s{k}.cls", str(label(k)).encode()))]


def the_error(lines: list[str], verb: str) -> str:
    """The one error line among what stderr holds (warnings may precede it): the last line, the only one that
    starts `vitlab VERB: error:`, and no traceback."""
    errors = [line for line in lines if line.startswith(f"vitlab {verb}: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    assert not any(line.startswith("Traceback") for line in lines), lines
    return errors[0]


def error_line(capsys, verb: str) -> str:
    return the_error(capsys.readouterr().err.strip().splitlines(), verb)


LIMITS = """
import os, re, resource, signal, sys
import datasets, pyarrow.parquet, vitlab.cli, vitlab.data, vitlab.train.trainer  # mapped before any limit
def limit(memory, fsize):
    if memory:  # what the imports mapped plus HEADROOM_GB
        vm = int(re.search(r'VmSize:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + memory * 2**30, vm + memory * 2**30))
    if fsize:  # writes past it fail with EFBIG, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
"""


def isolated(code: str, args: list[str], cwd: Path, cache: Path,
             timeout: int = TIMEOUT_S) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
           "VITLAB_CACHE": str(cache / "vitlab-cache"), "HF_DATASETS_CACHE": str(cache / "hf-cache")}
    return subprocess.run([sys.executable, "-c", LIMITS + code, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def run_isolated(args: list[str], tmp_path: Path, fsize: int = 0) -> tuple[int, list[str]]:
    """`vitlab ARGS` in a subprocess killed after TIMEOUT_S (a hang fails the test instead of blocking it), with
    `fsize` under RLIMIT_FSIZE."""
    proc = isolated(f"limit(0, {fsize})\nsys.exit(vitlab.cli.main(sys.argv[1:]))\n", args, tmp_path, tmp_path)
    return proc.returncode, proc.stderr.strip().splitlines()


BATCH = """
import contextlib, io, json, logging, time
limit(HEADROOM, 0)
results = {}
for name, argv in json.loads(sys.argv[1]).items():
    buf, start = io.StringIO(), time.monotonic()
    with contextlib.redirect_stderr(buf):  # logging's last-resort handler writes to sys.stderr as it is now
        try:
            rc = vitlab.cli.main(argv)
        except BaseException as err:  # MemoryError, RecursionError: what the bounds exist to prevent
            rc = f"{type(err).__name__}: {err}"
    results[name] = {"rc": rc, "stderr": buf.getvalue(), "seconds": time.monotonic() - start}
print(json.dumps(results))
"""


def train_args(data: str, tmp_path: Path, *extra: str) -> list[str]:
    return ["train", "--data", data, "--out", str(tmp_path / "run"), *TINY, *extra]


# ---- security: a dataset's files stay inside its folder ----------------------------------------------------------


def crafted_parquet(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A Parquet dataset whose image rows hold only paths: outside files (absolute, /etc/passwd, ../, a symlink
    inside the folder that points out) and one file inside. Returns (folder, the secret outside, row -> path)."""
    folder = tmp_path / "crafted"
    folder.mkdir()
    secret = tmp_path / "secret.png"
    secret.write_bytes(png(200, (9, 7)))
    (folder / "inside.png").write_bytes(png(100))
    (folder / "link.png").symlink_to(secret)
    paths = {"absolute": str(secret), "etc-passwd": "/etc/passwd", "dotdot": "../secret.png",
             "symlink-out": "link.png", "inside": "inside.png"}
    rows = [{"bytes": png(k), "path": None} for k in range(4)] + [{"bytes": None, "path": p} for p in paths.values()]
    image = pa.array(rows, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    labels = pa.array([k % 2 for k in range(len(rows))], pa.int64())
    pq.write_table(pa.table({"image": image, "label": labels}), folder / "train.parquet")
    return folder, secret, {name: 4 + k for k, name in enumerate(paths)}


@pytest.mark.parametrize("kind", ["absolute", "etc-passwd", "dotdot", "symlink-out"])
def test_hf_image_row_outside_its_folder_is_not_read(tmp_path, kind):
    folder, _, rows = crafted_parquet(tmp_path)
    split = load_split(str(folder), "train")
    with pytest.raises(OSError, match="outside the dataset folder"):
        split.read_bytes(rows[kind])
    assert split.read_bytes(rows["inside"]) == (folder / "inside.png").read_bytes()  # inside: read as before


def test_loader_skips_outside_rows_and_warns_once(tmp_path, caplog):
    from vitlab.data import EvalTransform, TransformedSplit

    folder, _, rows = crafted_parquet(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vitlab"):
        split = load_split(str(folder), "train")
    warned = [r.getMessage() for r in caplog.records if "outside the dataset folder" in r.getMessage()]
    assert len(warned) == 1 and "4 image row(s)" in warned[0] and "/etc/passwd" in warned[0]
    batch = TransformedSplit(split, EvalTransform((8, 8))).__getitems__([(i, 0) for i in range(len(split))])
    assert batch["valid"].tolist() == [i not in {rows[k] for k in rows if k != "inside"} for i in range(len(split))]


def test_shards_of_a_crafted_dataset_copy_nothing_from_outside(tmp_path):
    folder, secret, _ = crafted_parquet(tmp_path)
    before = {**digests(folder), "secret": digest(secret)}
    rc, err = run_isolated(["shards", str(folder), str(tmp_path / "out"), "--shard-size", "1KB"], tmp_path)
    assert rc == 0, err
    assert any("4 image row(s) refer to files outside the dataset folder" in line for line in err), err
    packed = b"".join(p.read_bytes() for p in (tmp_path / "out").glob("*.tar"))
    assert secret.read_bytes() not in packed and Path("/etc/passwd").read_bytes()[:64] not in packed
    assert (folder / "inside.png").read_bytes() in packed  # the row inside the folder is packed byte for byte
    info = json.loads((tmp_path / "out" / "_info.json").read_text())
    assert info["splits"]["train"]["num_samples"] == 5  # 4 rows with bytes + the one inside
    after = {k: v for k, v in digests(folder).items() if not k.startswith("_vitlab_arrow")}
    assert {**after, "secret": digest(secret)} == before


@pytest.mark.parametrize("name", ["../outside.tar", "/tmp/outside.tar", "sub/../../outside.tar"])
def test_shard_info_naming_a_file_outside_its_folder_is_refused(tmp_path, capsys, name):
    root = tmp_path / "wds"
    write_tar(tmp_path / "outside.tar", samples(2))
    root.mkdir()
    (root / "_info.json").write_text(json.dumps({"splits": {"train": {"filenames": [name]}}}))
    assert main(train_args(str(root), tmp_path, "--val-fraction", "0.5")) == 2
    assert "names a shard outside its folder" in error_line(capsys, "train")


def test_dataset_dict_naming_a_split_outside_its_folder_is_refused(tmp_path, capsys):
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature

    rows = {"image": [{"bytes": png(k), "path": None} for k in range(4)], "label": [0, 1, 0, 1]}
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=["a", "b"])})
    Dataset.from_dict(rows, features=features).save_to_disk(tmp_path / "elsewhere")  # a readable dataset outside
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "train").symlink_to(tmp_path / "elsewhere")  # the split folder leads out
    (tmp_path / "hf" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    assert main(train_args(str(tmp_path / "hf"), tmp_path, "--val-fraction", "0.5")) == 2
    assert "a split names a folder outside the dataset" in error_line(capsys, "train")
    assert not (tmp_path / "run" / "model.safetensors").exists()


# ---- bounds: sizes from data files are checked before anything is allocated -------------------------------------


def _deep_json(depth: int = 100_000) -> str:
    return '{"splits": ' + "[" * depth + "]" * depth + "}"


def _billion_laughs() -> str:
    text = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        text += f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]\n"
    return text + "splits: {train: {filenames: *i}}\nclass_names: *i\n"  # 9^9 = 387M values if expanded


def _label_parquet(root: Path, label: int) -> str:
    root.mkdir()
    image = pa.array([{"bytes": png(k), "path": None} for k in range(4)],
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"image": image, "label": pa.array([0, 1, 0, label], pa.int64())}), root / "train.parquet")
    return str(root)


def _info_folder(root: Path, name: str, text: str) -> str:
    write_tar(root / "train-000000.tar", samples(4))
    (root / name).write_text(text)
    return str(root)


def _crafted_index(root: Path) -> str:
    """vitlab's own _info.json whose index gives an image 10^12 bytes (a read would allocate them)."""
    tar = write_tar(root / "train-000000.tar", samples(2))
    entry = {"bytes": tar.stat().st_size, "keys": ["s0", "s1"], "offsets": [512, 2048], "sizes": [10**12, 10],
             "labels": [0, 1]}
    info = {"format": "vitlab-shards", "splits": {"train": {"filenames": [tar.name]}}, "index": {tar.name: entry}}
    (root / "_info.json").write_text(json.dumps(info))
    return str(root)


@pytest.mark.parametrize("entry,says", [
    (["not", "a", "mapping"], "is not a shard index"),
    ({"bytes": 3072, "keys": ["s0", "s1"], "offsets": [512], "sizes": [10, 10], "labels": [0, 1]}, "does not fit"),
    ({"bytes": 3072, "keys": ["s0"], "offsets": [-512], "sizes": [10], "labels": [0]}, "does not fit"),
    ({"bytes": 3072, "keys": ["s0"], "offsets": [512], "sizes": [10], "labels": ["zero"]}, "is not a shard index"),
])
def test_a_crafted_shard_index_is_one_line(tmp_path, capsys, entry, says):
    tar = write_tar(tmp_path / "wds" / "train-000000.tar", samples(2))
    info = {"splits": {"train": {"filenames": [tar.name], "shard_lengths": [2]}}, "index": {tar.name: entry}}
    (tmp_path / "wds" / "_info.json").write_text(json.dumps(info))
    assert main(train_args(str(tmp_path / "wds"), tmp_path, "--val-fraction", "0.5")) == 2
    line = error_line(capsys, "train")
    assert says in line and "train-000000.tar" in line


BOUNDS = {  # case -> (build the data in a folder, what the one line says)
    "cls-1e9": (lambda r: str(write_tar(r / "train-0.tar", samples(4, lambda k: 10**9 if k == 3 else 0)).parent),
                "beyond vitlab's limit of 1,000,000 classes"),
    "cls-1e30": (lambda r: str(write_tar(r / "train-0.tar", samples(4, lambda k: 10**30 if k == 1 else 0)).parent),
                 "beyond vitlab's limit of 1,000,000 classes"),
    "cls-member-100KB": (lambda r: str(write_tar(r / "train-0.tar", [("s0.png", png(0)),
                                                                     ("s0.cls", b" " * 100_000 + b"1")]).parent),
                         "over vitlab's limit of 65,536 for a label"),
    "json-label-deep": (lambda r: str(write_tar(r / "train-0.tar", [("s0.png", png(0)),
                                                                    ("s0.json", b"[" * 50_000)]).parent),
                        "nested too deeply"),
    "arrow-label-1e9": (lambda r: _label_parquet(r / "hf", 10**9), "beyond vitlab's limit of 1,000,000 classes"),
    "brace-1e9": (lambda r: str(r / "train-{000000..999999999}.tar"), "more than vitlab's limit of 1,000,000 files"),
    "brace-product": (lambda r: str(r / "s-{0000..9999}-{0000..9999}.tar"), "more than vitlab's limit of 1,000,000"),
    "yaml-billion-laughs": (lambda r: _info_folder(r / "wds", "_info.yaml", _billion_laughs()),
                            "expands to more than 1,000,000 values"),
    "yaml-deep": (lambda r: _info_folder(r / "wds", "_info.yaml", "splits: " + "[" * 5000), "nested too deeply"),
    "json-info-deep": (lambda r: _info_folder(r / "wds", "_info.json", _deep_json()), "nested too deeply"),
    "dataset-dict-deep": (lambda r: _info_folder(r / "hf", "dataset_dict.json", _deep_json()), "nested too deeply"),
    "index-size-1e12": (lambda r: _crafted_index(r / "wds"), "does not fit the shard"),
}


@pytest.fixture(scope="module")
def bounded_runs(tmp_path_factory) -> tuple[dict, dict]:
    """Every BOUNDS case (and a valid control) run by `vitlab train` in one subprocess under RLIMIT_AS of its
    imports plus HEADROOM_GB: (case -> {rc, stderr, seconds}, case -> (data folder, hashes before))."""
    base = tmp_path_factory.mktemp("bounds")
    argv, made = {}, {}
    for case, (build, _) in BOUNDS.items():
        (base / case / "data").mkdir(parents=True)
        data = build(base / case / "data")
        made[case] = (data, base / case / "data", digests(base / case / "data"))
        argv[case] = train_args(data, base / case, "--val-fraction", "0.5")
    write_tar(base / "control" / "data" / "train-0.tar", samples(8))
    write_tar(base / "control" / "data" / "val-0.tar", samples(4))
    argv["control"] = train_args(str(base / "control" / "data"), base / "control")
    proc = isolated(BATCH.replace("HEADROOM", str(HEADROOM_GB)), [json.dumps(argv)], base, base, 3 * TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), made


@pytest.mark.parametrize("case", list(BOUNDS))
def test_sizes_in_data_files_are_bounded_before_allocation(bounded_runs, case):
    results, made = bounded_runs
    _, says = BOUNDS[case]
    result = results[case]
    assert result["rc"] == 2, result
    line = the_error(result["stderr"].strip().splitlines(), "train")
    assert says in line, line
    data, folder, before = made[case]
    names = ("train-0.tar", "hf[train]: column 'label'", "_info.yaml", "_info.json", "train-000000.tar",
             "dataset_dict.json")
    assert (data in line) if "brace" in case else any(n in line for n in names), line  # the file (or pattern)
    assert {k: v for k, v in digests(folder).items() if "_vitlab_arrow" not in k} == before  # untouched


def test_the_memory_limit_leaves_room_for_real_work(bounded_runs):
    """The bounded cases' limit is not what refuses them: a valid shard set trains under the same limit."""
    results, _ = bounded_runs
    assert results["control"]["rc"] == 0, results["control"]


# ---- hangs: only regular files are read -------------------------------------------------------------------------


@pytest.fixture
def with_fifo(tmp_path):
    src, _ = make_source(tmp_path / "src", per_class=3, val_per_class=1, corrupt=False)
    fifo = src / "train" / "ant" / "zz_fifo.png"
    os.mkfifo(fifo)
    (src / "train" / "bee" / "zz_device.png").symlink_to("/dev/zero")
    import vitlab
    from vitlab.models import ViTConfig, build_model

    weights = tmp_path / "w.safetensors"
    vitlab.save(build_model(ViTConfig(image_size=8, patch_size=4, **TINY_VIT_ARGS,
                                      num_classes=3)), weights)
    return src, fifo, weights


@pytest.mark.parametrize("verb", ["train", "shards", "bench"])
def test_special_files_in_a_folder_are_skipped_not_read(tmp_path, with_fifo, verb):
    src, _, _ = with_fifo
    args = {"train": train_args(str(src), tmp_path),
            "shards": ["shards", str(src), str(tmp_path / "out")],
            "bench": ["bench", "--data", str(src), "--workers", "0", "--images", "16", "--image-size", "8",
                      "--repeats", "1", "--batch-size", "4"]}[verb]
    rc, err = run_isolated(args, tmp_path)  # a FIFO opened for reading would block until the timeout
    assert rc == 0, err
    warned = [line for line in err if "zz_fifo.png" in line]
    assert warned and "zz_device.png" in warned[0], err
    assert ("skipping 2 unreadable" if verb != "shards" else "skipped 2 undecodable") in warned[0]
    assert not any(line.startswith("Traceback") for line in err)


@pytest.mark.parametrize("verb", ["predict", "analyze"])
def test_a_fifo_given_as_an_image_is_one_line(tmp_path, with_fifo, verb):
    _, fifo, weights = with_fifo
    args = {"predict": ["predict", "--weights", str(weights), str(fifo)],
            "analyze": ["analyze", "--weights", str(weights), "--images", str(fifo), "--out", str(tmp_path / "an")]}
    rc, err = run_isolated(args[verb], tmp_path)
    assert rc == 2
    assert "zz_fifo.png is a FIFO, not a regular file" in the_error(err, verb)


def test_library_transforms_refuse_a_fifo_at_once(with_fifo):
    from vitlab.files.reading import open_regular

    _, fifo, _ = with_fifo
    with pytest.raises(OSError, match="is a FIFO"):
        open_regular(fifo)  # in-process: a regression would block here, so it runs after the subprocess checks


def test_a_fifo_named_like_a_shard_is_one_line(tmp_path, capsys):
    (tmp_path / "wds").mkdir()
    write_tar(tmp_path / "wds" / "train-0.tar", samples(4))
    os.mkfifo(tmp_path / "wds" / "train-1.tar")
    assert main(train_args(str(tmp_path / "wds"), tmp_path, "--val-fraction", "0.5")) == 2
    assert "train-1.tar is a FIFO, not a regular file" in error_line(capsys, "train")


# ---- data tracebacks: storage and data faults are one line ----------------------------------------------------


def _refuse_writes_under(root: Path, code: int):
    real = shardindex.atomic_write

    def write(path, fn):
        if Path(path).resolve().is_relative_to(root.resolve()):
            raise OSError(code, os.strerror(code), str(path))
        return real(path, fn)

    return write


def test_read_only_shard_folder_caches_its_index_in_the_vitlab_cache(tmp_path, monkeypatch):
    tars = tmp_path / "ro"
    for k in range(2):
        write_tar(tars / f"train-{k}.tar", samples(3))
    before = digests(tars)
    monkeypatch.setattr(shardindex, "atomic_write", _refuse_writes_under(tars, errno.EROFS))
    first = load_split(str(tars), "train")
    assert len(first) == 6 and not (tars / INDEX_NAME).exists()
    cached = shardindex.fallback_index_path(tars)
    assert cached.is_relative_to(tmp_path / "vitlab-cache") and cached.is_file()

    def no_scan(path):
        raise AssertionError(f"{path} indexed again")

    monkeypatch.setattr(shardindex, "scan_shard", no_scan)
    again = load_split(str(tars), "train")  # served by the cached index
    np.testing.assert_array_equal(again.labels, first.labels)
    assert digests(tars) == before


def test_read_only_shard_folder_and_unusable_cache_still_reads(tmp_path, monkeypatch, caplog):
    tars = tmp_path / "ro"
    write_tar(tars / "train-0.tar", samples(3))
    (tmp_path / "cache-file").write_text("not a folder")
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache-file"))
    monkeypatch.setattr(shardindex, "atomic_write", _refuse_writes_under(tars, errno.EROFS))
    with caplog.at_level(logging.WARNING, logger="vitlab"):
        assert len(load_split(str(tars), "train")) == 3
    assert any("indexed again at every start" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("argv", [
    ["train", "--data", "fractal:2:2", "--out", "{run}", *TINY],
    ["download", "augreg-i21k:ViT-B/16"],
])
def test_vitlab_cache_pointing_at_a_file_is_one_line(tmp_path, monkeypatch, capsys, argv):
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "a-file" / "sub"))
    monkeypatch.setenv("VITLAB_OFFLINE", "1")
    assert main([a.replace("{run}", str(tmp_path / "run")) for a in argv]) == 2
    line = error_line(capsys, argv[0])
    assert "VITLAB_CACHE" in line and "a-file is a file" in line


@pytest.mark.parametrize("rows", ["null rows", "null bytes and path"])
def test_all_null_image_column_is_one_line(tmp_path, capsys, rows):
    value = None if rows == "null rows" else {"bytes": None, "path": None}
    image = pa.array([value] * 4, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    (tmp_path / "hf").mkdir()
    pq.write_table(pa.table({"image": image, "label": pa.array([0, 1, 0, 1], pa.int64())}),
                   tmp_path / "hf" / "train.parquet")
    assert main(train_args(str(tmp_path / "hf"), tmp_path, "--val-fraction", "0.5")) == 2
    assert "the image column 'image' holds no image (all 4 rows are empty)" in error_line(capsys, "train")


def _no_temporaries(out: Path) -> bool:
    return not [p for p in out.rglob("*") if "vitlab-tmp" in p.name]


def test_full_disk_during_shards_is_one_line_and_resumes(tmp_path):
    src, _ = make_source(tmp_path / "src", per_class=6, val_per_class=1, corrupt=False)
    before = digests(src)
    out = tmp_path / "out"
    rc, err = run_isolated(["shards", str(src), str(out), "--shard-size", "2KB"], tmp_path, fsize=6000)
    assert rc == 2
    line = the_error(err, "shards")
    assert "cannot write the shards to" in line and "EFBIG" in line, line
    assert _no_temporaries(out)
    assert main(["shards", str(src), str(out), "--shard-size", "2KB"]) == 0  # resumes after the complete shards
    fresh = tmp_path / "fresh"
    pack_shards(src, fresh, parse_size("2KB"))
    assert digests(out) == digests(fresh) and digests(src) == before


@pytest.mark.parametrize("fault", ["EROFS", "EACCES", "ENOSPC", "parent is a file"])
def test_unwritable_shards_target_is_one_line(tmp_path, monkeypatch, capsys, fault):
    from vitlab.data import pack

    src, _ = make_source(tmp_path / "src", per_class=2, val_per_class=1, corrupt=False)
    out = tmp_path / "out"
    if fault == "parent is a file":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "out"
    else:
        code = getattr(errno, fault)

        def refuse(path, fn):
            raise OSError(code, os.strerror(code), str(path))

        monkeypatch.setattr(pack, "atomic_write", refuse)
    assert main(["shards", str(src), str(out)]) == 2
    line = error_line(capsys, "shards")
    assert "cannot write the shards to" in line and (fault if fault.isupper() else "ENOTDIR") in line
    assert not out.exists() or not list(out.glob("*.tar"))


# ---- silent surprises ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["rewritten in place", "renamed over with the same mtime"])
def test_a_shard_replaced_by_one_of_the_same_size_is_indexed_again(tmp_path, how):
    tar = write_tar(tmp_path / "wds" / "train-0.tar", samples(4, lambda k: k % 2))
    assert load_split(str(tmp_path / "wds"), "train").labels.tolist() == [0, 1, 0, 1]
    new = write_tar(tmp_path / "new.tar", samples(4, lambda k: 1 - k % 2))  # the same bytes count, labels swapped
    assert new.stat().st_size == tar.stat().st_size
    if how == "rewritten in place":
        tar.write_bytes(new.read_bytes())
    else:
        stat = tar.stat()
        os.utime(new, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        os.replace(new, tar)
        assert tar.stat().st_mtime_ns == stat.st_mtime_ns
    assert load_split(str(tmp_path / "wds"), "train").labels.tolist() == [1, 0, 1, 0]


def test_a_member_repeated_in_one_sample_is_refused(tmp_path, capsys):
    write_tar(tmp_path / "wds" / "train-0.tar", [("a.png", png(0)), ("a.cls", b"0"), ("a.png", png(1)),
                                                 ("a.cls", b"1"), ("b.png", png(2)), ("b.cls", b"1")])
    assert main(train_args(str(tmp_path / "wds"), tmp_path, "--val-fraction", "0.5")) == 2
    assert "holds a.png twice in sample a (duplicate keys)" in error_line(capsys, "train")


def test_a_key_that_comes_back_later_is_another_sample(tmp_path, caplog):
    members = [("a.png", png(0)), ("a.cls", b"0"), ("b.png", png(1)), ("b.cls", b"1"), ("a.png", png(2)),
               ("a.cls", b"1")]
    write_tar(tmp_path / "wds" / "train-0.tar", members)
    with caplog.at_level(logging.WARNING, logger="vitlab"):
        split = load_split(str(tmp_path / "wds"), "train")
    assert split.labels.tolist() == [0, 1, 1] and [split.read_bytes(i) for i in range(3)] == [png(0), png(1), png(2)]
    assert any("1 sample key(s) come back after other samples (a)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("listing", [{"train": ["t.tar", "t.tar", "t.tar"]}, {"train": ["t.tar"], "val": ["t.tar"]}])
def test_info_listing_a_shard_more_than_once_is_refused(tmp_path, capsys, listing):
    write_tar(tmp_path / "wds" / "t.tar", samples(4))
    splits = {name: {"filenames": files} for name, files in listing.items()}
    (tmp_path / "wds" / "_info.json").write_text(json.dumps({"splits": splits}))
    assert main(train_args(str(tmp_path / "wds"), tmp_path, "--val-fraction", "0.5")) == 2
    n = len(listing["train"]) if len(listing) == 1 else 2
    assert f"lists shard {tmp_path / 'wds' / 't.tar'} {n} times" in error_line(capsys, "train")


def _advice_case(tmp_path: Path, case: str) -> str:
    root = tmp_path / "d"
    root.mkdir()
    if case == "flat folder":
        for k in range(3):
            (root / f"{k}.png").write_bytes(png(k))
    elif case == "folder of .tar.gz":
        (root / "train-0.tar.gz").write_bytes(b"\x1f\x8b compressed")
    elif case == ".tar.gz file":
        (root / "train-0.tar.gz").write_bytes(b"\x1f\x8b compressed")
        return str(root / "train-0.tar.gz")
    elif case == ".tar.gz pattern":
        for k in range(2):
            (root / f"train-{k}.tar.gz").write_bytes(b"\x1f\x8b compressed")
        return str(root / "train-{0..1}.tar.gz")
    elif case == "other files only":
        (root / "notes.txt").write_text("x")
    elif case == "empty --data":
        return ""
    return str(root)


ADVICE = {"empty folder": "is empty; put the images in", "flat folder": "holds 3 image(s) but no class folders",
          "folder of .tar.gz": "is a compressed tar shard; vitlab reads uncompressed .tar shards",
          ".tar.gz file": "is a compressed tar shard", ".tar.gz pattern": "is a compressed tar shard",
          "other files only": "holds no class folders nor images (found notes.txt)", "empty --data": "--data is empty"}


@pytest.mark.parametrize("case", list(ADVICE))
@pytest.mark.parametrize("verb", ["train", "shards"])
def test_each_unusable_source_gets_its_own_advice(tmp_path, capsys, case, verb):
    data = _advice_case(tmp_path, case)
    argv = train_args(data, tmp_path) if verb == "train" else ["shards", data, str(tmp_path / "out")]
    assert main(argv) == 2
    line = error_line(capsys, verb)
    expected = ADVICE[case] if (verb, case) != ("shards", "empty --data") else "SRC is empty"
    assert expected in line and "no val/" not in line


@pytest.mark.parametrize("label,says", [(b"-1", "sample s3: label -1 is negative; class indices start at 0"),
                                        (b"-7", "label -7 is negative")])
def test_a_negative_label_is_named_as_negative(tmp_path, capsys, label, says):
    members = samples(3) + [("s3.png", png(3)), ("s3.cls", label)]
    write_tar(tmp_path / "wds" / "train-0.tar", members)
    assert main(train_args(str(tmp_path / "wds"), tmp_path, "--val-fraction", "0.5")) == 2
    line = error_line(capsys, "train")
    assert says in line and "reach" not in line


def test_a_label_beyond_the_named_classes_names_the_sample(tmp_path, capsys):
    tar = write_tar(tmp_path / "wds" / "train-0.tar", samples(3, lambda k: 5 if k == 2 else 0))
    info = {"splits": {"train": {"filenames": [tar.name]}}, "class_names": ["a", "b", "c"]}
    (tmp_path / "wds" / "_info.json").write_text(json.dumps(info))
    assert main(train_args(str(tmp_path / "wds"), tmp_path, "--val-fraction", "0.5")) == 2
    assert "train-0.tar sample s2 has label 5 but there are 3 classes (0..2)" in error_line(capsys, "train")


def bomb_png(width: int = 30_000, height: int = 30_000) -> bytes:
    """A valid PNG header declaring width x height pixels (900M: over Pillow's 2 x 89M refusal threshold) and a
    few bytes of data: a decompression bomb as its header announces it, without the memory to make a real one."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + \
        chunk(b"IEND", b"")


def test_a_decompression_bomb_inside_a_shard_is_called_one(tmp_path, capsys, caplog):
    """Shards are decoded only by the loader: its warning names the bomb too."""
    write_tar(tmp_path / "wds" / "train-0.tar", samples(7) + [("s7.png", bomb_png()), ("s7.cls", b"1")])
    write_tar(tmp_path / "wds" / "val-0.tar", samples(2))
    with caplog.at_level(logging.WARNING, logger="vitlab"):
        assert main(train_args(str(tmp_path / "wds"), tmp_path)) == 0
    warned = [r.getMessage() for r in caplog.records if "train-0.tar:s7" in r.getMessage()]
    assert warned and all("over the image budget of 67,108,864 pixels" in w for w in warned)


@pytest.mark.parametrize("verb", ["train", "shards", "train --strict"])
def test_a_decompression_bomb_is_called_one(tmp_path, capsys, caplog, verb):
    src, _ = make_source(tmp_path / "src", per_class=3, val_per_class=1, corrupt=False)
    (src / "train" / "ant" / "zz_bomb.png").write_bytes(bomb_png())
    argv = train_args(str(src), tmp_path) if verb.startswith("train") else ["shards", str(src), str(tmp_path / "o")]
    with caplog.at_level(logging.WARNING, logger="vitlab"):
        rc = main(argv + (["--strict"] if "strict" in verb else []))
    if "strict" in verb:
        assert rc == 2
        line = error_line(capsys, "train")
        assert "over the image budget of 67,108,864 pixels" in line and "zz_bomb.png" in line
        return
    assert rc == 0
    warned = [r.getMessage() for r in caplog.records if "image budget" in r.getMessage()]
    assert len(warned) == 1 and "budget of 67,108,864 pixels" in warned[0] and "zz_bomb.png" in warned[0], warned
