"""What one image costs is bounded by the resize's output, not by the image's aspect ratio: a 109-byte 10000 x 1 PNG
(within the pixel budget) goes through every evaluation resize, `vitlab predict` with a timm-resized model and
`vitlab eval --eval-resize` in bounded memory; the bounded resize gives the pixels of the whole-image resize (within
the float rounding of a resampling box) where both can be computed; icon files whose members declare more pixels than
their directory are refused before a member is decoded."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitlab
import vitlab.data.transforms as transforms
from tests.conftest import TINY_VIT_ARGS
from tests.data.test_image_budget import RGB8, STATUS, zeros_png
from vitlab.data.sources import ImageTooLarge, decode_rgb
from vitlab.data.transforms import EVAL_RESIZES, FEWSHOT_RESIZE, EvalTransform, model_transform

TIMEOUT_S = 300  # a hang check, never a speed assertion
SRC = str(Path(vitlab.__file__).parents[1])
PEAK = 1.5 * 2**30  # the whole process, torch and the model included
GROWTH = 256 * 2**20  # above the process's peak after one small image: the resize's share
RESIZES = (*EVAL_RESIZES, FEWSHOT_RESIZE, "timm:bicubic:0.9", "timm:bilinear:0.875", "timm:bicubic:1.0:squash",
           "timm:lanczos:0.95", "timm:nearest:0.9")
STRIPS = ((10_000, 1), (20_000, 1), (1, 10_000), (1, 20_000))  # (width, height)

PEAKS = STATUS + """
import json, sys
import numpy as np
from PIL import Image
import vitlab, vitlab.cli
from vitlab.data.transforms import model_transform
weights, folder, resizes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
small = folder + '/small.png'
Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(small)
for resize in resizes:  # every import and allocator arena touched once: the floor
    model_transform(224, (0.5,) * 3, (0.5,) * 3, resize)(small)
public = vitlab.transforms(weights)  # the weights' own resize (timm's), as vitlab.transforms gives it
public(small)
vitlab.cli.main(['predict', '--weights', weights, small])
floor = status('VmHWM')
grown = {}
for name in sorted(n for n in __import__('os').listdir(folder + '/val/strip')):
    image = folder + '/val/strip/' + name
    for resize in resizes:
        model_transform(224, (0.5,) * 3, (0.5,) * 3, resize)(image)
        grown[f'{resize} {name}'] = status('VmHWM') - floor
    public(image)
    grown[f'vitlab.transforms {name}'] = status('VmHWM') - floor
    assert vitlab.cli.main(['predict', '--weights', weights, image]) == 0
    grown[f'predict {name}'] = status('VmHWM') - floor
for resize in ('big_vision', 'resize-short-crop'):
    assert vitlab.cli.main(['eval', '--weights', weights, '--data', folder, '--eval-resize', resize]) == 0
    grown[f'eval {resize}'] = status('VmHWM') - floor
