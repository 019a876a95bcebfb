"""`fonts:C:N[:SEED]`: characters rendered from matplotlib's TrueType fonts, instances jittered, whole fonts held
out for validation."""

from __future__ import annotations

import json
import string

import numpy as np
import pytest
from matplotlib.ft2font import FT2Font

from tests.conftest import TINY_VIT_FLAGS
from vitlab.cli import main
from vitlab.data import DataError, build_datasets, load_split
from vitlab.data import fontglyphs as G
from vitlab.data.datasets import evaluation_splits, has_val_split
from vitlab.data.synthetic import SyntheticSpec

TINY = [*TINY_VIT_FLAGS,
        "--image-size", "16", "--batch-size", "16", "--warmup", "1", "--workers", "0", "--log-every", "1"]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A fresh vitlab cache and no splits remembered by this process."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    G._splits.cache_clear()
    yield tmp_path / "cache" / "fonts"
    G._splits.cache_clear()


def nearest_neighbour(train: np.ndarray, labels: np.ndarray, test: np.ndarray) -> np.ndarray:
    x, y = train.reshape(len(train), -1).astype(np.float64), test.reshape(len(test), -1).astype(np.float64)
    distance = (y**2).sum(1)[:, None] - 2 * y @ x.T + (x**2).sum(1)[None]
    return labels[distance.argmin(axis=1)]


def test_spec_parsing_and_classes():
    assert G.parse_spec("fonts:4:16") == SyntheticSpec("fonts:", 4, 16, 0)
    assert G.parse_spec("fonts:76:16:3") == SyntheticSpec("fonts:", 76, 16, 3)
    assert len(G.CHARACTERS) == 76 == len(set(G.CHARACTERS))
    assert G.CHARACTERS[:52] == string.ascii_uppercase + string.ascii_lowercase
    assert not set(G.CHARACTERS[:66]) & set(string.digits)  # fonts:C for C <= 66 holds no digit
    assert G.class_names(3) == ["U+0041_A", "U+0042_B", "U+0043_C"]
    names = G.class_names(76)
    assert len(set(names)) == 76 and len({n.lower() for n in names}) == 76  # unique on a case-blind disk too
    assert all(set(n) <= set(string.ascii_letters + string.digits + "+_") for n in names)  # no "/" in a name


