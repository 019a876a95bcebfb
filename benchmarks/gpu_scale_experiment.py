"""The scale questions on a GPU (issue 38 item 6): data-scaling (paper Figs. 3-4) and compute (Fig. 5) need far more
images seen than a 2-core CPU gives; one H200 at bf16 sees more in minutes than the whole CPU campaign.

    python benchmarks/gpu_scale_experiment.py --out reproduction       # one H200, bf16: about 6.5 minutes
    python benchmarks/gpu_scale_experiment.py --dry-run --out /tmp/g   # anywhere: tiny sizes, a few seconds

On the device tool's machine, as a sibling of the device check in the same call (repository root):

    python3 -m pip install -q --no-deps --no-build-isolation -e . && python3 benchmarks/device_check.py --out $OUT \
        && python3 benchmarks/gpu_scale_experiment.py --out $OUT

What it runs. Synthetic data drawn on the GPU by a formula (`draw`: per class a few coloured gratings and a
located blob, per image a shift, contrast and noise from a hash of its index, so a "set of N images" is indices
0..N-1 and nothing is stored): 256 upstream classes; transfer to 10 other classes (another formula seed), scored
few-shot (closed-form ridge on `pre_logits` and the encoder output, 10 and 25 shots, vitlab.eval.fewshot_lsr). ViT/4
and BiT ResNetV2 at three sizes matched in multiply-adds (vitlab.models.flops; `MODELS`). Every run gets the same
training
compute B (multiply-adds): steps = B / (training MACs per image × batch), so sizes and families are compared at
matched compute; data-scaling: size M at three set sizes; compute: sizes S, M, L on the largest set. One seed.

Time (expected: about 6.5 minutes on one H200; not yet measured, no GPU was lent when this was written). A
calibration times 8 steps of each model; B is then the largest budget for which every run, at its measured speed,
fits 80 % of `--budget-s` (default 420 s): training takes 336 s by construction on any GPU (a slower one gets a
smaller B, recorded), and a run past 1.5× its calibrated time + 5 s stops there and says so. The rest: start-up
about 20 s (the device check's runs), calibration about 10 s, evaluation about 2 s a run (4,096 held-out images
twice, 500 + 1,000 transfer images through two representations): 20 + 10 + 336 + 20 s, under the 8 minutes allowed.

Writes OUT/gpu-scale/results.json in the experiments' format, sealed (reproduction.records), so that `vitlab
experiment report --out OUT` shows it beside the CPU runs; a --dry-run's results say mode "dry-run" and are not shown.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from reproduction.design import Check, Verdict
from reproduction.experiment import write_results
from reproduction.measures import slope
from reproduction.preconditions import LEARNS_TOP1
from reproduction.report.audit import PLATEAU_POINTS
from vitlab import __version__
from vitlab.eval import fewshot_on_features, representations
from vitlab.models import ViTConfig, build_model, count_macs, model_config

NAME = "gpu-scale"
FAMILIES = ("ViT", "BiT")
MODELS = {  # matched in multiply-adds per image at 32 px (vitlab.models.flops): 84/90, 244/239, 640/635 M
    ("ViT", "S"): ("ViT-Ti/4", {"depth": 6, "width": 128, "num_heads": 4, "mlp_dim": 512}),
    ("ViT", "M"): ("ViT-Ti/4", {"depth": 8, "width": 192, "num_heads": 6, "mlp_dim": 768}),
    ("ViT", "L"): ("ViT-Ti/4", {"depth": 12, "width": 256, "num_heads": 8, "mlp_dim": 1024}),
    ("BiT", "S"): ("BiT-R50x1", {"layers": [2, 2], "width_factor": 2}),
    ("BiT", "M"): ("BiT-R50x1", {"layers": [3, 2], "width_factor": 3}),
    ("BiT", "L"): ("BiT-R50x1", {"layers": [4, 4], "width_factor": 4}),
}
TINY = {"ViT": ("ViT-Ti/4", {"depth": 1, "width": 16, "num_heads": 2, "mlp_dim": 32}),
        "BiT": ("BiT-R50x1", {"layers": [1], "width_factor": 1})}
LR = {"ViT": 1e-3, "BiT": 3e-3}  # Adam, not tuned here: precondition (c) is not measured (the report says so)


@dataclass(frozen=True)
class Plan:
    mode: str  # "gpu" or "dry-run"
    classes: int = 256
    transfer_classes: int = 10
    image_size: int = 32
    batch: int = 512
    set_sizes: tuple[int, ...] = (1 << 13, 1 << 17, 1 << 21)  # distinct upstream images (per all classes)
    shots: tuple[int, ...] = (10, 25)
    transfer_test: int = 1000
    val_images: int = 4096
    budget_s: float = 420.0
    train_share: float = 0.8
    calibration_steps: int = 8
    tiny: bool = False
    max_steps: int | None = None


DRY = Plan("dry-run", classes=4, transfer_classes=3, image_size=16, batch=8, set_sizes=(16, 64, 256), shots=(1, 2),
           transfer_test=12, val_images=16, budget_s=2.0, calibration_steps=1, tiny=True, max_steps=3)


# --- synthetic data, on the device -------------------------------------------------------------------------------
def _hash(x: torch.Tensor) -> torch.Tensor:
    """A uniform [0, 1) number per element of an integer tensor (sin-fract hash, float64 for its precision)."""
    return torch.frac(torch.sin(x.double() * 12.9898 + 78.233) * 43758.5453).float()


def prototypes(classes: int, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Per class: three coloured gratings (frequency, phase, colour) and a blob (centre, colour)."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda *shape: torch.rand(*shape, generator=g).to(device)  # noqa: E731
    return {"freq": (draw(classes, 3, 2) - 0.5) * 12, "phase": draw(classes, 3) * 2 * math.pi,
            "colour": draw(classes, 3, 3) * 2 - 1, "centre": draw(classes, 2) * 0.6 + 0.2,
            "blob": draw(classes, 3) * 2 - 1}


def draw(protos: dict[str, torch.Tensor], labels: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Images (N, 3, size, size) of classes `labels`, image `index` within its class: what changes between images
    of a class (shift, contrast, blob jitter, noise) is a hash of (class, index), so the same index is the same
    image and a set of N images is indices 0..N/classes-1."""
    device = labels.device
    key = labels.long() * 1_000_003 + index.long()
    u = torch.stack([_hash(key * 7 + k) for k in range(5)], dim=1)  # (N, 5)
    ys, xs = torch.meshgrid(torch.linspace(0, 1, size, device=device), torch.linspace(0, 1, size, device=device),
                            indexing="ij")
    grid = torch.stack([xs, ys])  # (2, H, W)
    shift = (u[:, :2] - 0.5) * 0.3  # translation, in image widths
    pos = grid[None] + shift[:, :, None, None]  # (N, 2, H, W)
    f, ph, col = protos["freq"][labels], protos["phase"][labels], protos["colour"][labels]
    wave = torch.sin(2 * math.pi * torch.einsum("nkc,nchw->nkhw", f, pos) + ph[:, :, None, None])  # (N, 3, H, W)
    image = torch.einsum("nkhw,nkc->nchw", wave, col) / 3
    centre = protos["centre"][labels] + (u[:, 2:4] - 0.5) * 0.2
    dist = ((grid[None] - centre[:, :, None, None]) ** 2).sum(1, keepdim=True)
    image = image + protos["blob"][labels][:, :, None, None] * torch.exp(-dist / 0.01)
    contrast = 0.6 + 0.8 * u[:, 4:5, None, None]
    noise = _hash(key[:, None, None, None] * 131 + torch.arange(3 * size * size, device=device).view(1, 3, size,
                                                                                                        size))
    return (contrast * image + 0.3 * (noise - 0.5)).clamp(-1.5, 1.5)


