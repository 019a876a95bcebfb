"""How fast can one core turn JPEG bytes into training inputs? Decoders and resizers compared on generated
photograph-like JPEGs (benchmarks/make_jpegs.py), single thread, one process, bytes already in memory.

    python benchmarks/decode.py [--count 200] [--sizes 500x375,1024x768] [--repeats 3] [--simd PYTHON]

Rows, per image size:
- Pillow as vitlab decodes (`ImageSplit.load`): open, JPEG draft mode when the short side is at least twice
  the transform's `min_source_size`, convert("RGB"). The training transform at 224 with the inception crop's
  area range (0.05, 1) needs a short side of ceil(224 / sqrt(0.05)) = 1002, so draft mode starts at 2004 px;
  the big_vision evaluation resize needs 256 (draft from 512 px).
- Pillow with draft forced to 1/2 and 1/4 (what draft mode would save if it were allowed), Pillow
  `reduce(2)` and `thumbnail` after a full decode, torchvision.io.decode_jpeg (CPU; it has no reduced-size
  option), and with --simd PYTHON the Pillow rows again under another interpreter (a venv with pillow-simd).
Accuracy: every decoder's image goes through the same resize (big_vision evaluation: short side 256, central
224 crop, bilinear) and is compared with the full Pillow decode put through it: max and mean |difference| in
grey levels (0-255), over all images.
End to end: vitlab's TrainTransform at 224 (TF inception crop, flip) after each decoder (also after a decode
that skips convert("RGB")'s copy), and torchvision's tensor path (decode_jpeg, then resized_crop with antialias
on the uint8 tensor, same crop boxes). Its accuracy column compares with vitlab's Pillow path on the same boxes.
Allocator: see MALLOC_ENV; --default-malloc measures with glibc's defaults instead.

The Pillow-only suite (`pillow_suite`) imports nothing but Pillow and numpy, so that it runs under pillow-simd
in a venv without torch; the repeats alternate between interpreters (stock, simd, stock, ...).
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
TRAIN_NEED = math.ceil(224 / math.sqrt(0.05))  # TrainTransform((224, 224)).min_source_size
EVAL_NEED = 256  # EvalTransform((224, 224), "big_vision").min_source_size
Method = Callable[[int, bytes], Any]
# glibc, by default, gives a freed multi-megabyte image buffer back to the OS and page-faults the next one in:
# 1,500 faults and +3.8 ms per 1024x768 image for convert("RGB")'s copy, even with torch imported (measured with
# getrusage). That is an allocator effect, not a decoder's: every process here runs with these thresholds (the
# script re-executes itself with them), so that the rows compare decoders. --default-malloc shows the default.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}


# ---- Pillow only (any Pillow, no torch) ---------------------------------------------------------------------


def _open(b: bytes) -> Image.Image:
    return Image.open(io.BytesIO(b))


def pil_vitlab(b: bytes, need: int) -> Image.Image:
    """sources.py's decode: draft when the short side is >= 2 x need, then RGB."""
    with _open(b) as img:
        if need and img.format == "JPEG" and min(img.size) >= 2 * need:
            img.draft("RGB", (need, need))
        return img.convert("RGB")


