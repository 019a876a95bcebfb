"""Font glyphs: characters rendered from the TrueType fonts matplotlib ships, so a text-like pre-training set of
any size grows on a CPU without a download. `--data fonts:C:N[:SEED]`: C classes (characters), N training and
max(1, N // 10) validation images per class, seed 0 unless given (the grammar and rules of
`fractal:C:N[:SEED]`, data/synthetic.py).

- Class c is the character CHARACTERS[c]: upper-case letters, lower-case letters, symbols, then digits, so any
  C <= 66 holds no digit and pre-training on fonts:C says nothing of the digits a transfer to MNIST asks for.
  Symbols are those every font below draws as itself (Computer Modern puts other glyphs at `<`, `>`, `{`, `}`
  and `$`). Characters alike in some fonts stay distinct classes (`l`, `I` and `1`, or `o`, `O` and `0`, told
  apart only by serifs, width or size), as in real text: a ceiling below 100% on the task.
- Whole fonts are held out: training images come from the 16 TRAIN_FONTS, validation images only from the 5
  VAL_FONTS, one style of each family (DejaVu Sans Bold Oblique, DejaVu Sans Mono Oblique, DejaVu Serif Bold,
  STIX General Italic, Computer Modern Sans), so validation measures recognising a character in a face never
  seen, of a family seen in other styles. matplotlib ships 21 usable fonts (the Display, STIXNonUnicode and
  STIXSize files hold no letters, cmex10 / cmsy10 / cmmi10 put other symbols at ASCII positions, LastResort
  draws boxes): enough for this split, too few to hold out whole families as well.
- An instance draws, from streams seeded by (seed, c, split) (instance i is row i: prefixes, as strokes:), a
  font of its split, a stroke added around the glyph of 0 to MAX_STROKE px at the 4x supersampled size (bolder
  beyond the font's own weight), and one affine map about the centre (rotation within ROTATION, scale in SCALE,
  shear in SHEAR, shift within SHIFT of the frame).
- Rendering: each (font, character, stroke) glyph is drawn once by Pillow's FreeType renderer at FONT_SIZE on a
  canvas 4x RENDER_SIZE, its ink centred; an instance is that canvas under the inverse affine map (nearest
  sample, in C) reduced 4x by averaging, so each pixel is the mean of 16 samples (anti-aliasing). White on
  black, one grey channel (mode 'L'), as strokes: and MNIST; RENDER_SIZE 32 for the same reasons as strokes:.

Rendering is slower than strokes: (a glyph is drawn once and serves every image of its class, so many images per
class render faster) and a large split takes tens of seconds, so splits are cached (compressed .npz; the figures:
BENCHMARKS.md "Synthetic generators", measured by `benchmarks/generators.py`) under
<vitlab cache>/fonts/, keyed by the generator's version, matplotlib's and Pillow's versions (the font files and
their rasteriser) and the spec.
"""

from __future__ import annotations

import io
import string
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vitlab.data import synthetic
from vitlab.data.errors import log
from vitlab.data.sources import ImageSplit
from vitlab.data.synthetic import SyntheticSpec
from vitlab.errors import DataError

RENDER_SIZE = 32
SUPERSAMPLE = 4  # glyphs are drawn and warped at 4x, then averaged down: 16 samples per pixel
FONT_SIZE = 0.62  # em size as a share of the frame: capitals fill about half of it
PREFIX = "fonts:"
CHARACTERS = string.ascii_uppercase + string.ascii_lowercase + "?!#%&@+=*/()[]" + string.digits
TRAIN_FONTS = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSansMono.ttf",
               "DejaVuSansMono-Bold.ttf", "DejaVuSansMono-BoldOblique.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Italic.ttf",
               "DejaVuSerif-BoldItalic.ttf", "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralBolIta.ttf",
               "cmr10.ttf", "cmb10.ttf", "cmti10.ttf", "cmtt10.ttf")
