"""Deterministic photograph-like JPEGs for the data-loading benchmarks (no data is downloaded or committed).

    python benchmarks/make_jpegs.py OUT --count 50000 --size 500x375 [--classes 100] [--seed 0] [--jobs 2]

writes OUT/train/<class>/*.jpg and OUT/val/<class>/*.jpg (2% of each class in val), resumable: files that
exist are kept. A JPEG decoder's time depends on how many entropy-coded bits it reads (Huffman decoding) as
much as on the pixel count (IDCT, colour conversion), so flat synthetic images would make decoding look
faster than it is on photographs. Each image is built like a photo: a lit background, soft-edged objects
(blurred masks, as out-of-focus edges), pink (1/f) texture over several octaves, and sensor-like grain; saved
at quality 90 with 4:2:0 chroma subsampling as cameras and most web photos are. At 500x375 that gives about
1.3-2.6 bits per pixel (30-60 KB), the range of quality-90 photographs of that size; `--report` prints the
size histogram to check it.
"""

from __future__ import annotations

import argparse
import os
import sys
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

VAL_FRACTION = 0.02
QUALITY = 90
DETAIL = (6.0, 22.0)  # amplitude range of the fine detail: sets the bits per pixel (see `size_report`)


def parse_size(text: str) -> tuple[int, int]:
    """'500x375' -> (width, height)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r} is not WIDTHxHEIGHT, e.g. 500x375") from None
    if w < 16 or h < 16:
        raise argparse.ArgumentTypeError(f"size {text!r} is too small; use at least 16x16")
    return w, h


def _field(rng: np.random.Generator, width: int, height: int, grid: int) -> np.ndarray:
    """Smooth random field: normal noise on a coarse grid (`grid` cells on the long side) upsampled bicubically."""
    gw = max(2, grid * width // max(width, height))
    gh = max(2, grid * height // max(width, height))
    small = Image.fromarray(rng.standard_normal((gh, gw), dtype=np.float32), mode="F")
    return np.asarray(small.resize((width, height), Image.Resampling.BICUBIC))


def _pink_texture(rng: np.random.Generator, width: int, height: int, beta: float) -> np.ndarray:
    """Octaves from 4 cells to ~2 pixels, amplitude 1/f^beta: natural images' spectra fall roughly as 1/f
    (beta near 1); foliage, fabric and gravel are flatter (lower beta), and they carry most of a JPEG's bits."""
    out = np.zeros((height, width), np.float32)
    k = 0
    while 4 * 2**k <= max(width, height) // 2:
        out += _field(rng, width, height, 4 * 2**k) / np.float32(2**k) ** beta
        k += 1
    return out


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    """One colour, channels 0-255."""
    i, f = int(h * 6) % 6, h * 6 - int(h * 6)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    rgb = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]
    return np.array(rgb, np.float32) * 255


def _draw_shape(d: ImageDraw.ImageDraw, rng: np.random.Generator, w: int, h: int, r: float, fill: int) -> None:
    """An ellipse, polygon or rectangle of radius about r at a random place."""
    cx, cy = rng.uniform(0, w), rng.uniform(0, h)
    kind = rng.integers(3)
    if kind == 0:
        d.ellipse([cx - r, cy - r * rng.uniform(0.4, 1.2), cx + r, cy + r * rng.uniform(0.4, 1.2)], fill=fill)
    elif kind == 1:
        n = int(rng.integers(3, 8))
        ang = np.sort(rng.uniform(0, 2 * np.pi, n))
        rad = r * rng.uniform(0.5, 1.2, n)
        d.polygon([(cx + a * np.cos(t), cy + a * np.sin(t)) for t, a in zip(ang, rad, strict=True)], fill=fill)
    else:
        d.rectangle([cx - r, cy - r * 0.6, cx + r * rng.uniform(0.3, 1.0), cy + r], fill=fill)


