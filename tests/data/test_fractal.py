"""`fractal:C:N[:SEED]`: FractalDB rendered from random iterated function systems (Kataoka et al. 2020)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import TINY_VIT_FLAGS
from vitlab.cli import main
from vitlab.data import DataError, build_datasets, load_split
from vitlab.data import fractal as F
from vitlab.data.datasets import evaluation_splits, has_val_split

TINY = [*TINY_VIT_FLAGS,
        "--image-size", "16", "--batch-size", "16", "--warmup", "1", "--workers", "0", "--log-every", "1"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh vitlab cache and no splits remembered by this process."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    F._splits.cache_clear()
    yield tmp_path / "cache" / "fractal"
    F._splits.cache_clear()


def fill(images: np.ndarray) -> np.ndarray:
    """Share of each image's pixels that are not black, from the pixels alone."""
    return (images.max(axis=-1) > 0).mean(axis=(1, 2))


def test_spec_parsing():
    assert F.parse_spec("fractal:4:16") == F.FractalSpec(4, 16, 0)
    assert F.parse_spec("fractal:4:16:7") == F.FractalSpec(4, 16, 7)
    assert F.FractalSpec(4, 16).val_per_class == 1 and F.FractalSpec(4, 35).val_per_class == 3
    assert F.class_names(3) == ["fractal_0000", "fractal_0001", "fractal_0002"]