VAL_FONTS = ("DejaVuSans-BoldOblique.ttf", "DejaVuSansMono-Oblique.ttf", "DejaVuSerif-Bold.ttf",
             "STIXGeneralItalic.ttf", "cmss10.ttf")
MAX_STROKE = 3  # px at the supersampled size: up to 0.75 px bolder at RENDER_SIZE
ROTATION = np.radians(12)
SCALE = (0.8, 1.15)
SHEAR = 0.2
SHIFT = 0.1  # in frames
GENERATOR_VERSION = 1  # part of the cache key: bump when anything above or below changes the pixels
_SOURCE = 0x464E  # keeps these generators' streams apart from other sources'


def is_fonts_source(data: str) -> bool:
    return synthetic.is_source(data, PREFIX)


def parse_spec(data: str) -> SyntheticSpec:
    """`fonts:C:N[:SEED]` -> SyntheticSpec; DataError naming the fix for anything else, C > len(CHARACTERS) or
    too large."""
    return synthetic.parse_spec(data, PREFIX, RENDER_SIZE**2, len(CHARACTERS), "the characters every font draws")


def class_names(classes: int) -> list[str]:
    """`U+0041_A` for letters and digits, `U+0023` for symbols (a name safe as a file or folder name)."""
    return [f"U+{ord(ch):04X}_{ch}" if ch.isalnum() else f"U+{ord(ch):04X}" for ch in CHARACTERS[:classes]]


def fonts_of(split: str) -> tuple[str, ...]:
    return TRAIN_FONTS if split == "train" else VAL_FONTS


def font_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


# ---- glyphs and instances --------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def _font(name: str) -> ImageFont.FreeTypeFont:
    path = font_dir() / name
    try:  # read here: given a path it cannot open, Pillow would quietly take a system font of that file name
        data = io.BytesIO(path.read_bytes())
        return ImageFont.truetype(data, round(FONT_SIZE * RENDER_SIZE * SUPERSAMPLE))
    except OSError:
        raise DataError(f"fonts: needs matplotlib's font {path}, which cannot be read; reinstall matplotlib "
                        "(pip install --force-reinstall matplotlib)") from None


