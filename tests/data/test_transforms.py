"""vitlab.data.transforms against independent references: a numpy transcription of TF's
`sample_distorted_bounding_box` (by distribution), hand-computed boxes, and PIL/numpy references of each resize."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image

from vitlab.data import EvalTransform, TrainTransform
from vitlab.data.transforms import bit_resize, resize_before_crop, subpixel_inception_box, tf_inception_box


def reference_tf_crop_areas(width, height, area_range, ratio_range, n, seed, attempts=100):
    """Area fractions of n crops, written from the algorithm's description: per attempt an aspect ratio
    uniform in its range; the crop height an integer uniform between round(sqrt(min_area/ar)) and
    round(sqrt(max_area/ar)), the upper end clamped so that the height and round(height*ar) fit; width =
    round(height*ar); an attempt whose area is out of range fails; 100 attempts, else the whole image."""
    rng = np.random.default_rng(seed)
    min_area, max_area = area_range[0] * width * height, area_range[1] * width * height
    area = np.full(n, float(width * height))
    pending = np.ones(n, dtype=bool)
    for _ in range(attempts):
        k = int(pending.sum())
        if k == 0:
            break
        ar = rng.uniform(*ratio_range, size=k)
        lo = np.rint(np.sqrt(min_area / ar))
        hi = np.minimum(np.rint(np.sqrt(max_area / ar)), height)
        hi = np.minimum(hi, np.floor((width + 0.5) / ar))  # round(hi * ar) <= width
        lo = np.minimum(lo, hi)
        h = lo + np.floor(rng.random(k) * (hi - lo + 1))
        w = np.rint(h * ar)
        a = w * h
        ok = (a >= min_area) & (a <= max_area) & (w >= 1) & (w <= width) & (h >= 1)
        idx = np.flatnonzero(pending)
        area[idx[ok]] = a[ok]
        pending[idx[ok]] = False
    return area / (width * height)


def test_tf_inception_crop_matches_reference_distribution():
    """500×375, area (0.05, 1), aspect (3/4, 4/3), 100k draws: mean area fraction and P(area < 0.2)."""
    rng = random.Random(0)
    ours = []
    for _ in range(100_000):
        left, top, right, bottom = tf_inception_box(500, 375, (0.05, 1.0), (3 / 4, 4 / 3), rng)
        assert 0 <= left < right <= 500 and 0 <= top < bottom <= 375
        ours.append((right - left) * (bottom - top))
    ours = np.array(ours) / (500 * 375)
    ref = reference_tf_crop_areas(500, 375, (0.05, 1.0), (3 / 4, 4 / 3), 100_000, seed=1)
    assert abs(ours.mean() - ref.mean()) < 0.01 and abs((ours < 0.2).mean() - (ref < 0.2).mean()) < 0.01
    assert abs(ours.mean() - 0.343) < 0.01  # the figure TF itself gives; the uniform-area sampler gives 0.427
    old = [subpixel_inception_box(500, 375, (0.05, 1.0), (3 / 4, 4 / 3), rng) for _ in range(20_000)]
    old_mean = np.mean([(r - l) * (b - t) for l, t, r, b in old]) / (500 * 375)
    assert abs(old_mean - 0.427) < 0.01  # why "inception-subpixel" is not the official crop


class ScriptedRng(random.Random):
    """random() and randrange(n) return scripted values; randrange checks the n it is asked for."""

    def __init__(self, uniforms, ranges):
        super().__init__(0)
        self.uniforms, self.ranges = list(uniforms), list(ranges)

    def random(self):
        return self.uniforms.pop(0)

    def randrange(self, n):
        expected_n, value = self.ranges.pop(0)
        assert n == expected_n
        return value


def test_tf_inception_box_hand_computed():
    # 500×375, aspect 3/4 + 0.5·(4/3 − 3/4) = 25/24: min height round(sqrt(9375·24/25)) = round(94.87) = 95,
    # max height round(sqrt(187500·24/25)) = 424 clamped to 375 -> 281 choices; height 95 + 200 = 295,
    # width round(295·25/24) = round(307.29) = 307; top in [0, 375 − 295), left in [0, 500 − 307).
    rng = ScriptedRng([0.5], [(281, 200), (80, 7), (193, 11)])
    assert tf_inception_box(500, 375, (0.05, 1.0), (3 / 4, 4 / 3), rng) == (11, 7, 318, 302)
    # 100 wide, 400 tall, aspect 4/3: the width clamps the height: (100.5 − 1e-7)/(4/3) -> 75, width 100;
    # min height round(sqrt(2000·3/4)) = 39 -> 37 choices; the full width leaves no horizontal offset.
    rng = ScriptedRng([1.0], [(37, 36), (325, 3)])
    assert tf_inception_box(100, 400, (0.05, 1.0), (3 / 4, 4 / 3), rng) == (0, 3, 100, 78)


def test_tf_inception_box_falls_back_to_whole_image_after_100_attempts():
    # 3×3, area (0.5, 0.6), aspect 1: height 2 (area 4 < 4.5) -> 3 (area 9 > 5.4) -> 2 again: every attempt fails.
    rng = ScriptedRng([0.0] * 100, [])
    assert tf_inception_box(3, 3, (0.5, 0.6), (1.0, 1.0), rng) == (0, 0, 3, 3)
    assert rng.uniforms == []  # exactly 100 aspect-ratio draws


def test_resize_sizes_of_the_official_configs():
    assert (resize_before_crop(224), resize_before_crop(384), resize_before_crop(16)) == (256, 448, 18)
    assert (bit_resize(128), bit_resize(384), bit_resize(224)) == (160, 448, 256)


def random_image(w, h, seed=0):
    return Image.fromarray((np.random.RandomState(seed).rand(h, w, 3) * 255).astype(np.uint8))


def resize_then_crop(img, resized_hw, top, left, size):
    """PIL reference: resize the whole image, then slice the crop."""
    arr = np.asarray(img.resize((resized_hw[1], resized_hw[0]), Image.Resampling.BILINEAR))
    return arr[top : top + size, left : left + size].astype(int)


def assert_equal_uint8(ours, ref):
    assert ours.dtype == np.uint8 and np.array_equal(ours.astype(int), ref)


def test_eval_big_vision_is_short_side_256_then_central_224():
    img = random_image(500, 375)  # short side 375 -> 256; long side 500·256/375 = 341.3 -> 341
    out = EvalTransform((224, 224), "big_vision")(img)
    assert out.shape == (224, 224, 3)
    assert_equal_uint8(out, resize_then_crop(img, (256, 341), (256 - 224) // 2, (341 - 224) // 2, 224))
    assert EvalTransform((224, 224), "big_vision").min_source_size is None  # every pixel decoded


def test_fewshot_resize_is_256_square_then_central_224():
    img = random_image(500, 375)
    out = EvalTransform((224, 224), "fewshot")(img)
    assert_equal_uint8(out, resize_then_crop(img, (256, 256), 16, 16, 224))


def bilinear_upsample(arr, out_h, out_w):
    """numpy reference of bilinear upsampling (pixel centres at +0.5, edges clamped)."""
    h, w = arr.shape[:2]
    ys = np.clip((np.arange(out_h) + 0.5) * h / out_h - 0.5, 0, h - 1)
    xs = np.clip((np.arange(out_w) + 0.5) * w / out_w - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    a = arr.astype(float)
    top = a[y0][:, x0] * (1 - fx) + a[y0][:, x1] * fx
    bottom = a[y1][:, x0] * (1 - fx) + a[y1][:, x1] * fx
    return top * (1 - fy) + bottom * fy


def test_eval_official_resizes_whole_image_ignoring_aspect():
    img = random_image(7, 5)
    out = EvalTransform((16, 16), "official")(img)
    assert out.shape == (16, 16, 3)
    assert np.abs(out.astype(float) - bilinear_upsample(np.asarray(img), 16, 16)).max() <= 1.0


def test_eval_resize_short_crop_keeps_the_centre():
    arr = np.zeros((20, 40), dtype=np.uint8)
    arr[:, 10:30] = 255  # the central 20x20 square is white
    out = EvalTransform((10, 10), "resize-short-crop")(Image.fromarray(arr))
    assert out.shape == (10, 10, 3)
    assert out[:, 1:-1].min() == 255 and out.min() > 200  # only the centre survives (edges: filter support)
    official = EvalTransform((10, 10), "official")(Image.fromarray(arr))
    assert official[:, 0].max() == 0  # the whole width is kept: the black borders survive


def test_resize_random_crop_is_bit_hyperrule():
    img = random_image(50, 30)
    t = TrainTransform((8, 8), flip=False, crop="resize-random-crop")  # R = round(8·8/7) = 9
    offsets = set()
    for seed in range(40):
        draw = random.Random(seed)
        top, left = draw.randrange(2), draw.randrange(2)  # R − S + 1 = 2 offsets per axis
        offsets.add((top, left))
        assert_equal_uint8(t(img, random.Random(seed)), resize_then_crop(img, (9, 9), top, left, 8))
    assert offsets == {(0, 0), (0, 1), (1, 0), (1, 1)}  # both ends of the offset range are drawn
    assert TrainTransform((128, 128), crop="resize-random-crop").min_source_size == 160


def test_inception_crop_resizes_an_integer_box_and_flips():
    img = random_image(40, 30)
    t = TrainTransform((16, 16), flip=True)
    seen_flip = False
    for seed in range(20):
        draw = random.Random(seed)
        box = tf_inception_box(40, 30, (0.05, 1.0), (3 / 4, 4 / 3), draw)
        ref = np.asarray(img.crop(box).resize((16, 16), Image.Resampling.BILINEAR))  # PIL: crop, then resize
        if draw.random() < 0.5:
            ref, seen_flip = ref[:, ::-1], True
        assert np.array_equal(t(img, random.Random(seed)), ref)
    assert seen_flip


@pytest.mark.parametrize("kind", ["train", "eval"])
def test_unknown_crop_or_resize_is_refused(kind):
    with pytest.raises(ValueError, match="unknown"):
        TrainTransform((8, 8), crop="random") if kind == "train" else EvalTransform((8, 8), "bicubic")


def test_timm_spelling_resizes_the_short_side_then_crops_the_centre_as_timm():
    """short side to floor(S / crop_pct) = 20 (the long side int(20·43/20) = 43: no resampling at all), then the
    central 10×10 at offsets rounded half to even: top (20 − 10) / 2 = 5, left (43 − 10) / 2 = 16.5 → 16."""
    arr = np.random.default_rng(0).integers(0, 256, (20, 43, 3), dtype=np.uint8)
    out = EvalTransform((10, 10), "timm:bicubic:0.5")(Image.fromarray(arr))
    assert np.array_equal(out, arr[5:15, 16:26])
    squash = EvalTransform((10, 10), "timm:bilinear:0.5:squash")(Image.fromarray(arr))  # 20×20, then its centre
    whole = np.asarray(Image.fromarray(arr).resize((20, 20), Image.Resampling.BILINEAR))
    assert np.array_equal(squash, whole[5:15, 5:15])


@pytest.mark.parametrize("spelling", ["timm:bicubic", "timm:cubic:0.9", "timm:bicubic:1.5", "timm:bicubic:0",
                                      "timm:bicubic:x", "timm:bicubic:0.9:border", "timm:bicubic:0.9:squash:1"])
def test_malformed_timm_spelling_is_one_line(spelling):
    with pytest.raises(ValueError, match=r"^eval resize .* is not timm:INTERPOLATION:CROP_PCT\[:squash\] .*"
                                         r"\(e\.g\. timm:bicubic:0\.9\)$"):
        EvalTransform((8, 8), spelling)
