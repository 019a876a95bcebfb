"""Trainable parameters and peak memory of the fine-tuning tools (README: Fine-tuning tools): `vitlab finetune`
in full, with --freeze backbone, --lora 8, --layer-decay 0.75 and an EMA, each in a fresh process on a small
folder of real photographs (scikit-image and scikit-learn's bundled photos, random crops per class).

Peak memory is the process's maximum resident set size (`resource.getrusage(RUSAGE_SELF).ru_maxrss`) after the run:
the model, its gradients, optimizer state, EMA and activations, and the interpreter and libraries (~0.5 GB);
`--workers 0`, so the decoding happens in that process too. Trainable parameters are the run's banner line.

    .venv/bin/python benchmarks/finetune_tools.py --model ViT-B/16 --steps 2
    .venv/bin/python benchmarks/finetune_tools.py --model ViT-S/16 --steps 3
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

import vitlab

OPTIONS = {
    "full fine-tuning": [],
    "--freeze backbone": ["--freeze", "backbone"],
    "--lora 8": ["--lora", "8"],
    "--layer-decay 0.75": ["--layer-decay", "0.75"],
    "--ema-decay 0.9998 --ema-warmup": ["--ema-decay", "0.9998", "--ema-warmup"],
}

_CHILD = """
import resource, sys
from vitlab.cli import main
status = main(sys.argv[1:])
print(f"MAXRSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)
sys.exit(status)
"""


def photo_folder(root: Path, per_class: int = 8, val: int = 2) -> Path:
    """Four classes of real photographs, each image a set of random crops (train) and central ones (val)."""
    from skimage import data
    from sklearn.datasets import load_sample_images

    photos = {"astronaut": data.astronaut(), "coffee": data.coffee(), "chelsea": data.chelsea(),
              "flower": load_sample_images().images[1]}
    rng = np.random.default_rng(0)
    for name, pixels in photos.items():
        h, w = pixels.shape[:2]
        for split, count in (("train", per_class), ("val", val)):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                side = int(rng.integers(min(h, w) // 2, min(h, w)))
                top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
                Image.fromarray(pixels[top:top + side, left:left + side]).save(root / split / name / f"{i}.jpg",
                                                                               quality=90)
    return root


def measure(args: list[str], run_dir: Path) -> tuple[str, float]:
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"failed: vitlab {' '.join(args)}\n{proc.stderr[-2000:]}")
    rss_kib = int(re.search(r"MAXRSS (\d+)", proc.stdout).group(1))
    console = (run_dir / "console.log").read_text()
    trained = re.search(r"train   ([\d.,]+M?) of ([\d.,]+M?) parameters train", console)
    return f"{trained.group(1)} of {trained.group(2)}", rss_kib / 1024 ** 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = photo_folder(root / "photos")
        init = root / "init.safetensors"  # random weights: memory and parameter counts do not depend on them
        vitlab.save(vitlab.create_model(args.model, image_size=args.image_size, num_classes=1000), init)
        print(f"| {args.model}, {args.image_size} px, batch {args.batch_size}, {args.steps} steps (SGD) | trainable "
              "parameters | peak RSS |\n|---|---|---|")
        for label, extra in OPTIONS.items():
            out = root / f"run{len(extra)}{label[2:6]}"
            cmd = ["finetune", "--init", str(init), "--data", str(data), "--out", str(out), "--steps",
                   str(args.steps), "--batch-size", str(args.batch_size), "--warmup", "0", "--workers", "0",
                   "--eval-batch-size", "8", *extra]
            trained, gib = measure(cmd, out)
            print(f"| {label} | {trained} | {gib:.2f} GiB |", flush=True)


if __name__ == "__main__":
    main()