assert vitlab.cli.main(['eval', '--weights', weights, '--data', folder]) == 0  # the weights' own (timm's) resize
grown['eval timm'] = status('VmHWM') - floor
assert vitlab.cli.main(['fewshot', '--weights', weights, '--data', folder, '--shots', '1']) == 0
grown['fewshot'] = status('VmHWM') - floor
print(json.dumps({'grown': grown, 'peak': status('VmHWM')}))
"""


def strip_png(path: Path, width: int, height: int) -> Path:
    """A black width x height 8-bit RGB PNG: a few hundred bytes for 10,000 pixels."""
    return zeros_png(path, width, height, RGB8)


def test_every_resize_of_a_one_pixel_strip_stays_in_bounded_memory(tmp_path):
    """10000 x 1, 20000 x 1 and their transposes through every eval resize (`vitlab.transforms`), `vitlab predict`
    with weights evaluated as timm evaluates them, `vitlab eval` (with --eval-resize and with the weights' own timm
    resize) and `vitlab fewshot`: the process's peak stays under 1.5 GB and grows by less than 256 MiB (the short
    side resized first materialised 2.6 GB for 10000 x 1)."""
    for width, height in STRIPS:
        strip_png(tmp_path / "val" / "strip" / f"s{width}x{height}.png", width, height)
    assert (tmp_path / "val" / "strip" / "s10000x1.png").stat().st_size < 1000
    for name in ("other", "strip"):  # a dataset folder has both splits, with the model's classes
        strip_png(tmp_path / "train" / name / "t.png", 8, 8)
    model = vitlab.create_model("ViT-Ti/16", num_classes=2, image_size=224, **TINY_VIT_ARGS)
    model.eval_resize = "timm:bicubic:0.9"  # as a timm name's weights are evaluated
    model.class_names = ["other", "strip"]
    vitlab.save(model, tmp_path / "w.safetensors")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", PEAKS, str(tmp_path / "w.safetensors"), str(tmp_path),
                           json.dumps(RESIZES)], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["grown"]) == len(STRIPS) * (len(RESIZES) + 2) + 4
    over = {k: v for k, v in out["grown"].items() if v > GROWTH}
    assert not over, over
    assert out["peak"] < PEAK, out


@pytest.mark.parametrize("resize", ["big_vision", "timm:bilinear:0.875", "timm:bicubic:0.9", "timm:lanczos:0.9"])
@pytest.mark.parametrize("size", [(224, 224), (8, 8), (32, 48)])
@pytest.mark.parametrize("shape", [(1, 300), (300, 1), (2, 500), (7, 1000), (1000, 3), (64, 48), (1, 1), (2, 2)])
def test_the_bounded_resize_gives_the_whole_image_resize_pixels(monkeypatch, resize, size, shape):
    """The crop's box resampled alone (forced here by a bound of 0 pixels) against the whole image resized and then
    cropped: within 2 grey levels (PIL takes a box as 32-bit floats, which moves a sample by up to ~1e-4 of a pixel
    for a 1000-pixel side), on random noise, the worst case for such a shift."""
    image = Image.fromarray(np.random.default_rng(sum(shape)).integers(0, 256, (*shape, 3), dtype=np.uint8))
    whole = EvalTransform(size, resize)(image).astype(int)
    monkeypatch.setattr(transforms, "MAX_RESIZED_PIXELS", 0)
    boxed = EvalTransform(size, resize)(image).astype(int)
    assert boxed.shape == whole.shape == (*size, 3)
    assert np.abs(boxed - whole).max() <= 2


@pytest.mark.parametrize("resize", RESIZES)
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (1, 2), (2, 1), (1, 5000), (5000, 1), (3, 40_000)])
def test_every_resize_takes_tiny_and_extreme_images(resize, shape):
    """1 x 1, 2 x 2 and strips up to 40,000 : 3 come out at the model's size, every value a grey level of the
    (uniform) source: no resize drops, wraps or invents pixels at the edges of extreme shapes."""
    image = Image.fromarray(np.full((*shape, 3), 77, np.uint8))
    out = EvalTransform((224, 224), resize)(image)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    assert np.abs(out.astype(int) - 77).max() <= 1


# ---- containers: ICO and ICNS members --------------------------------------------------------------------------


def ico_file(path: Path, members: list[bytes]) -> Path:
    """An ICO: its 6-byte header, one 16-byte directory entry per member (256 x 256 in the directory's bytes),
    then the members."""
    offset = 6 + 16 * len(members)
    entries = b""
    for member in members:
        entries += struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(member), offset)
        offset += len(member)
    path.write_bytes(struct.pack("<HHH", 0, 1, len(members)) + entries + b"".join(members))
    return path


def icns_file(path: Path, members: list[tuple[bytes, bytes]]) -> Path:
    """An ICNS: 'icns', its length, then (type code, length, data) blocks."""
    blocks = b"".join(code + struct.pack(">I", 8 + len(data)) + data for code, data in members)
    path.write_bytes(b"icns" + struct.pack(">I", 8 + len(blocks)) + blocks)
    return path


def dib(width: int, height: int) -> bytes:
    """A BMP info header (no file header, as an icon member) declaring width x height, 32 bits, no pixel data."""
    return struct.pack("<IiiHHIIiiII", 40, width, height, 1, 32, 0, 0, 0, 0, 0, 0)


def big_png(tmp_path: Path, side: int = 12_000) -> bytes:
    """A complete side x side black RGB PNG: 144 M pixels (under Pillow's own limit, over vitlab's) in ~0.5 MB."""
    return zeros_png(tmp_path / "member.png", side, side, RGB8).read_bytes()


def small_png_bytes(side: int = 16) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((side, side, 3), 90, np.uint8)).save(out, "PNG")
    return out.getvalue()


def test_an_icon_whose_member_declares_more_pixels_is_refused_before_it_is_decoded(tmp_path):
    """ICO with a PNG icon, ICO with a BMP icon, ICNS with a PNG member, each declaring 12,000 x 12,000 behind a
    directory of 256 x 256 (or the ICNS type code's 1024): ImageTooLarge naming the member, from a path and from
    bytes alike."""
    files = {
        "png.ico": ico_file(tmp_path / "png.ico", [small_png_bytes(), big_png(tmp_path)]),
        "bmp.ico": ico_file(tmp_path / "bmp.ico", [dib(12_000, 24_000)]),
        "png.icns": icns_file(tmp_path / "png.icns", [(b"ic10", big_png(tmp_path))]),
    }
    names = {"png.ico": "icon 1", "bmp.ico": "icon 0", "png.icns": "member 'ic10'"}
    for name, path in files.items():
        for source in (path, io.BytesIO(path.read_bytes())):
            with pytest.raises(ImageTooLarge, match=f"^its {names[name]} declares 12,000 x "):
                decode_rgb(source)


def test_icons_within_the_budget_decode_as_before(tmp_path):
    """Pillow's own ICO and ICNS files, and a hand-made ICO of a 16 x 16 PNG: decoded to the pixels Pillow gives."""
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    image.save(tmp_path / "a.ico", sizes=[(16, 16), (48, 48)])
    image.convert("RGBA").save(tmp_path / "a.icns")
    ico_file(tmp_path / "b.ico", [small_png_bytes()])
    for name in ("a.ico", "a.icns", "b.ico"):
        with Image.open(tmp_path / name) as pillow:
            expected = np.asarray(pillow.convert("RGB"))
        assert np.array_equal(np.asarray(decode_rgb(tmp_path / name)), expected)


ICON_PEAK = STATUS + """
import json, sys
from vitlab.data.sources import decode_rgb, DECODE_ERRORS
floor = status('VmHWM')
refused = []
for path in sys.argv[1:]:
    try:
        decode_rgb(path)
    except DECODE_ERRORS as err:
        refused.append(type(err).__name__)
print(json.dumps({'refused': refused, 'grown': status('VmHWM') - floor}))
"""


def test_an_icon_bomb_costs_no_memory(tmp_path):
    """The refusals above in a subprocess: the peak grows by less than 32 MiB (an ICO of a 12,000 x 12,000 PNG
    made Pillow decode 576 MB as it opened the file)."""
    paths = [ico_file(tmp_path / "png.ico", [big_png(tmp_path)]),
             icns_file(tmp_path / "png.icns", [(b"ic10", big_png(tmp_path))])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", ICON_PEAK, *map(str, paths)], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["refused"] == ["ImageTooLarge", "ImageTooLarge"]
    assert out["grown"] < 32 * 2**20, out


@pytest.mark.parametrize("image", [Image.new("RGB", (0, 0)), Image.new("L", (7, 0)), np.zeros((0, 4, 3), np.uint8)])
def test_vitlab_transforms_refuses_an_image_without_pixels_in_one_line(image):
    """A 0 x 0 (or 7 x 0) image given to the public transform: a ValueError saying so (a ZeroDivisionError before)."""
    transform = model_transform(224, (0.5,) * 3, (0.5,) * 3, "big_vision")
    with pytest.raises(ValueError, match=r"^\d+ x \d+ pixels: an image without pixels cannot be resized$"):
        transform(image)
