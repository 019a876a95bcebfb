"""Images/s of the drawn pre-training sources on one thread, in one run so the figures compare: `strokes:`
(data/strokes.py), `fonts:` (data/fontglyphs.py; every glyph drawn from nothing in each run, as a first render
does: `fonts` as 20 classes of 100 images, `fonts-2x1000` as 2 classes of 1,000, where each of a class's 84
(font, stroke) glyphs serves ~12 images, as in the large specs pre-training uses) and `fractal:`
(data/fractal.py, its splits as `--data` renders them: 64 px, filters and redraws included), each rendering about
2,000 images in memory (no cache is read), 20 classes unless said.

    .venv/bin/python benchmarks/generators.py [--images 2000] [--repeats 3]

Prints one line per generator: the best of `repeats` runs (other processes on a shared machine only slow a run
down), with the render size.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch


def strokes(images: int) -> tuple[Callable[[], object], int]:
    from vitlab.data import strokes as S

    spec = S.parse_spec(f"strokes:20:{images // 20}")
    classes = S.draw_classes(0, 20)  # drawn once, as fractal's categories: the cost per image is the split's
    return lambda: S.render_split(spec, "train", classes), S.RENDER_SIZE


def fractal(images: int) -> tuple[Callable[[], object], int]:
    from vitlab.data import fractal as F

    spec = F.FractalSpec(20, images // 20)
    systems, _ = F.draw_categories(0, 20)  # drawn once: the cost per image is the split's rendering
    return lambda: F.render_split(spec, "train", systems), F.RENDER_SIZE


def fonts(images: int, classes: int = 20) -> tuple[Callable[[], object], int]:
    from vitlab.data import fontglyphs as G

    spec = G.parse_spec(f"fonts:{classes}:{images // classes}")

    def render() -> object:
        G.glyph.cache_clear()
        return G.render_split(spec, "train")

    render()  # the fonts are read once per process
    return render, G.RENDER_SIZE


GENERATORS = {"strokes": strokes, "fonts": fonts, "fonts-2x1000": lambda n: fonts(n, classes=2), "fractal": fractal}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=sorted(GENERATORS), nargs="*", help="generators to time (default all)")
    args = p.parse_args()
    torch.set_num_threads(1)
    for name in args.only or GENERATORS:
        render, size = GENERATORS[name](args.images)
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            render()
            best = min(best, time.perf_counter() - start)
        print(f"{name:12s} {size} px: {args.images / best:8,.0f} images/s ({args.images:,} images in {best:.2f} s, "
              f"best of {args.repeats}, one thread)")


if __name__ == "__main__":
    main()
