"""Images bounded before they are decoded: a file whose header declares more pixels than the image budget
(VITLAB_MAX_IMAGE_PIXELS, default 8192 x 8192) is skipped and counted where a folder or a dataset is read, and is one
line with exit code 2 when named on the command line, in bounded memory and without touching the file; an image at
the budget converts from 16 bits in bounded memory, to the same 8-bit values as always."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab.cli import main
from vitlab.data import load_split
from vitlab.data.pack import pack_shards
from vitlab.data.sources import decode_rgb
from vitlab.errors import VitlabError

TIMEOUT_S = 300  # a hang check, never a speed assertion
SRC = str(Path(vitlab.__file__).parents[1])  # the subprocesses import the vitlab under test
BUDGET = "67,108,864 pixels"  # the default, in the words of every message
GREY16, RGB8 = (16, 0), (8, 2)  # PNG (bit depth, colour type)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def zeros_png(path: Path, width: int, height: int, kind: tuple[int, int], complete: bool = True) -> Path:
    """A valid PNG of width x height black pixels, written a block of rows at a time: zeros compress ~200-fold
    (13,000 x 13,000 16-bit grey: 338 MB of pixels in a 1.5 MB file). `complete` False: the header and 64 bytes of
    data only, a file that declares the size without the data to decode."""
    depth, colour = kind
    row = 1 + width * (3 if colour == 2 else 1) * depth // 8  # the filter byte, then the samples
    if complete:
        z = zlib.compressobj(1)
        block = b"\0" * row * 64
        data = b"".join(z.compress(block[: row * min(64, height - top)]) for top in range(0, height, 64)) + z.flush()
    else:
        data = zlib.compress(b"\0" * 64)
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", data) +
                     _chunk(b"IEND", b""))
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def small_pngs(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(np.full((8, 8, 3), 40 * i, dtype=np.uint8)).save(folder / f"ok{i}.png")


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    model = vitlab.create_model("ViT-Ti/4", num_classes=2, image_size=8, **TINY_VIT_ARGS)
    path = tmp_path_factory.mktemp("w") / "w.safetensors"
    vitlab.save(model, path)
    return str(path)


def test_a_folder_skips_and_counts_images_over_the_budget(tmp_path, caplog):
    """Under Pillow's own limit (179 M pixels) but over vitlab's: left out at the scan, from the header alone."""
    small_pngs(tmp_path / "train" / "a", 2)
    small_pngs(tmp_path / "train" / "b", 1)
    zeros_png(tmp_path / "train" / "a" / "big16.png", 13_000, 13_000, GREY16, complete=False)
    zeros_png(tmp_path / "train" / "b" / "big8.png", 13_000, 13_000, RGB8, complete=False)
    with caplog.at_level(logging.WARNING, logger="vitlab"):
        split = load_split(str(tmp_path), "train")
    assert len(split) == 3 and not any("big" in p for p in split.paths)
    warned = [r.getMessage() for r in caplog.records if "image budget" in r.getMessage()]
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"skipping 2 image(s) in {tmp_path / 'train'} over the image budget of {BUDGET} (a "
                                "decompression bomb, or an image too large to decode safely; VITLAB_MAX_IMAGE_PIXELS "
                                "raises the budget): ")
    assert "big16.png" in warned[0] and "big8.png" in warned[0]


# /proc/self/status of a subprocess, in bytes: VmHWM is its peak resident memory (getrusage's ru_maxrss is not: it
# keeps the peak of the process it was forked from across exec)
STATUS = """
import re
def status(field):
    return int(re.search(field + r':\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)) * 1024
"""

BOUNDED = STATUS + """
import json, resource, sys
import torch, vitlab.api, vitlab.cli, vitlab.eval.prediction  # mapped before the limit
resource.setrlimit(resource.RLIMIT_AS, (status('VmSize') + 2**30, status('VmSize') + 2**30))
weights, small, images = sys.argv[1], sys.argv[2], sys.argv[3:]
vitlab.cli.main(['predict', '--weights', weights, small])  # the model loaded once: the floor
floor = status('VmHWM')
codes = []
for image in images:
    codes.append(vitlab.cli.main(['predict', '--weights', weights, image]))
    print('--', file=sys.stderr)
print(json.dumps({'codes': codes, 'grown': status('VmHWM') - floor}))
"""


def test_predict_refuses_a_named_file_over_the_budget_in_one_line_and_bounded_memory(weights, tmp_path):
    """13,000 x 13,000 PNGs of zeros (16-bit grey, 8-bit RGB): exit code 2, one line naming the file, its size, the
    budget and how to raise it, the peak memory of the process unchanged (it would decode 338 and 507 MB and, in
    16 bits, widen them to gigabytes), the file untouched."""
    big = [zeros_png(tmp_path / f"big{depth}.png", 13_000, 13_000, (depth, colour)) for depth, colour in (GREY16, RGB8)]
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "small.png")
    before = [digest(p) for p in big]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("VITLAB_MAX_IMAGE_PIXELS", None)
    proc = subprocess.run([sys.executable, "-c", BOUNDED, weights, str(tmp_path / "small.png"), *map(str, big)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    runs = [part.strip().splitlines() for part in proc.stderr.split("--\n")[:2]]
    runs[0] = runs[0][1:]  # after the small image's summary line
    for path, lines in zip(big, runs, strict=True):
        assert lines[-1:] == [f"vitlab predict: error: cannot read image {path}: ImageTooLarge: 13,000 x 13,000 = "
                              "169,000,000 pixels, over the budget of 67,108,864 pixels an image may have; raise it "
                              "with VITLAB_MAX_IMAGE_PIXELS=N if this image is wanted"], lines
        assert len(lines) == 1, lines  # Pillow's own decompression-bomb warning is not repeated before it
    assert result["codes"] == [2, 2]
    assert result["grown"] < 64 * 2**20, result  # nothing decoded: the smaller image alone is 338 MB
    assert [digest(p) for p in big] == before


CONVERT = STATUS + """
import json, sys
import numpy as np
from vitlab.data.sources import decode_rgb
path, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
floor = status('VmHWM')
rgb = decode_rgb(path)
grown = status('VmHWM') - floor
out = np.asarray(rgb)
x = np.arange(width, dtype=np.int64)
exact = out.shape == (height, width, 3)
for y in range(0, height, 97):  # rows from every slice the conversion may take
    values = (x * 16 + y) % 65536
    values[-1] = 65535
    want = (values * 255 + 32767) // 65535
    exact = exact and all(np.array_equal(out[y, :, c], want) for c in range(3))
print(json.dumps({'grown': grown, 'exact': bool(exact)}))
"""


def test_a_16_bit_image_at_the_budget_converts_exactly_in_bounded_memory(tmp_path, monkeypatch):
    """A 16-bit PNG exactly at the budget (set to its size here) decodes to the rounded 8-bit values (0 -> 0,
    65535 -> 255) with a peak below 4 x its 8-bit RGB size: no 64-bit copy of the whole image."""
    width = height = 4096
    values = np.arange(width, dtype=np.uint16)[None, :] * np.uint16(16) + np.arange(height, dtype=np.uint16)[:, None]
    values[:, -1] = 65535  # (x * 16 + y) mod 65536, and the top of the range
    Image.fromarray(values).save(tmp_path / "g16.png", compress_level=1)
    del values
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONDONTWRITEBYTECODE": "1",
           "VITLAB_MAX_IMAGE_PIXELS": str(width * height)}
    proc = subprocess.run([sys.executable, "-c", CONVERT, str(tmp_path / "g16.png"), str(width), str(height)],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["exact"]
    assert result["grown"] < 4 * 3 * width * height, result
    monkeypatch.setenv("VITLAB_MAX_IMAGE_PIXELS", str(width * height - 1))  # one pixel fewer: refused
    with pytest.raises(Image.DecompressionBombError, match="4,096 x 4,096 = 16,777,216 pixels, over the budget of "
                       "16,777,215 "):
        decode_rgb(tmp_path / "g16.png")


def test_the_budget_is_set_by_the_environment(weights, tmp_path, monkeypatch, capsys):
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "x.png")
    monkeypatch.setenv("VITLAB_MAX_IMAGE_PIXELS", "1000")
    assert main(["predict", "--weights", weights, str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"vitlab predict: error: cannot read image {tmp_path / 'x.png'}: ImageTooLarge: 32 x 32 = 1,024 pixels, over "
        "the budget of 1,000 pixels an image may have; raise it with VITLAB_MAX_IMAGE_PIXELS=N if this image is "
        "wanted"]
    monkeypatch.setenv("VITLAB_MAX_IMAGE_PIXELS", "1024")
    assert main(["predict", "--weights", weights, str(tmp_path / "x.png")]) == 0
    capsys.readouterr()
    for wrong in ("lots", "0", "-5", "1e9"):
        monkeypatch.setenv("VITLAB_MAX_IMAGE_PIXELS", wrong)
        with pytest.raises(VitlabError) as refused:  # not a ValueError, which readers take for a broken file
            decode_rgb(tmp_path / "x.png")
        assert not isinstance(refused.value, ValueError)
        assert str(refused.value) == (f"VITLAB_MAX_IMAGE_PIXELS must be an integer in [1, 1000000000], got {wrong!r}; "
                                      "set it to the most pixels an image may have, e.g. 67108864 (the default), or "
                                      "unset it")
    small_pngs(tmp_path / "d" / "a", 1)
    assert main(["predict", "--weights", weights, str(tmp_path / "d")]) == 2  # a folder: one line, not a skip
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "vitlab predict: error: VITLAB_MAX_IMAGE_PIXELS must be an integer")


@pytest.fixture
def folder_with_big_image(tmp_path) -> Path:
    small_pngs(tmp_path / "src" / "train" / "a", 3)
    small_pngs(tmp_path / "src" / "train" / "b", 3)
    small_pngs(tmp_path / "src" / "val" / "a", 1)
    small_pngs(tmp_path / "src" / "val" / "b", 1)
    zeros_png(tmp_path / "src" / "train" / "b" / "zz_big.png", 10_000, 10_000, GREY16, complete=False)
    return tmp_path / "src"


def test_predict_skips_an_image_over_the_budget_under_a_folder(weights, folder_with_big_image, caplog, capsys):
    with caplog.at_level(logging.WARNING, logger="vitlab"):
        assert main(["predict", "--weights", weights, str(folder_with_big_image)]) == 0
    big = folder_with_big_image / "train" / "b" / "zz_big.png"
    warned = [r.getMessage() for r in caplog.records if "zz_big" in r.getMessage()]
    assert warned == [f"skipping unreadable image {big} (ImageTooLarge: 10,000 x 10,000 = 100,000,000 pixels, over "
                      "the budget of 67,108,864 pixels an image may have; raise it with VITLAB_MAX_IMAGE_PIXELS=N if "
                      "this image is wanted)"]
    assert "predicted 8 images, skipped 1 unreadable" in capsys.readouterr().err


def test_analyze_refuses_a_named_image_over_the_budget_in_one_line(weights, folder_with_big_image, tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setattr(vitlab.cli, "VERB_MODULES", ["analyze"])
    big = folder_with_big_image / "train" / "b" / "zz_big.png"
    assert main(["analyze", "--weights", weights, "--images", str(big), "--out", str(tmp_path / "o")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"vitlab analyze: error: cannot read image {big}: 10,000 x 10,000 = 100,000,000 pixels, over "
                     "the budget of 67,108,864 pixels an image may have; raise it with VITLAB_MAX_IMAGE_PIXELS=N if "
                     "this image is wanted"]


def test_packing_skips_and_counts_an_image_over_the_budget(folder_with_big_image, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="vitlab"):
        result = pack_shards(folder_with_big_image, tmp_path / "wds")
    assert result.counts == {"train": 6, "val": 2}
    big = folder_with_big_image / "train" / "b" / "zz_big.png"
    assert result.skipped == [f"{big} (over the image budget)"]
    warned = [r.getMessage() for r in caplog.records if "zz_big" in r.getMessage()]
    assert warned == [f"skipped 1 undecodable image(s) (1 over the image budget of {BUDGET}: VITLAB_MAX_IMAGE_PIXELS "
                      f"raises it), not packed: {big} (over the image budget)"]