def batch_of(protos: dict, plan: Plan, n: int, step: int, set_size: int, device: torch.device) -> tuple:
    """Training batch `step` of a set of `set_size` images: a seeded permutation-free draw of (class, index)."""
    ids = torch.arange(step * plan.batch, (step + 1) * plan.batch, device=device)
    image_id = (_hash(ids * 3 + 17) * set_size).long().clamp(max=set_size - 1)
    labels, index = image_id % plan.classes, image_id // plan.classes
    return draw(protos, labels, index, plan.image_size), labels


def held_out(protos: dict, classes: int, count: int, size: int, device: torch.device, offset: int = 1 << 28):
    """`count` images never in any training set (indices from `offset`), classes in turn."""
    labels = torch.arange(count, device=device) % classes
    return draw(protos, labels, torch.arange(count, device=device) // classes + offset, size), labels


# --- models, training, scoring -----------------------------------------------------------------------------------
def config_of(plan: Plan, family: str, size: str) -> Any:
    name, args = TINY[family] if plan.tiny else MODELS[(family, size)]
    config = model_config(name, num_classes=plan.classes, image_size=plan.image_size, **args)
    return config.replace(representation_size=config.width) if isinstance(config, ViTConfig) else config


def train_macs(plan: Plan, family: str, size: str) -> int:
    return count_macs(config_of(plan, family, size)).training


def new_model(plan: Plan, family: str, size: str, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(config_of(plan, family, size)).to(device)


def calibrate(plan: Plan, protos: dict, device: torch.device, dtype: torch.dtype) -> dict[tuple, float]:
    """Seconds per training step of each model, timed after one warm-up step."""
    per_step, timed = {}, {}
    for key in MODELS:
        config = repr(config_of(plan, *key))
        if config in timed:  # a dry run's tiny models: one per family
            per_step[key] = timed[config]
            continue
        model = new_model(plan, *key, device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        for step in range(plan.calibration_steps + 1):
            if step == 1:
                _sync(device)
                started = time.perf_counter()
            _step(model, opt, *batch_of(protos, plan, 0, step, plan.set_sizes[-1], device), dtype)
        _sync(device)
        per_step[key] = timed[config] = (time.perf_counter() - started) / plan.calibration_steps
    return per_step


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          dtype: torch.dtype) -> None:
    with torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def top1(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype) -> float:
    model.eval()
    with torch.autocast(images.device.type, dtype=dtype, enabled=dtype != torch.float32):
        hits = sum((model(x).argmax(-1) == y).sum().item()
                   for x, y in zip(images.split(1024), labels.split(1024), strict=True))
    model.train()
    return 100 * hits / len(labels)


def run_one(plan: Plan, family: str, size: str, set_size: int, steps: int, data: dict, device: torch.device,
            dtype: torch.dtype, limit_s: float | None = None) -> dict[str, Any]:
    """Train one model `steps` steps (Adam, linear warm-up then cosine, weight decay 0.05 as AdamW) and score it:
    upstream top-1 on held-out images at 5/6 of the steps and at the end ((a′): its gain), few-shot transfer.
    `limit_s`: training stops after this many seconds (the calibration was wrong by more than its margin), so
    that the whole run keeps to its budget; the row says so (`stopped_at`), and its compute is no longer matched."""
    model = new_model(plan, family, size, device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR[family], weight_decay=0.05)
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, max(0, s - warm) / max(1, steps - warm)))))
    started, checkpoint, stopped = time.perf_counter(), None, None
    for step in range(steps):
        _step(model, opt, *batch_of(data["up"], plan, 0, step, set_size, device), dtype)
        sched.step()
        if limit_s is not None and step % 10 == 0 and time.perf_counter() - started > limit_s:
            _sync(device)
            if time.perf_counter() - started > limit_s:
                stopped = step + 1
                break
        if step + 1 == steps * 5 // 6:
            checkpoint = top1(model, *data["val"], dtype)
    _sync(device)
    seconds = time.perf_counter() - started
    final = top1(model, *data["val"], dtype)
    done = stopped or steps
    out = {"family": family, "size": size, "set_size": set_size, "steps": done, "stopped_at": stopped,
           "images_seen": done * plan.batch,
           "train_seconds": round(seconds, 2), "upstream": round(final, 2),
           "plateau_gain": round(final - checkpoint, 2) if checkpoint is not None else None}
    model.eval()
    for representation in ("pre_logits", "encoder"):
        batches = {part: [(x, y.cpu()) for x, y in zip(*(t.split(1024) for t in data[part]), strict=True)]
                   for part in ("fs_train", "fs_test")}
        feats = {part: representations(model, batches[part], representation) for part in batches}
        result = fewshot_on_features(feats["fs_train"], feats["fs_test"], shots=plan.shots, seeds=3)
        for shot in plan.shots:
            out[f"{shot}-shot {representation}"] = round(100 * result.table[str(shot)]["mean"], 2)
    return out


