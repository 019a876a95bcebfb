"""How many directions the frozen representation of experiment runs spreads digits over: the effective rank
(exp of the entropy of the centred features' normalised singular values squared; Roy & Vetterli 2007) of each
run's pre-logits features on the digits training images, as they are and standardised per feature (what the
few-shot ridge regression sees), beside the 5-shot accuracy its result.json stores.

A diagnostic for REPRODUCTION.md's notes: a pre-trained representation whose few-shot accuracy falls below its own
initial weights' (data-scaling's "no pre-training" reference) has usually collapsed onto a few directions.

    .venv/bin/python benchmarks/feature_rank.py 'runs/experiments/_runs/*-pre-*-M-fractal_64_1024-s0' \
        'runs/experiments/_runs/*-init-*-s0'
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

import numpy as np


def effective_rank(x: np.ndarray, standardise: bool = False) -> float:
    x = x - x.mean(axis=0, keepdims=True)
    if standardise:  # what the few-shot regression sees: every feature scaled to unit variance
        x = x / (x.std(axis=0, keepdims=True) + 1e-5)
    s = np.linalg.svd(x.astype(np.float64), compute_uv=False)
    p = s**2 / max(float((s**2).sum()), 1e-300)
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories or glob patterns (quoted)")
    parser.add_argument("--data", default="digits", help="whose training images to embed (default digits)")
    args = parser.parse_args()

    from vitlab.data import FEWSHOT_RESIZE, evaluation_splits
    from vitlab.eval import features_of
    from vitlab.runtime import open_session

    # by label (the part after the key), so a family's runs sit together
    dirs = sorted({Path(d) for pattern in args.runs for d in glob.glob(pattern)}, key=lambda d: d.name.split("-", 1)[1])
    split = evaluation_splits(args.data, None).train
    print(f"{'run':50s} {'lr':>7s} {'dims':>5s} {'eff. rank':>9s} {'standardised':>12s} {'5-shot':>7s}")
    for run in dirs:
        weights = run / "model.safetensors"
        if not weights.is_file():
            continue
        model = open_session(weights, device="cpu", precision="fp32").model
        x, _ = features_of(model, split, 256, 0, FEWSHOT_RESIZE, False)
        x = np.asarray(x)
        try:
            result = json.loads((run / "result.json").read_text())
        except (OSError, ValueError):
            result = {}
        shot = result.get("evals", {}).get(f"fewshot/{args.data}", {}).get("accuracy", {}).get("5")
        five = f"{100 * shot['mean']:6.1f}%" if shot else "      -"
        lr = result.get("spec", {}).get("settings", {}).get("lr")
        print(f"{run.name.split('-', 1)[1][:50]:50s} {lr if lr is not None else '-':>7} {x.shape[1]:5d} "
              f"{effective_rank(x):9.2f} {effective_rank(x, True):12.2f} {five}")


if __name__ == "__main__":
    main()
