"""A/B on one core: vitlab's training path per image with the old `convert("RGB")` copy vs `decode_rgb`.

Usage: OMP_NUM_THREADS=1 python benchmarks/rgb_copy_ab.py DIR   (JPEGs from benchmarks/make_jpegs.py)
"""
import glob
import io
import random
import statistics
import sys
import time

import torch  # noqa: F401  (as in a loader worker)
from PIL import Image

from vitlab.data import TrainTransform, decode_rgb

files = sorted(glob.glob(sys.argv[1] + "/**/*.jpg", recursive=True))[:150]
blobs = [open(f, "rb").read() for f in files]
tf = TrainTransform((224, 224))
def old(b):
    with Image.open(io.BytesIO(b)) as img:
        return img.convert("RGB")
def new(b):
    return decode_rgb(io.BytesIO(b))
res = {"old": [], "new": []}
for _ in range(5):
    for name, fn in (("old", old), ("new", new)):
        t = time.perf_counter()
        for k, b in enumerate(blobs):
            tf(fn(b), random.Random(k))
        res[name].append((time.perf_counter() - t) / len(blobs) * 1e3)
for k, v in res.items():
    print(k, f"{statistics.median(v):.2f} ms/img", [round(x, 2) for x in v])
print("ratio old/new", statistics.median(res["old"]) / statistics.median(res["new"]))