# --- the plan, the analysis, results.json ----------------------------------------------------------------------
def runs_of(plan: Plan) -> list[tuple[str, str, int]]:
    """(family, size, set size): data-scaling at size M over the set sizes, compute over sizes on the largest set."""
    largest = plan.set_sizes[-1]
    runs = [(f, "M", n) for n in plan.set_sizes for f in FAMILIES]
    return runs + [(f, s, largest) for s in ("S", "L") for f in FAMILIES]


def budget(plan: Plan, per_step: dict[tuple, float], runs: list[tuple[str, str, int]]) -> float:
    """The training multiply-adds B every run gets: the largest for which all runs, at their measured seconds per
    step, fit the training share of the budget (run r takes B / (macs_r × batch) × seconds_r)."""
    seconds_per_mac = sum(per_step[(f, s)] / (train_macs(plan, f, s) * plan.batch) for f, s, _ in runs)
    return plan.budget_s * plan.train_share / seconds_per_mac


def steps_for(plan: Plan, macs: float, family: str, size: str) -> int:
    """The steps that spend `macs` training multiply-adds on this model (matched compute); a dry run's are capped."""
    steps = max(6, round(macs / (train_macs(plan, family, size) * plan.batch)))
    return min(steps, plan.max_steps) if plan.max_steps else steps