def _mask(rng: np.random.Generator, width: int, height: int) -> tuple[np.ndarray, tuple[slice, slice]]:
    """A soft-edged object: (mask (h, w, 1) in [0, 1], its place in the image). Drawn at 1/1 to 1/8 resolution
    and upsampled, so its edge is sharp (in focus) to blurred (out of focus) at the cost of one small drawing."""
    f = int(rng.choice([1, 2, 4, 8], p=[0.3, 0.3, 0.25, 0.15]))
    w, h = -(-width // f), -(-height // f)
    m = Image.new("L", (w, h), 0)
    _draw_shape(ImageDraw.Draw(m), rng, w, h, rng.uniform(0.08, 0.45) * min(w, h), 255)
    if f > 1:  # smoothed first: a hard low-resolution edge upsampled would show its staircase
        m = m.filter(ImageFilter.GaussianBlur(0.8)).resize((width, height), Image.Resampling.BICUBIC)
    box = m.getbbox() or (0, 0, 1, 1)  # only the object's box is composited: full-size passes dominate the time
    place = (slice(box[1], box[3]), slice(box[0], box[2]))
    return np.asarray(m.crop(box), np.float32)[:, :, None] * np.float32(1 / 255), place


def _clutter(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """Many small sharp shapes in grey levels (H, W): the edges of leaves, stones, text a photo is full of."""
    m = Image.new("L", (width, height), 128)
    d = ImageDraw.Draw(m)
    for _ in range(int(rng.integers(20, 120))):
        _draw_shape(d, rng, width, height, rng.uniform(0.01, 0.06) * min(width, height), int(rng.integers(256)))
    return np.asarray(m, np.float32) - 128


def make_image(width: int, height: int, cls: int, classes: int, key: tuple[int, ...] = ()) -> Image.Image:
    """One photograph-like RGB image, a function of its arguments only; the class sets the palette (hue), so a
    model could learn it. `key` (e.g. (seed, index)) tells images of a class apart."""
    rng = np.random.default_rng([cls, *key])
    hue = (cls / max(classes, 1) + rng.normal(0, 0.03)) % 1.0
    top = _hsv_to_rgb((hue + rng.uniform(-0.1, 0.1)) % 1, rng.uniform(0.1, 0.6), rng.uniform(0.5, 1.0))
    bottom = _hsv_to_rgb((hue + 0.5 + rng.uniform(-0.1, 0.1)) % 1, rng.uniform(0.2, 0.8), rng.uniform(0.15, 0.7))
    angle = rng.uniform(-0.5, 0.5)
    y = (np.arange(height, dtype=np.float32) / height - 0.5) * np.float32(np.cos(angle))
    x = (np.arange(width, dtype=np.float32) / width - 0.5) * np.float32(np.sin(angle))
    t = np.clip(y[:, None] + x[None, :] + 0.5, 0, 1)[:, :, None]
    img = top * (1 - t) + bottom * t  # a lit background: sky to ground, wall to floor
    img *= (1 + 0.1 * _field(rng, width, height, 3))[:, :, None]  # uneven lighting
    texture = _pink_texture(rng, width, height, rng.uniform(0.3, 0.8))
    img += (rng.uniform(4, 12) * texture)[:, :, None]
    clutter = _clutter(rng, width, height)
    for _ in range(int(rng.integers(3, 9))):
        colour = _hsv_to_rgb((hue + rng.normal(0, 0.25)) % 1, rng.uniform(0.2, 0.9), rng.uniform(0.2, 1.0))
        amp = np.float32(rng.uniform(3, 15)) * np.roll(texture, int(rng.integers(width)), axis=1)  # own texture
        if rng.random() < 0.5:
            amp += np.float32(rng.uniform(0.3, 0.8)) * clutter
        m, at = _mask(rng, width, height)
        img[at] += m * (colour - img[at] + amp[at][:, :, None])  # img * (1 - m) + obj * m
    # Fine detail (grass, foliage, fabric: features of 2-6 pixels) where an envelope says so, not everywhere:
    # photos mix detailed regions with smooth ones (sky, walls), and the detail carries most of a JPEG's bits.
    side = max(width, height)
    detail = _field(rng, width, height, side // 2) + 0.7 * _field(rng, width, height, side // 5)
    envelope = np.clip(0.35 + 0.6 * _field(rng, width, height, 3), 0, 1)
    img += (np.float32(rng.uniform(DETAIL[0], DETAIL[1])) * detail * envelope)[:, :, None]
    img += rng.standard_normal((height, width, 1), dtype=np.float32) * np.float32(rng.uniform(1.0, 2.5))  # grain
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def plan(count: int, classes: int) -> list[tuple[str, int, int]]:
    """(split, class, index within the class) for every image: `count` spread over the classes, 2% of each
    class (at least one) in val."""
    tasks = []
    for c in range(classes):
        n = count // classes + (c < count % classes)
        n_val = max(1, round(VAL_FRACTION * n)) if n > 1 else 0
        tasks += [("val" if i < n_val else "train", c, i) for i in range(n)]
    return tasks


def image_path(out: Path, split: str, cls: int, index: int) -> Path:
    return out / split / f"c{cls:03d}" / f"img_{index:05d}.jpg"


def _write(job: tuple) -> int:
    """Generate and save one image unless it exists (atomic: an interrupted run leaves no torn JPEG)."""
    out, split, cls, index, size, classes, seed = job
    path = image_path(Path(out), split, cls, index)
    if path.exists():
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    img = make_image(size[0], size[1], cls, classes, (seed, index))
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    img.save(tmp, "JPEG", quality=QUALITY)
    os.replace(tmp, path)
    return 1


def generate(out: Path, count: int, size: tuple[int, int], classes: int = 100, seed: int = 0, jobs: int = 2,
             show: bool = True) -> int:
    """Write the images that are missing; returns how many were written."""
    from tqdm import tqdm

    jobs_list = [(str(out), s, c, i, size, classes, seed) for s, c, i in plan(count, classes)]
    written = 0
    with Pool(jobs) as pool, tqdm(total=len(jobs_list), unit="img", desc="jpegs", disable=not show) as bar:
        for w in pool.imap_unordered(_write, jobs_list, chunksize=16):
            written += w
            bar.update()
    return written


def size_report(out: Path) -> str:
    """Histogram of file sizes (KB) and bits per pixel over the train images."""
    files = sorted((out / "train").rglob("*.jpg"))
    if not files:
        return f"no images under {out}/train"
    sizes = np.array([f.stat().st_size for f in files]) / 1000
    with Image.open(files[0]) as img:
        pixels = img.width * img.height
    bpp = sizes * 8000 / pixels
    edges = np.percentile(sizes, [0, 5, 25, 50, 75, 95, 100])
    counts, bins = np.histogram(sizes, bins=10)
    lines = [f"{len(files)} train images, {img.width}x{img.height}: mean {sizes.mean():.1f} KB "
             f"({bpp.mean():.2f} bits/pixel); percentiles 0/5/25/50/75/95/100: "
             + " / ".join(f"{e:.1f}" for e in edges) + " KB"]
    for n, lo, hi in zip(counts, bins[:-1], bins[1:], strict=True):
        lines.append(f"{lo:6.1f}-{hi:6.1f} KB {n:6d} {'#' * round(50 * n / counts.max())}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--count", type=int, default=50000, help="images in all, train and val (default 50000)")
    p.add_argument("--size", type=parse_size, default=(500, 375), help="WIDTHxHEIGHT (default 500x375)")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: every core)")
    p.add_argument("--report", action="store_true", help="print the file-size histogram at the end")
    args = p.parse_args(argv)
    if args.count < args.classes:
        p.error(f"--count {args.count} is below --classes {args.classes}: every class needs an image")
    written = generate(args.out, args.count, args.size, args.classes, args.seed, args.jobs, sys.stderr.isatty())
    print(f"{args.out}: {written} written, {args.count - written} already there")
    if args.report:
        print(size_report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