@pytest.mark.parametrize("spec, message", [
    ("fonts:0:10", "C and N must be at least 1; use fonts:C:N[:SEED]"),
    ("fonts:x", "use fonts:C:N[:SEED] (C classes, N training images each), e.g. fonts:10:100"),
    ("fonts", "use fonts:C:N[:SEED]"),
    ("fonts:1:2:3:4", "use fonts:C:N[:SEED]"),
    ("fonts:77:10", "at most 76 classes (the characters every font draws); use C <= 76"),
    ("fonts:76:100000000", "GiB in memory, more than the"),
])
def test_bad_specs_are_one_line_data_errors(spec, message):
    with pytest.raises(DataError) as err:
        build_datasets(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_every_font_draws_every_character_and_val_fonts_are_never_trained_on():
    assert not set(G.TRAIN_FONTS) & set(G.VAL_FONTS) and len(G.TRAIN_FONTS) == 16 and len(G.VAL_FONTS) == 5
    for name in G.TRAIN_FONTS + G.VAL_FONTS:
        font = FT2Font(str(G.font_dir() / name))  # matplotlib's own FreeType binding, not Pillow's
        assert all(font.get_char_index(ord(ch)) for ch in G.CHARACTERS), name
    draws = G.draw_instances(0, 3, "val", 200)
    fonts = {G.VAL_FONTS[k] for k in np.minimum((draws[:, 0] * 5).astype(int), 4)}
    assert fonts == set(G.VAL_FONTS)  # every held-out font is used


def best_match(a: np.ndarray, b: np.ndarray) -> float:
    """Largest correlation of two grey glyphs cut to their ink, on a common canvas, b shifted by up to 2 px either
    way (the two rasterisers place a glyph's origin a sub-pixel apart), both averaged over 4x4 blocks as
    RENDER_SIZE sees them (a thin stroke one pixel off would spoil a pixel-exact comparison)."""
    side = (max(*a.shape, *b.shape) + 4 + 3) // 4 * 4
    canvas = np.zeros((2, side, side))
    canvas[0, 2: 2 + a.shape[0], 2: 2 + a.shape[1]] = a
    canvas[1, 2: 2 + b.shape[0], 2: 2 + b.shape[1]] = b
    blocks = lambda m: m.reshape(side // 4, 4, side // 4, 4).mean(axis=(1, 3)).ravel()  # noqa: E731
    ours = blocks(canvas[0])
    return max(np.corrcoef(ours, blocks(np.roll(canvas[1], (dy, dx), (0, 1))))[0, 1]
               for dy in range(-2, 3) for dx in range(-2, 3))


@pytest.mark.parametrize("font", ["DejaVuSans.ttf", "STIXGeneralBolIta.ttf", "cmr10.ttf", "cmss10.ttf"])
def test_glyphs_match_matplotlibs_own_rasteriser(font):
    """Pillow's glyph (no stroke), cut to its ink, against the bitmap matplotlib's FT2Font draws of the same
    character at the same pixel size: the same ink box within 2 px, and the same shape at RENDER_SIZE
    (correlation > 0.95; another character of the font scores far lower, checked on the last one)."""
    size = round(G.FONT_SIZE * G.RENDER_SIZE * G.SUPERSAMPLE)
    cut = {}
    for ch in "Ag%7&(":
        ft = FT2Font(str(G.font_dir() / font))
        ft.set_size(size, 72)  # points at 72 dpi: pixels
        ft.set_text(ch)
        ft.draw_glyphs_to_bitmap(antialiased=True)
        for who, image in (("ours", np.asarray(G.glyph(font, ch, 0))), ("theirs", np.asarray(ft.get_image()))):
            rows, cols = np.flatnonzero(image.max(1) > 127), np.flatnonzero(image.max(0) > 127)
            cut[who, ch] = image[rows[0]: rows[-1] + 1, cols[0]: cols[-1] + 1].astype(np.float64)
        assert all(abs(i - j) <= 2 for i, j in zip(cut["ours", ch].shape, cut["theirs", ch].shape, strict=True))
        assert best_match(cut["ours", ch], cut["theirs", ch]) > 0.95, (font, ch)
    assert best_match(cut["ours", "&"], cut["theirs", "("]) < 0.8


def test_inverse_affines_undo_the_forward_maps():
    rng = np.random.default_rng(0)
    uniform = rng.random((20, 7))
    data = G.inverse_affines(uniform)
    side, lerp = G.SUPERSAMPLE * G.RENDER_SIZE, lambda u, lo, hi: lo + (hi - lo) * u
    for row, (a, b, c, d, e, f) in zip(uniform, data, strict=True):
        angle, scale, shear = lerp(row[2], -G.ROTATION, G.ROTATION), lerp(row[3], *G.SCALE), lerp(row[4], -G.SHEAR,
                                                                                                    G.SHEAR)
        rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        forward = scale * rotation @ np.array([[1.0, shear], [0.0, 1.0]])
        shift = lerp(row[5:7], -G.SHIFT, G.SHIFT) * side
        source = rng.uniform(0, side, 2)
        out = forward @ (source - side / 2) + side / 2 + shift  # where the forward map sends a source pixel
        np.testing.assert_allclose([a * out[0] + b * out[1] + c, d * out[0] + e * out[1] + f], source, atol=1e-9)
    still = np.array([[0.0, 0.0, 0.5, (1 - G.SCALE[0]) / (G.SCALE[1] - G.SCALE[0]), 0.5, 0.75, 0.5]])
    np.testing.assert_allclose(G.inverse_affines(still)[0], [1, 0, -0.5 * G.SHIFT * side, 0, 1, 0], atol=1e-12)


def test_same_seed_same_images_different_seed_different(fresh):
    train, val = G.fonts_splits("fonts:3:4")
    assert train.arrays.shape == (12, 32, 32) and train.arrays.dtype == np.uint8 and list(val.labels) == [0, 1, 2]
    path = G.cache_path(G.parse_spec("fonts:3:4"))
    assert path.parent == fresh and path.is_file() and "-mpl" in path.name
    G._splits.cache_clear()
    path.unlink()
    again, again_val = G.fonts_splits("fonts:3:4:0")
    assert np.array_equal(again.arrays, train.arrays) and np.array_equal(again_val.arrays, val.arrays)
    other, _ = G.fonts_splits("fonts:3:4:1")
    assert not np.array_equal(other.arrays, train.arrays)
    flat = np.concatenate([train.arrays, val.arrays]).reshape(15, -1)
    assert len(np.unique(flat, axis=0)) == 15 and flat.max() == 255 and len(np.unique(flat)) > 16  # grey edges
    assert all(0.03 < (im > 0).mean() < 0.6 for im in flat)


def test_classes_and_instances_are_prefixes(fresh):
    four, four_val = G.fonts_splits("fonts:4:2:5")
    eight, eight_val = G.fonts_splits("fonts:8:30:5")
    first = eight.arrays.reshape(8, 30, 32, 32)[:4, :2]
    assert np.array_equal(four.arrays, first.reshape(four.arrays.shape))
    assert np.array_equal(four_val.arrays, eight_val.arrays.reshape(8, 3, 32, 32)[:4, :1].reshape(4, 32, 32))


def test_classes_are_separable_but_not_trivially_and_transfer_to_unseen_fonts():
    """1-NN on raw pixels. Within the training fonts, 12 instances of each of 20 characters label 8 others:
    31% (chance 5%; 24% at 66 characters): the fonts and the jitter make the task far from solved by pixels.
    From 100 training-font instances per character to the held-out fonts: 58% of 10 val instances each."""
    spec = G.parse_spec("fonts:20:20")
    images, labels = G.render_split(spec, "train")
    x = images.reshape(20, 20, 32, 32)
    predicted = nearest_neighbour(x[:, :12].reshape(-1, 32, 32), np.repeat(np.arange(20), 12),
                                  x[:, 12:].reshape(-1, 32, 32))
    accuracy = (predicted == np.repeat(np.arange(20), 8)).mean()
    assert 0.2 < accuracy < 0.6, accuracy
    train, train_labels = G.render_split(G.parse_spec("fonts:20:100"), "train")
    val, val_labels = G.render_split(G.parse_spec("fonts:20:100"), "val")
    held_out = (nearest_neighbour(train, train_labels, val) == val_labels).mean()
    assert held_out > 0.4, held_out


def test_a_missing_font_file_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(G, "font_dir", lambda: tmp_path)
    G._font.cache_clear()
    G.glyph.cache_clear()
    try:
        with pytest.raises(DataError) as err:
            G.render_split(G.parse_spec("fonts:1:1"), "train")
    finally:
        G._font.cache_clear()
        G.glyph.cache_clear()
    assert "needs matplotlib's font" in str(err.value) and "reinstall matplotlib" in str(err.value)
    assert "\n" not in str(err.value)


def test_dispatch_through_datasets(fresh):
    ds = build_datasets("fonts:3:10")
    assert (ds.num_classes, len(ds.train), len(ds.val), ds.source) == (3, 30, 3, "fonts:3:10")
    assert ds.class_names == ["U+0041_A", "U+0042_B", "U+0043_C"] and has_val_split("fonts:3:10")
    assert np.array_equal(load_split("fonts:3:10", "val").arrays, ds.val.arrays)
    assert evaluation_splits("fonts:3:10").test_source == "the fonts:3:10 val split"
    assert ds.train.load(0).mode == "L" and ds.train.load(0).size == (32, 32)


def test_cli_train_and_bad_spec(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    G._splits.cache_clear()
    try:
        assert main(["train", "--out", str(tmp_path / "run"), "--data", "fonts:4:8", "--steps", "2", *TINY]) == 0
        assert json.loads((tmp_path / "run" / "config.json").read_text())["data"] == "fonts:4:8"
        assert main(["train", "--out", str(tmp_path / "r2"), "--data", "fonts:99:8", *TINY]) == 2
    finally:
        G._splits.cache_clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("vitlab train: error: bad fonts dataset 'fonts:99:8': at most 76 classes (the characters "
                       "every font draws); use C <= 76"), err