@lru_cache(maxsize=512)  # 16 KB each; a class uses at most 84 (21 fonts x 4 strokes), classes come one by one
def glyph(font: str, character: str, stroke: int) -> Image.Image:
    """The character in `font` with `stroke` px added around it, white on black, its ink centred on a canvas of
    SUPERSAMPLE * RENDER_SIZE px."""
    side = SUPERSAMPLE * RENDER_SIZE
    draft = Image.new("L", (2 * side, 2 * side))  # room for any glyph: cut to its ink below
    ImageDraw.Draw(draft).text((side, side), character, fill=255, font=_font(font), anchor="mm",
                               stroke_width=stroke, stroke_fill=255)
    ink = draft.crop(draft.getbbox())
    canvas = Image.new("L", (side, side))
    canvas.paste(ink, ((side - ink.width) // 2, (side - ink.height) // 2))
    return canvas


def inverse_affines(uniform: np.ndarray) -> np.ndarray:
    """(n, 6) Pillow AFFINE data (a, b, c, d, e, f: output pixel (x, y) samples the source at (a x + b y + c,
    d x + e y + f)) of instances' maps about the canvas centre, from their draws uniform[:, 2:7] in [0, 1). The
    forward map is scale * rotation @ [[1, shear], [0, 1]], then the shift; its inverse written out."""
    lerp, side = synthetic.lerp, SUPERSAMPLE * RENDER_SIZE
    angle, scale = lerp(uniform[:, 2], -ROTATION, ROTATION), lerp(uniform[:, 3], *SCALE)
    shear, shift = lerp(uniform[:, 4], -SHEAR, SHEAR), lerp(uniform[:, 5:7], -SHIFT, SHIFT) * side
    cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
    # [[1, -shear], [0, 1]] @ rotation(-angle) / scale
    inverse = np.stack([np.stack([cos + shear * sin, sin - shear * cos], -1), np.stack([-sin, cos], -1)], -2)
    centre = np.full(2, side / 2)
    offset = centre - np.einsum("nij,nj->ni", inverse, centre + shift)  # source: inverse (out - centre - shift)
    return np.stack([inverse[:, 0, 0], inverse[:, 0, 1], offset[:, 0], inverse[:, 1, 0], inverse[:, 1, 1],
                     offset[:, 1]], -1)


def draw_instances(seed: int, c: int, split: str, n: int) -> np.ndarray:
    """(n, 7) draws in [0, 1) of class c's instances 0..n-1 in a split: font, stroke, rotation, scale, shear,
    shift x, shift y. Row i does not depend on n."""
    return synthetic.split_generator(_SOURCE, seed, c, split).random((n, 7))


def render_instances(character: str, split: str, uniform: np.ndarray) -> np.ndarray:
    """(n, RENDER_SIZE, RENDER_SIZE) uint8: instances of a character from their draws (n, 7)."""
    fonts = fonts_of(split)
    font = np.minimum((uniform[:, 0] * len(fonts)).astype(int), len(fonts) - 1)
    stroke = np.minimum((uniform[:, 1] * (MAX_STROKE + 1)).astype(int), MAX_STROKE)
    out = np.empty((len(uniform), RENDER_SIZE, RENDER_SIZE), np.uint8)
    for i, data in enumerate(inverse_affines(uniform).tolist()):
        base = glyph(fonts[font[i]], character, int(stroke[i]))
        out[i] = np.asarray(base.transform(base.size, Image.AFFINE, data, resample=Image.NEAREST).reduce(SUPERSAMPLE))
    return out


def render_split(spec: SyntheticSpec, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images (C * n, RENDER_SIZE, RENDER_SIZE) uint8, labels (C * n,) int64), class-major, of one split."""
    n = spec.count(split)
    images = np.empty((spec.classes * n, RENDER_SIZE, RENDER_SIZE), np.uint8)
    for c in range(spec.classes):
        images[c * n: (c + 1) * n] = render_instances(CHARACTERS[c], split, draw_instances(spec.seed, c, split, n))
    return images, np.repeat(np.arange(spec.classes, dtype=np.int64), n)


# ---- splits ------------------------------------------------------------------------------------------------------


def fonts_splits(data: str) -> tuple[ImageSplit, ImageSplit]:
    """(train, val) of `fonts:C:N[:SEED]`: rendered once and kept in the cache."""
    return _splits(parse_spec(data))


def cache_path(spec: SyntheticSpec) -> Path:
    import matplotlib
    import PIL

    version = f"{GENERATOR_VERSION}-mpl{matplotlib.__version__}-pil{PIL.__version__}"
    return synthetic.cache_path(spec, version, RENDER_SIZE)


@lru_cache(maxsize=2)  # loading a large spec takes a while; the arrays are never modified
def _splits(spec: SyntheticSpec) -> tuple[ImageSplit, ImageSplit]:
    arrays = synthetic.cached_splits(spec, cache_path(spec), (RENDER_SIZE, RENDER_SIZE), lambda: _render_all(spec))
    names = class_names(spec.classes)
    return (ImageSplit("train", arrays["train_labels"], names, arrays=arrays["train_images"]),
            ImageSplit("val", arrays["val_labels"], names, arrays=arrays["val_images"]))


def _render_all(spec: SyntheticSpec) -> dict[str, np.ndarray]:
    if spec.images > 20_000:
        log.info("rendering %s (%d images)", spec.name, spec.images)
    out = {}
    for split in synthetic.SPLITS:
        out[f"{split}_images"], out[f"{split}_labels"] = render_split(spec, split)
    return out


__all__ = ["CHARACTERS", "GENERATOR_VERSION", "PREFIX", "RENDER_SIZE", "TRAIN_FONTS", "VAL_FONTS", "cache_path",
           "class_names", "draw_instances", "fonts_splits", "glyph", "inverse_affines", "is_fonts_source",
           "parse_spec", "render_instances", "render_split"]