def judge(rows: list[dict[str, Any]], plan: Plan, metric: str) -> dict[str, Verdict]:
    """The two verdicts by the CPU designs' rules on `metric` (one seed: the spread (d) is not measured)."""
    at = {(r["family"], r["size"], r["set_size"]): r for r in rows}
    largest, xs = plan.set_sizes[-1], [math.log2(n) for n in plan.set_sizes]
    learnt = [Check("a", f"{f}-{s}", f"{at[(f, s, largest)]['upstream']:.1f} % upstream top-1 (threshold "
                    f"{LEARNS_TOP1:g} %)", at[(f, s, largest)]["upstream"] >= LEARNS_TOP1)
              for f in FAMILIES for s in ("S", "M", "L")]
    spread = Check("d", "one seed", "spread over seeds not measured", None)
    lr = Check("c", "fixed learning rates", f"ViT {LR['ViT']:g}, BiT {LR['BiT']:g}: no grid", None)
    gaps = [at[("ViT", "M", n)][metric] - at[("BiT", "M", n)][metric] for n in plan.set_sizes]
    trend = slope(xs, gaps)
    data = Verdict(gaps[0] < 0 and trend > 0, f"ViT − BiT {metric}: {gaps[0]:+.1f} points at {plan.set_sizes[0]:,} "
                   f"images, {gaps[-1]:+.1f} at {largest:,} (slope {trend:+.2f} per doubling)",
                   [*learnt, lr, spread])
    matched = [at[("ViT", s, largest)][metric] - at[("BiT", s, largest)][metric] for s in ("S", "M", "L")]
    mean = sum(matched) / len(matched)
    compute = Verdict(mean >= 0, f"ViT − BiT {metric} at matched compute: " + ", ".join(
        f"{s} {d:+.1f}" for s, d in zip(("S", "M", "L"), matched, strict=True)) + " points", [*learnt, lr, spread])
    return {"data-scaling": data, "compute": compute}


def results_of(plan: Plan, rows: list[dict[str, Any]], macs: float, seconds: float, device: str,
               precision: str = "bf16") -> dict[str, Any]:
    metric = f"{plan.shots[0]}-shot pre_logits"
    verdicts = judge(rows, plan, metric)
    columns = ["family", "size", "set size", "steps", "images seen", "upstream top-1 (%)", "gain, last 1/6 (points)",
               *(f"{k}-shot {r} (%)" for r in ("pre_logits", "encoder") for k in plan.shots), "train s"]
    table = [[r["family"], r["size"], f"{r['set_size']:,}", f"{r['steps']:,}", f"{r['images_seen']:,}",
              f"{r['upstream']:.1f}", "—" if r["plateau_gain"] is None else f"{r['plateau_gain']:+.1f}",
              *(f"{r[f'{k}-shot {rep}']:.1f}" for rep in ("pre_logits", "encoder") for k in plan.shots),
              f"{r['train_seconds']:.0f}"] for r in rows]
    cut = [f"{r['family']}-{r['size']} ({r['set_size']:,}) at step {r['stopped_at']:,}" for r in rows
           if r["stopped_at"]]
    late = [f"{r['family']}-{r['size']} ({r['set_size']:,})" for r in rows
            if r["plateau_gain"] is not None and r["plateau_gain"] >= PLATEAU_POINTS]
    main = verdicts["compute"]
    return {
        "experiment": NAME, "title": "The scale questions on a GPU", "paper": "Sections 4.2, 4.4",
        "finding": ("Does the ViT − BiT transfer gap close with more pre-training images, and is the ViT ahead at "
                    "matched pre-training compute, once far more images are seen than a CPU allows?"),
        "setup": (f"ViT/4 and BiT ResNetV2 at sizes S, M, L matched in multiply-adds, {plan.classes} synthetic "
                  f"classes drawn on the GPU, batch {plan.batch}, every run {macs:.3g} training multiply-adds "
                  f"(steps scaled to matched compute), {device}, {precision}; transfer: {plan.transfer_classes} other "
                  f"classes, few-shot ridge at {' and '.join(map(str, plan.shots))} shots. One seed."),
        "mode": plan.mode, "seeds": [0], "scale": {"budget_macs": macs, "batch": plan.batch,
                                                   "set_sizes": list(plan.set_sizes)},
        "design": {"version": 1, "question": "As the CPU designs of data-scaling and compute, at GPU scale.",
                   "primary": f"{metric} on the transfer classes (the paper plots transfer)",
                   "rule": ("data-scaling: holds if ViT − BiT is negative at the smallest set and its slope against "
                            "log2(images) positive; compute: holds if the mean ViT − BiT over sizes at matched "
                            "compute is >= 0"),
                   "preconditions": {"a": f"upstream top-1 >= {LEARNS_TOP1:g} %",
                                     "c": "not measured (fixed learning rates)", "d": "not measured (one seed)"},
                   "changes": []},
        "command": "python benchmarks/gpu_scale_experiment.py --out OUT",
        "tables": [{"title": "Every run (one seed)", "columns": columns, "rows": table}], "figures": [],
        "measured": [verdicts["data-scaling"].result, main.result],
        "verdict": main.to_dict(),
        "check": {"holds": main.finding_holds, "rule": "compute's rule, at matched compute",
                  "details": [f"data-scaling: {verdicts['data-scaling'].result}: {verdicts['data-scaling'].state}"]},
        "audit": {"label": "one seed, untuned learning rates: a first look, not a test" + (
                      f"; still climbing: {', '.join(late)}" if late else ""),
                  "measured": main.result, "plateau": [], "paired": [],
                  "notes": [f"data-scaling: {verdicts['data-scaling'].state}"] + ([
                      f"stopped before its matched compute to keep the time budget: {', '.join(cut)}"] if cut else [])},
        "wall_seconds": round(seconds, 1), "run_seconds": round(sum(r["train_seconds"] for r in rows), 1),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "versions": {"vitlab": __version__, "torch": torch.__version__, "python": platform.python_version()},
    }


