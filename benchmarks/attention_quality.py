"""Does the matmul attention form train as well as flash? Real `vitlab train` / `finetune` runs of both forms
(`--attention flash|matmul`, bf16, where the forms differ), several seeds each, compared at their end.

    python benchmarks/attention_quality.py --out /tmp/aq --parts demo finetune curve --budget 240
    python benchmarks/attention_quality.py --out /tmp/aq --report            # table, JSON and curve.png

Parts:
- demo: the demo recipe (`vitlab train`, 1,000 steps on the embedded digits), final validation loss and top-1.
- finetune: the tutorial's fine-tune on real photos (four photographs bundled with scikit-image and
  scikit-learn, cropped into 24 training and 6 validation images a class, docs/tutorial.md), from one demo model
  pre-trained for 200 steps (float32, flash), `--image-size 32 --steps 120`.
- curve: ViT-S/16 at 224 px on the embedded MNIST from scratch, the training loss every 10 steps.

Every run is resumable: `--budget S` stops the whole invocation after S seconds (the running `vitlab` process is
sent SIGTERM, saves a checkpoint and is resumed by the next invocation), so a long comparison runs as short
chunks on a shared machine; a run with its final weights written is done. Runs of the same seed go round-robin,
so both forms advance together.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

FORMS = ("flash", "matmul")
CURVE_ARGS = ("--model ViT-S/16 --image-size 224 --data mnist --batch-size {batch} --steps {steps} --warmup {warmup} "
              "--lr 3e-4 --crop-scale 0.5 1 --no-flip --eval-every 0 --log-every 10")
DEMO_ARGS = "--eval-every 0"
FINETUNE_ARGS = "--image-size 32 --steps 120 --eval-every 0"


def vitlab() -> list[str]:
    return [sys.executable, "-m", "vitlab"]


def make_photos(folder: Path) -> None:
    """The tutorial's photo folder (docs/tutorial.md, section 1), written once."""
    if (folder / "val").is_dir():
        return
    import numpy as np
    from PIL import Image
    from skimage import data
    from sklearn.datasets import load_sample_images

    photos = {"astronaut": data.astronaut(), "cat": data.chelsea(), "coffee": data.coffee(),
              "flower": load_sample_images().images[1]}
    rng = np.random.default_rng(0)
    for name, pixels in photos.items():
        h, w = pixels.shape[:2]
        for split, count in (("train", 24), ("val", 6)):
            sub = folder / split / name
            sub.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                side = int(rng.integers(min(h, w) // 2, min(h, w)))
                top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
                Image.fromarray(pixels[top:top + side, left:left + side]).save(sub / f"{i:03d}.jpg")


def planned(args: argparse.Namespace) -> list[tuple[str, str, int, list[str]]]:
    """(part, form, seed, the verb and its arguments) for every run, seeds outermost."""
    runs = []
    for part in args.parts:
        for seed in args.seeds:
            for form in FORMS:
                common = ["--precision", "bf16", "--attention", form, "--seed", str(seed)]
                if part == "demo":
                    runs.append((part, form, seed, ["train", *DEMO_ARGS.split(), *common]))
                elif part == "finetune":
                    runs.append((part, form, seed, ["finetune", "--init", str(args.out / "pretrained"), "--data",
                                                    str(args.out / "photos"), *FINETUNE_ARGS.split(), *common]))
                else:
                    curve = CURVE_ARGS.format(batch=args.curve_batch, steps=args.curve_steps,
                                              warmup=args.curve_steps // 10)
                    runs.append((part, form, seed, ["train", *curve.split(), *common]))
    return runs


def run_dir(out: Path, part: str, form: str, seed: int) -> Path:
    return out / f"{part}-{form}-s{seed}"


def done(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file()


def run_chunk(cmd: list[str], seconds: float) -> bool:
    """Runs `cmd` for at most `seconds`, then SIGTERM (the trainer checkpoints and exits); True if it finished."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate()
        return False
    if proc.returncode not in (0, 143):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
    return proc.returncode == 0


def execute(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    if "finetune" in args.parts:
        make_photos(args.out / "photos")
        if not done(args.out / "pretrained"):
            run_chunk([*vitlab(), "-q", "train", "--out", str(args.out / "pretrained"), "--steps", "200"],
                      args.budget)
    pending = [r for r in planned(args) if not done(run_dir(args.out, *r[:3]))]
    while pending and time.monotonic() < deadline - 20:
        for part, form, seed, verb in list(pending):
            left = deadline - time.monotonic()
            if left < 20:
                break
            folder = run_dir(args.out, part, form, seed)
            resume = ["--resume"] if (folder / "checkpoints").is_dir() and any((folder / "checkpoints").iterdir()) \
                else []
            cmd = [*vitlab(), "-q", *verb, "--out", str(folder), *resume]
            print(f"{part} {form} seed {seed}: {'resume' if resume else 'start'} ({left:.0f} s left)", flush=True)
            if run_chunk(cmd, min(left, args.chunk)):
                pending.remove((part, form, seed, verb))
    print(f"{len(pending)} runs pending", flush=True)


def metrics(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def final_val(folder: Path) -> dict | None:
    """The last validation line of a finished run (the trainer evaluates once at the end)."""
    vals = [m for m in metrics(folder) if m.get("split") == "val"]
    return vals[-1] if vals and done(folder) else None


def train_losses(folder: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(folder) if m.get("split") == "train"}


def report(args: argparse.Namespace) -> dict:
    import statistics

    summary: dict = {}
    for part in ("demo", "finetune"):
        rows = {}
        for form in FORMS:
            vals = {s: final_val(run_dir(args.out, part, form, s)) for s in args.seeds}
            vals = {s: v for s, v in vals.items() if v is not None}
            if vals:
                seeds = sorted(vals)
                rows[form] = {"seeds": seeds, "loss": [vals[s]["loss"] for s in seeds],
                              "top1": [vals[s]["top1"] for s in seeds], "count": vals[seeds[0]]["count"]}
        if rows:
            summary[part] = rows
            print(f"\n{part}: final validation ({next(iter(rows.values()))['count']} images)")
            print("| form | val loss (per seed) | mean | top-1 (per seed) | mean |\n|---|---|---:|---|---:|")
            for form, r in rows.items():
                losses = " / ".join(f"{v:.4f}" for v in r["loss"])
                tops = " / ".join(f"{100 * v:.1f}" for v in r["top1"])
                print(f"| {form} | {losses} | {statistics.mean(r['loss']):.4f} | {tops} % | "
                      f"{100 * statistics.mean(r['top1']):.1f} % |")
    curves = {(form, s): train_losses(run_dir(args.out, "curve", form, s)) for form in FORMS for s in args.seeds}
    curves = {k: v for k, v in curves.items() if v}
    if curves:
        summary["curve"] = {f"{form}-s{s}": {str(k): v for k, v in c.items()} for (form, s), c in curves.items()}
        common = set.intersection(*(set(c) for c in curves.values()))
        last = max(common) if common else 0
        print("\ncurve: ViT-S/16 224 px, steps reached: "
              + ", ".join(f"{form} s{s} {max(c)}" for (form, s), c in curves.items()))
        marks = [st for st in sorted(common) if st % 100 == 0 or st == last]
        if marks:
            window = 5  # mean of the 5 logged losses ending at each mark (50 steps)
            print("| step | " + " | ".join(str(st) for st in marks) + " |")
            print("|---|" + "---|" * len(marks))
            for (form, s), c in curves.items():
                steps = sorted(c)
                cells = []
                for st in marks:
                    i = steps.index(st)
                    chunk = [c[x] for x in steps[max(0, i - window + 1):i + 1]]
                    cells.append(f"{statistics.mean(chunk):.3f}")
                print(f"| {form} s{s} | " + " | ".join(cells) + " |")
        plot(curves, args.out / "curve.png")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (form, seed), c in sorted(curves.items()):
        steps = sorted(c)
        smooth = [sum(c[x] for x in steps[max(0, i - 4):i + 1]) / len(steps[max(0, i - 4):i + 1])
                  for i in range(len(steps))]
        ax.plot(steps, smooth, color="tab:blue" if form == "flash" else "tab:orange",
                linestyle=("-", "--", ":")[seed % 3], label=f"{form}, seed {seed}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean of 50 steps)")
    ax.set_title("ViT-S/16, 224 px, bf16: flash vs matmul attention")
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="working folder: the runs, summary.json, curve.png")
    p.add_argument("--parts", nargs="+", choices=("demo", "finetune", "curve"), default=["demo", "finetune"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--budget", type=float, default=240, help="seconds this invocation may run")
    p.add_argument("--chunk", type=float, default=120, help="seconds one run gets before the next takes over")
    p.add_argument("--curve-steps", type=int, default=1000)
    p.add_argument("--curve-batch", type=int, default=8)
    p.add_argument("--report", action="store_true", help="only summarise what the runs wrote")
    args = p.parse_args()
    if not args.report:
        execute(args)
    report(args)


if __name__ == "__main__":
    main()