def pil_scaled(b: bytes, k: int) -> Image.Image:
    """Draft forced to 1/k (libjpeg's DCT scaling; Pillow picks the largest scale that divides both sides by
    at least k, so the request is floored)."""
    with _open(b) as img:
        img.draft("RGB", (img.width // k, img.height // k))
        return img.convert("RGB")


def pil_load(b: bytes) -> Image.Image:
    """Decode without convert: convert("RGB") of an RGB image is a copy."""
    img = _open(b)
    img.load()
    return img


def pil_thumbnail(b: bytes) -> Image.Image:
    img = pil_load(b)  # loaded first: thumbnail would otherwise use draft itself
    img.thumbnail((EVAL_NEED * img.width // min(img.size) + 1, EVAL_NEED * img.height // min(img.size) + 1))
    return img


def eval_resize(img: Image.Image, size: int = 224, short: int = EVAL_NEED) -> np.ndarray:
    """big_vision's evaluation resize (EvalTransform "big_vision"): short side to 256, central 224 crop."""
    ratio = short / min(img.size)
    w, h = round(img.width * ratio), round(img.height * ratio)
    left, top = (w - size) // 2, (h - size) // 2
    return np.asarray(img.resize((w, h), Image.Resampling.BILINEAR).crop((left, top, left + size, top + size)))


def crop_resize(img: Image.Image, box: list[float], flip: bool, size: int = 224) -> np.ndarray:
    """The training transform's work on a given box (fractions of the image): crop, resize, flip, array."""
    w, h = img.size
    out = img.crop((round(box[0] * w), round(box[1] * h), round(box[2] * w), round(box[3] * h)))
    out = out.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else out)


def pillow_methods(boxes: list[list[float]]) -> dict[str, Method]:
    """name -> (index, bytes) -> image or array. The last row is the training transform's work on fixed boxes,
    so that stock Pillow and pillow-simd are timed on the same work without vitlab (which needs torch)."""
    return {
        "Pillow, as vitlab (train 224)": lambda i, b: pil_vitlab(b, TRAIN_NEED),
        "Pillow, as vitlab (eval 224)": lambda i, b: pil_vitlab(b, EVAL_NEED),
        "Pillow load, no convert": lambda i, b: pil_load(b),
        "Pillow draft 1/2": lambda i, b: pil_scaled(b, 2),
        "Pillow draft 1/4": lambda i, b: pil_scaled(b, 4),
        "Pillow full + reduce(2)": lambda i, b: pil_load(b).reduce(2),
        "Pillow full + thumbnail(256)": lambda i, b: pil_thumbnail(b),
        "Pillow + crop/resize/flip (fixed boxes)": lambda i, b: crop_resize(pil_vitlab(b, TRAIN_NEED), *boxes[i]),
    }


def interleaved(methods: dict[str, Method], data: list[bytes], repeats: int) -> dict[str, list[float]]:
    """{name: images/s per repeat}; the methods take turns within each repeat, the first one rotating, and
    the garbage collector is paused during a timed pass."""
    names = list(methods)
    for n in names:
        methods[n](0, data[0])  # warm: imports, first-call set-up
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            fn = methods[n]
            gc.collect()
            gc.disable()
            t0 = time.perf_counter()
            for i, b in enumerate(data):
                fn(i, b)
            rates[n].append(len(data) / (time.perf_counter() - t0))
            gc.enable()
    return rates


def pillow_suite(job: dict) -> dict:
    """Time the Pillow methods and save each one's eval-resized images for the accuracy check."""
    data = [Path(f).read_bytes() for f in job["files"]]
    methods = pillow_methods(job["boxes"])
    rates = interleaved(methods, data, job["repeats"])
    resized = {n: np.stack([eval_resize(_as_pil(methods[n](i, b))) for i, b in enumerate(data)])
               for n in methods if "fixed boxes" not in n}
    resized["Pillow + crop/resize/flip (fixed boxes)"] = np.stack(
        [methods["Pillow + crop/resize/flip (fixed boxes)"](i, b) for i, b in enumerate(data)])
    np.savez(job["arrays"], **{str(k): v for k, v in enumerate(resized.values())})
    import PIL

    return {"rates": rates, "names": list(resized), "pillow": PIL.__version__}


def _as_pil(x: Any) -> Image.Image:
    return x if isinstance(x, Image.Image) else Image.fromarray(np.ascontiguousarray(x))


# ---- torch side: torchvision and vitlab's transform ---------------------------------------------------------


def torch_methods(boxes: list[list[float]]) -> dict[str, Method]:
    import torch
    import torchvision.io as tio
    import torchvision.transforms.v2.functional as TF

    from vitlab.data import EvalTransform, TrainTransform

    train, evaluate = TrainTransform((224, 224)), EvalTransform((224, 224), "big_vision")

    def tv(b: bytes) -> Any:
        return tio.decode_jpeg(torch.frombuffer(bytearray(b), dtype=torch.uint8), mode=tio.ImageReadMode.RGB)

    def tv_pil(b: bytes) -> Image.Image:
        return Image.fromarray(tv(b).permute(1, 2, 0).numpy())  # (H, W, 3): the decoder's own layout, no copy

    def tv_tensor_train(i: int, b: bytes) -> Any:
        t = tv(b)
        box, flip = boxes[i]
        h, w = t.shape[1:]
        left, top, right, bottom = (round(box[0] * w), round(box[1] * h), round(box[2] * w), round(box[3] * h))
        out = TF.resized_crop(t, top, left, bottom - top, right - left, [224, 224], antialias=True)
        return (out.flip(-1) if flip else out).permute(1, 2, 0).numpy()

    return {
        "torchvision decode_jpeg (tensor)": lambda i, b: tv(b),
        "torchvision decode_jpeg -> PIL": lambda i, b: tv_pil(b),
        "e2e train: Pillow as vitlab + TrainTransform": lambda i, b: train(pil_vitlab(b, TRAIN_NEED),
                                                                          random.Random(i)),
        "e2e train: Pillow load, no copy + TrainTransform": lambda i, b: train(pil_load(b), random.Random(i)),
        "e2e train: torchvision -> PIL + TrainTransform": lambda i, b: train(tv_pil(b), random.Random(i)),
        "e2e train: Pillow draft 1/2 + TrainTransform": lambda i, b: train(pil_scaled(b, 2), random.Random(i)),
        "e2e train: torchvision tensor resized_crop (fixed boxes)": tv_tensor_train,
        "e2e eval: Pillow as vitlab + EvalTransform big_vision": lambda i, b: evaluate(pil_vitlab(b, EVAL_NEED)),
        "e2e eval: torchvision -> PIL + EvalTransform big_vision": lambda i, b: evaluate(tv_pil(b)),
    }


def fixed_boxes(files: list[str], seed: int = 0) -> list[list]:
    """Per image a TF inception-crop box as fractions of the image, and a flip, drawn as TrainTransform draws."""
    from vitlab.data import tf_inception_box

    out = []
    for i, f in enumerate(files):
        with Image.open(f) as img:
            w, h = img.size
        rng = random.Random(seed * 1_000_003 + i)
        left, top, right, bottom = tf_inception_box(w, h, (0.05, 1.0), (3 / 4, 4 / 3), rng)
        out.append([[left / w, top / h, right / w, bottom / h], rng.random() < 0.5])
    return out


def _torch_outputs(methods: dict[str, Method], data: list[bytes], boxes: list[list]) -> dict[str, np.ndarray]:
    """What the torch-side rows produce, comparable with a reference. fixed_boxes draws what TrainTransform
    draws (same seeds), so the TrainTransform rows are comparable with Pillow's crop/resize on those boxes; the
    draft-1/2 row is compared on the same boxes at half resolution (TrainTransform would draw its box anew)."""
    def run(name: str, post: Callable[[Any], np.ndarray] = np.asarray) -> np.ndarray:
        return np.stack([post(methods[name](i, b)) for i, b in enumerate(data)])

    out = {n: run(n) for n in methods if n.startswith(("e2e", "torchvision decode_jpeg ->"))
           and "draft" not in n}
    out["torchvision decode_jpeg -> PIL"] = run("torchvision decode_jpeg -> PIL", eval_resize)
    out["e2e train: Pillow draft 1/2 + TrainTransform"] = np.stack(
        [crop_resize(pil_scaled(b, 2), *boxes[i]) for i, b in enumerate(data)])
    return out


def _diff(a: np.ndarray, b: np.ndarray) -> tuple[int, float]:
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return int(d.max()), float(d.mean())


def measure_size(files: list[str], repeats: int, simd: str | None) -> list[dict]:
    """Rows for one image size: Pillow (stock, and simd when given) in subprocesses taking turns, then the
    torch-side methods in this process."""
    boxes = fixed_boxes(files)
    pythons = {"": sys.executable, **({"pillow-simd ": simd} if simd else {})}
    rates: dict[str, list[float]] = {}
    arrays: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for tag, python in list(pythons.items())[:: 1 if r % 2 == 0 else -1]:
                job = {"files": files, "boxes": boxes, "repeats": 1, "arrays": f"{tmp}/{len(tag)}.npz"}
                res = _run_suite(python, job, tmp)
                for name, v in res["rates"].items():
                    rates.setdefault(f"{tag}{name}", []).extend(v)
                if r == 0:
                    with np.load(job["arrays"]) as z:
                        arrays.update({f"{tag}{n}": z[str(k)] for k, n in enumerate(res["names"])})
    data = [Path(f).read_bytes() for f in files]
    methods = torch_methods(boxes)
    rates.update(interleaved(methods, data, repeats))
    arrays.update(_torch_outputs(methods, data, boxes))
    ref = arrays["Pillow, as vitlab (train 224)"]  # no draft at these sizes: the full decode, eval-resized
    box_ref = arrays["Pillow + crop/resize/flip (fixed boxes)"]
    rows = []
    for name, v in rates.items():
        is_box = "fixed boxes" in name or name.startswith("e2e train")

        against = box_ref if is_box else ref
        acc = _diff(arrays[name], against) if name in arrays and arrays[name] is not against else None
        rows.append({"method": name, "images_per_s": statistics.median(v), "repeats": v,
                     "max_diff": acc and acc[0], "mean_diff": acc and acc[1], "vs": "boxes" if is_box else "eval"})
    return rows


def _run_suite(python: str, job: dict, tmp: str) -> dict:
    path = Path(tmp) / "job.json"
    path.write_text(json.dumps(job))
    cmd = [python, str(Path(__file__).resolve()), "--suite", str(path)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(size: str, n: int, rows: list[dict], versions: str) -> str:
    lines = [f"### {size}, {n} images ({versions})", "",
             "| decoder / pipeline | img/s (median) | ms/img | max abs diff | mean abs diff |", "|---|---|---|---|---|"]
    for r in rows:
        acc = "-" if r["max_diff"] is None else r["max_diff"]
        mean = "-" if r["mean_diff"] is None else f"{r['mean_diff']:.3f}"
        lines.append(f"| {r['method']} | {r['images_per_s']:.1f} | {1000 / r['images_per_s']:.2f} | {acc} | {mean} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=200, help="images per size (default 200)")
    p.add_argument("--sizes", default="500x375,1024x768")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "vitlab-decode",
                   help="where the generated JPEGs are kept between runs")
    p.add_argument("--simd", metavar="PYTHON", help="an interpreter with pillow-simd (and numpy) installed")
    p.add_argument("--json", type=Path, help="also write the rows as JSON")
    p.add_argument("--default-malloc", action="store_true",
                   help="keep glibc's default allocator thresholds (see MALLOC_ENV)")
    p.add_argument("--suite", type=Path, help=argparse.SUPPRESS)  # internal: run pillow_suite on a job file
    args = p.parse_args(argv)
    if not args.suite and not args.default_malloc and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})
    if args.suite:
        print(json.dumps(pillow_suite(json.loads(args.suite.read_text()))))
        return 0
    import PIL
    import torch
    import torchvision
    from make_jpegs import generate, parse_size

    torch.set_num_threads(1)
    malloc = "default glibc malloc" if args.default_malloc else "glibc mmap/trim thresholds raised"
    versions = f"Pillow {PIL.__version__}, torchvision {torchvision.__version__}, 1 thread, {malloc}"
    if args.simd:
        simd_version = subprocess.run([args.simd, "-c", "import PIL; print(PIL.__version__)"], check=True,
                                      capture_output=True, text=True).stdout.strip()
        versions += f", pillow-simd {simd_version}"
    results = {}
    for size_text in args.sizes.split(","):
        size = parse_size(size_text)
        folder = args.dir / size_text
        generate(folder, args.count, size, classes=1, show=False)
        files = sorted(str(f) for f in folder.rglob("*.jpg"))[: args.count]
        rows = measure_size(files, args.repeats, args.simd)
        results[size_text] = rows
        print(table(size_text, len(files), rows, versions) + "\n", flush=True)
    print("max/mean abs diff: grey levels after the same resize; decoders against the full Pillow decode "
          "(big_vision eval resize to 224), e2e train rows and fixed-box rows against Pillow's crop/resize on "
          "the same boxes. '-': not an image of the comparable size (timed only).")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
