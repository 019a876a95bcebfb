"""device_check section "loader": vitlab's training loader with all cores on generated 500x375 JPEGs (an image
folder, photograph-like, quality 90: benchmarks/make_jpegs.py), both training resizes (PIL and torch's uint8
kernel), against the images/s the device's training step consumes (section "speed"), so that the bottleneck is
named.

Workers: training's default for the device (every core but one on CUDA: vitlab.train.trainer.default_workers),
the batch pinned on CUDA as in training. Images/s: the images after the first batch over the time after it
(the first batch pays for the workers' start). The JPEGs are written to a temporary folder and removed.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _dist(device: torch.device) -> Any:
    from vitlab.train.distributed import Dist

    return Dist(rank=0, world=1, local_rank=0, local_world=1, device=device, owns_group=False)


def time_loader(root: Path, resize: str, plan: Any, device: torch.device) -> dict[str, Any]:
    from vitlab.data import build_datasets
    from vitlab.train import TrainConfig
    from vitlab.train.trainer import make_loaders

    threads = torch.get_num_threads()  # make_loaders sets the CPU compute threads; this process's are restored
    data = build_datasets(str(root))
    cfg = TrainConfig(data=str(root), image_size=224, batch_size=plan.loader_batch, steps=plan.loader_steps + 1,
                      train_resize=resize, seed=0)
    gc.collect()
    t0 = time.perf_counter()
    loader, _, workers = make_loaders(cfg, data, 0, _dist(device))
    batches, stamps, sizes = iter(loader), [], []
    try:
        for _ in range(plan.loader_steps + 1):
            sizes.append(len(next(batches)["images"]))
            stamps.append(time.perf_counter())
    finally:
        del batches, loader
        gc.collect()  # its workers go before the next measurement starts its own
        torch.set_num_threads(threads)
    rate = sum(sizes[1:]) / (stamps[-1] - stamps[0])
    return {"resize": resize, "workers": workers, "images_per_s": rate, "per_worker": rate / max(workers, 1),
            "first_batch_s": stamps[0] - t0, "images_timed": sum(sizes[1:])}


def bottleneck(best: dict[str, Any], consumed: tuple[float, str] | None) -> str:
    if consumed is None:
        return "unknown: the speed section measured no training images/s"
    gpu, what = consumed
    if best["images_per_s"] >= gpu:
        return (f"the model: the loader makes {best['images_per_s']:.0f} img/s ({best['resize']} resize, "
                f"{best['workers']} worker(s)), {what} consumes {gpu:.0f}")
    return (f"the loader: {best['workers']} worker(s) make {best['images_per_s']:.0f} img/s ({best['resize']} resize), "
            f"{what} consumes {gpu:.0f}: {gpu / best['images_per_s']:.1f}x as many cores (or GPU decoding) "
            f"would keep it fed")


def run(plan: Any, device: torch.device, consumed: tuple[float, str] | None) -> dict[str, Any]:
    import make_jpegs

    root = Path(tempfile.mkdtemp(prefix="vitlab-device-jpegs-"))
    try:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        t0 = time.perf_counter()
        make_jpegs.generate(root, plan.loader_images, (500, 375), classes=10, jobs=max(1, cpus), show=False)
        generated_s = time.perf_counter() - t0
        rows = [time_loader(root, resize, plan, device) for resize in ("pil", "tensor")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    best = max(rows, key=lambda r: r["images_per_s"])
    return {"images": plan.loader_images, "size": "500x375", "crop": 224, "batch": plan.loader_batch,
            "generate_seconds": round(generated_s, 1), "rows": rows,
            "tensor_over_pil": rows[1]["images_per_s"] / rows[0]["images_per_s"],
            "gpu_consumes": None if consumed is None else {"images_per_s": consumed[0], "what": consumed[1]},
            "bottleneck": bottleneck(best, consumed)}