@pytest.mark.parametrize("spec, message", [
    ("fractal:0:10", "C and N must be at least 1; use fractal:C:N[:SEED]"),
    ("fractal:10:0", "C and N must be at least 1"),
    ("fractal:x", "use fractal:C:N[:SEED] (C classes, N training images each), e.g. fractal:10:100"),
    ("fractal:10", "use fractal:C:N[:SEED]"),
    ("fractal", "use fractal:C:N[:SEED]"),
    ("fractal:1:2:3:4", "use fractal:C:N[:SEED]"),
    ("fractal:-1:5", "use fractal:C:N[:SEED]"),
    ("fractal:1000:1000000", "GiB in memory, more than the"),  # 10^9 images
])
def test_bad_specs_are_one_line_data_errors(spec, message):
    with pytest.raises(DataError) as err:
        build_datasets(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_same_seed_same_images_different_seed_different(cache):
    train, val = F.fractal_splits("fractal:3:4")
    path = F.cache_path(F.FractalSpec(3, 4))
    assert path.parent == cache and path.is_file()
    assert train.arrays.shape == (12, F.RENDER_SIZE, F.RENDER_SIZE, 3) and train.arrays.dtype == np.uint8
    assert val.arrays.shape[0] == 3 and list(val.labels) == [0, 1, 2]
    assert list(train.labels) == [0] * 4 + [1] * 4 + [2] * 4 and train.class_names[2] == "fractal_0002"
    F._splits.cache_clear()
    again, _ = F.fractal_splits("fractal:3:4:0")  # loaded from the cache file
    assert np.array_equal(again.arrays, train.arrays)
    F._splits.cache_clear()
    path.unlink()
    fresh, fresh_val = F.fractal_splits("fractal:3:4")  # rendered again from nothing
    assert np.array_equal(fresh.arrays, train.arrays) and np.array_equal(fresh_val.arrays, val.arrays)
    other, _ = F.fractal_splits("fractal:3:4:1")
    assert not np.array_equal(other.arrays, train.arrays)
    # no two images alike: instances of a category differ, and val images are not train images
    flat = np.concatenate([train.arrays, val.arrays]).reshape(15, -1)
    assert len(np.unique(flat, axis=0)) == 15


def test_categories_and_instances_are_prefixes(cache):
    small, _ = F.draw_categories(5, 4)
    large, _ = F.draw_categories(5, 8)
    assert all(np.array_equal(a, b) for a, b in zip(small, large[:4], strict=True))
    four, _ = F.fractal_splits("fractal:4:2:5")
    eight, _ = F.fractal_splits("fractal:8:3:5")
    first = eight.arrays.reshape(8, 3, *eight.arrays.shape[1:])[:4, :2]  # categories 0-3, instances 0-1
    assert np.array_equal(four.arrays, first.reshape(four.arrays.shape))


def test_images_do_not_depend_on_how_they_are_batched(monkeypatch):
    systems, _ = F.draw_categories(0, 5)
    whole, _ = F.render_split(F.FractalSpec(5, 6), "train", systems)
    monkeypatch.setattr(F, "CHUNK", 7)  # chunks and chaos-game batches that cut across categories
    monkeypatch.setattr(F, "_batch", lambda points, size: 3)
    pieces, _ = F.render_split(F.FractalSpec(5, 6), "train", systems)
    assert np.array_equal(whole, pieces)
    assert all(np.array_equal(a, b) for a, b in zip(F.draw_categories(0, 5)[0], systems, strict=True))


def test_one_nearest_neighbour_tells_categories_apart():
    """Instances of a category look alike: a 1-NN classifier on raw RGB pixels, fitted on 12 instances of each of
    10 categories, labels 8 others each far above chance (measured 71-78% over seeds 0-2; chance 10%) despite
    the random flips and hues."""
    spec = F.FractalSpec(10, 20, 0)
    systems, _ = F.draw_categories(0, 10)
    images, labels = F.render_split(spec, "train", systems)
    x = images.reshape(10, 20, -1).astype(np.float64)
    fit, test = x[:, :12].reshape(120, -1), x[:, 12:].reshape(80, -1)
    distance = (test**2).sum(1)[:, None] - 2 * test @ fit.T + (fit**2).sum(1)[None]
    predicted = np.repeat(np.arange(10), 12)[distance.argmin(axis=1)]
    accuracy = (predicted == np.repeat(np.arange(10), 8)).mean()
    assert accuracy > 0.5, accuracy
    assert np.array_equal(labels, np.repeat(np.arange(10), 20))


def test_every_image_fills_the_threshold(cache):
    train, val = F.fractal_splits("fractal:12:4")
    rates = fill(np.concatenate([train.arrays, val.arrays]))
    assert rates.min() >= F.FILL_THRESHOLD
    _, tried = F.draw_categories(0, 12)
    assert tried > 12  # some random IFS were rejected (about half are)


def _passes(params: list[list[float]]) -> bool:
    rng = np.random.default_rng(0)
    counts = F.hit_counts(*F.chaos_game([np.array(params, float)], [rng], F.POINTS), F.RENDER_SIZE)
    return bool(F.passes_filter(counts)[0])


def test_filter_keeps_fractals_and_rejects_degenerate_systems():
    sierpinski = [[0.5, 0, 0, 0.5, 0, 0], [0.5, 0, 0, 0.5, 0.5, 0], [0.5, 0, 0, 0.5, 0.25, 0.5]]
    fern = [[0, 0, 0, 0.16, 0, 0], [0.85, 0.04, -0.04, 0.85, 0, 1.6], [0.2, -0.26, 0.23, 0.22, 0, 1.6],
            [-0.15, 0.28, 0.26, 0.24, 0, 0.44]]  # Barnsley's fern
    line = [[0.5, 0, 0, 0.01, 0, 0], [0.5, 0, 0, 0.01, 0.5, 0]]  # flattened onto the x axis
    point = [[0.01, 0, 0, 0.01, 0, 0], [0.01, 0, 0, 0.01, 0, 0]]  # everything contracts to the origin
    diverging = [[1.5, 0, 0, 1.5, 0, 0], [1.2, 0.3, -0.3, 1.2, 1, 0]]
    assert _passes(sierpinski) and _passes(fern)
    assert not _passes(line) and not _passes(point) and not _passes(diverging)


def test_stray_point_rule_on_hand_made_counts():
    """A dense dot in a cloud of single points fills the frame but is noise; a shape of the same fill is not."""
    size = F.RENDER_SIZE
    counts = np.zeros((2, F.MAX_MAPS, size, size), np.int64)
    rows, cols = np.divmod(np.arange(size * size)[:: 4], size)  # a quarter of the pixels, one point each
    counts[0, 0, rows, cols] = 1
    counts[0, 0, size // 2, size // 2] = 20_000
    counts[1, 0, : size // 2, : size // 2] = 5  # a filled quarter of the frame
    assert fill(counts.sum(axis=1)[..., None]).tolist() == [0.25, 0.25]
    assert F.passes_filter(counts).tolist() == [False, True]


def test_hue_rgb_matches_colorsys():
    import colorsys

    hues = np.linspace(0, 0.999, 37)
    expected = np.array([colorsys.hsv_to_rgb(h, 1.0, 1.0) for h in hues])
    np.testing.assert_allclose(F.hue_rgb(hues), expected, atol=1e-12)


def test_dispatch_through_datasets(cache):
    ds = build_datasets("fractal:3:10")
    assert (ds.num_classes, len(ds.train), len(ds.val), ds.source) == (3, 30, 3, "fractal:3:10")
    assert has_val_split("fractal:3:10")
    assert np.array_equal(load_split("fractal:3:10", "val").arrays, ds.val.arrays)
    assert np.array_equal(load_split("fractal:3:10", "train").arrays, ds.train.arrays)
    splits = evaluation_splits("fractal:3:10")
    assert splits.test_source == "the fractal:3:10 val split" and len(splits.test) == 3
    held = build_datasets("fractal:3:10", val_fraction=0.2)
    assert (len(held.train), len(held.val)) == (24, 6)
    assert ds.train.load(0).mode == "RGB" and ds.train.load(0).size == (F.RENDER_SIZE, F.RENDER_SIZE)


@pytest.fixture(scope="module")
def fractal_run(tmp_path_factory):
    """`vitlab train --data fractal:4:16` (2 steps of a tiny ViT at 16 px), in a cache of its own."""
    root = tmp_path_factory.mktemp("fractal_cli")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VITLAB_CACHE", str(root / "cache"))
        F._splits.cache_clear()
        assert main(["train", "--out", str(root / "run"), "--data", "fractal:4:16", "--steps", "2", *TINY]) == 0
        yield root / "run"
    F._splits.cache_clear()


def test_cli_train(fractal_run, capsys):
    assert (fractal_run / "model.safetensors").is_file()
    config = __import__("json").loads((fractal_run / "config.json").read_text())
    assert config["data"] == "fractal:4:16"


def test_cli_eval(fractal_run, capsys):
    assert main(["eval", "--weights", str(fractal_run), "--data", "fractal:4:16"]) == 0
    assert "(4 images)" in capsys.readouterr().out


def test_cli_fewshot(fractal_run, capsys):
    assert main(["fewshot", "--weights", str(fractal_run), "--data", "fractal:4:16", "--shots", "1,5", "--seeds", "1",
                 "--device", "cpu"]) == 0
    assert "on fractal:4:16" in capsys.readouterr().out


@pytest.mark.parametrize("verb", ["train", "eval", "fewshot"])
def test_cli_bad_spec_exits_2_with_one_line(verb, tmp_path, capsys):
    import vitlab

    weights = tmp_path / "m.safetensors"
    vitlab.save(vitlab.create_model("ViT-Ti/4", num_classes=4, image_size=16, depth=1, width=32, num_heads=2,
                                    mlp_dim=64), weights)
    args = ["--out", str(tmp_path / "r"), *TINY] if verb == "train" else ["--weights", str(weights)]
    assert main([verb, "--data", "fractal:0:10", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"vitlab {verb}: error: bad fractal dataset 'fractal:0:10': C and N must be"), err
