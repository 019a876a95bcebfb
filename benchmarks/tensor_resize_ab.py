"""A/B on one core: the training transform's crop resampled by PIL (`resize="pil"`, the default) vs torch's
uint8 kernel (`resize="tensor"`), on photograph-like 500x375 JPEGs decoded as the loader decodes them.

    OMP_NUM_THREADS=1 python benchmarks/tensor_resize_ab.py [--images 200] [--repeats 5] [--size 224] [--json F]

Both paths take the same random draws (seed per image), so their outputs differ only by the resampling; the
max and mean absolute pixel difference over every output pixel are reported with the times. Timed per image:
the transform alone (decoded image in, uint8 (224, 224, 3) out) and decode + transform, repeats alternating
between the two paths (the first one changing every repeat); medians of the repeats.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_jpegs import QUALITY, make_image  # noqa: E402

from vitlab.data import TrainTransform, decode_rgb  # noqa: E402


def jpegs(count: int, size: tuple[int, int] = (500, 375)) -> list[bytes]:
    """`count` encoded photograph-like JPEGs (make_jpegs.py's images, 100 classes)."""
    blobs = []
    for i in range(count):
        buf = io.BytesIO()
        make_image(size[0], size[1], i % 100, 100, (0, i)).save(buf, "JPEG", quality=QUALITY)
        blobs.append(buf.getvalue())
    return blobs


def pixel_difference(images: list, transforms: dict[str, TrainTransform]) -> dict[str, float]:
    """Max and mean |pil - tensor| over every output pixel, same draws per image."""
    worst, total, count = 0, 0.0, 0
    for k, img in enumerate(images):
        a = transforms["pil"](img, random.Random(k)).astype(np.int16)
        b = transforms["tensor"](img, random.Random(k)).astype(np.int16)
        d = np.abs(a - b)
        worst, total, count = max(worst, int(d.max())), total + float(d.sum()), count + d.size
    return {"max_abs": worst, "mean_abs": total / count}


def time_paths(work: dict[str, object], repeats: int, n: int) -> dict[str, list[float]]:
    """ms per image of each path, repeats alternating."""
    names, out = list(work), {name: [] for name in work}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            work[name]()
            out[name].append((time.perf_counter() - t0) / n * 1e3)
    return out


def measure(count: int = 200, repeats: int = 5, size: int = 224) -> dict[str, object]:
    blobs = jpegs(count)
    transforms = {name: TrainTransform((size, size), resize=name) for name in ("pil", "tensor")}
    min_size = transforms["pil"].min_source_size
    images = [decode_rgb(io.BytesIO(b), min_size) for b in blobs]

    def transform_only(tf: TrainTransform):
        return lambda: [tf(img, random.Random(k)) for k, img in enumerate(images)]

    def decode_and_transform(tf: TrainTransform):
        return lambda: [tf(decode_rgb(io.BytesIO(b), min_size), random.Random(k)) for k, b in enumerate(blobs)]

    result: dict[str, object] = {"images": count, "size": size, "threads": torch.get_num_threads(),
                                 "pixel_difference": pixel_difference(images, transforms)}
    for label, make in (("transform", transform_only), ("decode+transform", decode_and_transform)):
        ms = time_paths({name: make(tf) for name, tf in transforms.items()}, repeats, count)
        med = {name: statistics.median(v) for name, v in ms.items()}
        result[label] = {"ms_per_image": med, "repeats": ms, "pil/tensor": med["pil"] / med["tensor"]}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # as in a loader worker
    res = measure(args.images, args.repeats, args.size)
    diff = res["pixel_difference"]
    print(f"{args.images} JPEGs 500x375 -> {args.size}, 1 thread, torch {torch.__version__}")
    for label in ("transform", "decode+transform"):
        r = res[label]
        print(f"{label}: pil {r['ms_per_image']['pil']:.3f} ms/img, tensor {r['ms_per_image']['tensor']:.3f} ms/img, "
              f"pil/tensor {r['pil/tensor']:.2f}x")
    print(f"pixel difference pil vs tensor: max {diff['max_abs']} grey level(s), mean {diff['mean_abs']:.4f}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