def run(plan: Plan, out: Path) -> dict[str, Any]:
    """Every run of the plan, then OUT/gpu-scale/results.json. A dry run uses one CPU thread: its tensors are tiny,
    and on a shared machine the threads of many small ops wait on each other (2.1 s with one thread, 39 s with
    two, on the loaded 2-core machine)."""
    threads = torch.get_num_threads()
    if plan.mode != "gpu":
        torch.set_num_threads(1)
    try:
        return _run(plan, out)
    finally:
        torch.set_num_threads(threads)


def _run(plan: Plan, out: Path) -> dict[str, Any]:
    started = time.perf_counter()
    cuda = torch.cuda.is_available() and plan.mode == "gpu"
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.benchmark = True  # fixed shapes: the calibration's warm-up step chooses the kernels
    data = {"up": prototypes(plan.classes, 1, device)}
    data["val"] = held_out(data["up"], plan.classes, plan.val_images, plan.image_size, device)
    transfer = prototypes(plan.transfer_classes, 2, device)
    shots = max(plan.shots)
    data["fs_train"] = held_out(transfer, plan.transfer_classes, plan.transfer_classes * shots * 2, plan.image_size,
                                device, offset=0)
    data["fs_test"] = held_out(transfer, plan.transfer_classes, plan.transfer_test, plan.image_size, device)
    runs = runs_of(plan)
    per_step = calibrate(plan, data["up"], device, dtype)
    macs = budget(plan, per_step, runs)
    rows = []
    for family, size, set_size in runs:
        steps = steps_for(plan, macs, family, size)
        limit = 1.5 * steps * per_step[(family, size)] + 5  # the calibration's margin, then the budget wins
        rows.append(run_one(plan, family, size, set_size, steps, data, device, dtype, limit))
        print(f"{family}-{size} on {set_size:,} images: {rows[-1]}", flush=True)
    name = torch.cuda.get_device_name() if cuda else "CPU (dry run)"
    results = results_of(plan, rows, macs, time.perf_counter() - started, name, str(dtype).removeprefix("torch."))
    folder = out / NAME
    folder.mkdir(parents=True, exist_ok=True)
    write_results(folder / "results.json", results)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where gpu-scale/results.json goes (reproduction/ to report)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU in seconds (the tests')")
    parser.add_argument("--budget-s", type=float, default=None, help="seconds for the whole run (default 420)")
    args = parser.parse_args(argv)
    plan = DRY if args.dry_run else Plan("gpu")
    if args.budget_s is not None:
        plan = replace(plan, budget_s=args.budget_s)
    if plan.mode == "gpu" and not torch.cuda.is_available():
        print("gpu_scale_experiment: no CUDA device; use --dry-run to check the script on a CPU", file=sys.stderr)
        return 2
    results = run(plan, Path(args.out))
    print(f"wrote {Path(args.out) / NAME / 'results.json'}: {results['measured'][0]}; {results['measured'][1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
