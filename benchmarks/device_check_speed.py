"""device_check section "speed": training and inference images/s of vitlab against timm in the same process,
same batch, repeats interleaved (vitlab.bench's protocol: `run_benchmark` with --compare timm), eager and then
compiled (both libraries compiled alike: inference with frozen weights, as `--compile` on the inference verbs,
training in the plain form, as `vitlab train --compile`). On CUDA both run under bf16 autocast with fused AdamW,
the step `vitlab train` takes. The eager run also times vitlab's batch-1 latency (p50, p90) of the fp32 and bf16
forms (`vitlab bench --mode infer`'s latency rows).

MFU = model FLOPs per second / the device's dense bf16 peak. Model FLOPs per training image = 3 x the forward
pass's (forward + the two products of the backward), 2 FLOPs per multiply-add, the multiply-adds of the full
model as the paper counts them (`vitlab.models.flops.count_macs`; timm computes all of them, vitlab's class-token-only
last block 6% fewer: counting what each executes would flatter vitlab). The peak is the datasheet's (PEAKS);
beside it the share of the bf16 GEMM rate measured in the same run. On CPU there is no datasheet figure: the
measured fp32 GEMM rate stands in, and the MFU column says so.
"""

from __future__ import annotations

from typing import Any

import torch

# Dense bf16 tensor-core peaks (no 2:4 sparsity), TFLOP/s, by the name torch reports.
PEAKS = {
    "H200": (989.0, "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity, 989 dense"),
    "H100 80GB HBM3": (989.0, "NVIDIA H100 datasheet (SXM5): BF16 1,979 TFLOPS with sparsity, 989 dense"),
    "A100": (312.0, "NVIDIA A100 datasheet: BF16 312 TFLOPS dense (624 with sparsity)"),
}
TARGET_MFU_COMPILED = 50.0  # % of the dense peak, issue 23


def datasheet_peak(device: torch.device) -> tuple[float | None, str]:
    if device.type != "cuda":
        return None, "no datasheet peak on CPU: the measured fp32 GEMM rate stands in"
    name = torch.cuda.get_device_name(device)
    for key, (tflops, source) in PEAKS.items():
        if key in name:
            return tflops * 1e12, source
    return None, f"no datasheet peak known for {name!r}: the measured bf16 GEMM rate stands in"


def model_flops_per_image(model: str, image_size: int, mode: str) -> float:
    from vitlab.models import count_macs

    macs = count_macs(model, image_size).total
    return 2.0 * macs * (3 if mode == "train" else 1)


def _bench(plan: Any, device: torch.device, compiled: bool) -> Any:
    from vitlab.bench import BenchSettings, run_benchmark

    settings = BenchSettings(model=plan.speed_model, batch_size=plan.speed_batch, image_size=plan.speed_image,
                             repeats=plan.speed_repeats, warmup=plan.speed_warmup, min_time=plan.speed_min_time,
                             modes=("infer",) if plan.precision == "int8" else ("train", "infer"), compare="timm",
                             compile=compiled, device=str(device), gemm_size=plan.gemm_size, threads=plan.threads,
                             precision=plan.precision, latency=not compiled)
    return run_benchmark(settings)


def _rows(result: Any, plan: Any, compiled: bool, peak: float) -> list[dict[str, Any]]:
    rows = []
    for m in result.measurements:
        flops = model_flops_per_image(plan.speed_model, plan.speed_image, m.mode)
        rows.append({"impl": m.impl, "model": m.model, "mode": m.mode, "compiled": compiled,
                     "images_per_s": m.median, "per_repeat": m.images_per_s,
                     "tflops": flops * m.median / 1e12, "mfu_pct": 100 * flops * m.median / peak,
                     "pct_measured_gemm": 100 * flops * m.median / (result.gemm_peak_gflops * 1e9)})
    return rows


def _get(rows: list[dict[str, Any]], impl: str, mode: str, compiled: bool) -> dict[str, Any] | None:
    return next((r for r in rows if (r["impl"], r["mode"], r["compiled"]) == (impl, mode, compiled)), None)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 23's targets, where the rows they need were measured (reported, not enforced)."""
    out = []
    vc, te = _get(rows, "vitlab", "train", True), _get(rows, "timm", "train", False)
    if vc:
        out.append({"name": f"vitlab train MFU compiled >= {TARGET_MFU_COMPILED:g} %", "value": vc["mfu_pct"],
                    "met": vc["mfu_pct"] >= TARGET_MFU_COMPILED})
    ve = _get(rows, "vitlab", "train", False)
    if ve and te:
        out.append({"name": "vitlab train eager >= timm train eager (img/s ratio)",
                    "value": ve["images_per_s"] / te["images_per_s"], "met": ve["images_per_s"] >= te["images_per_s"]})
    tc = _get(rows, "timm", "infer", True)
    for compiled in (False, True):
        v = _get(rows, "vitlab", "infer", compiled)
        if v and tc:
            ratio = v["images_per_s"] / tc["images_per_s"]
            out.append({"name": f"vitlab infer {'compiled' if compiled else 'eager'} >= timm infer compiled",
                        "value": ratio, "met": ratio >= 1})
    return out


def run(plan: Any, device: torch.device, report: Any) -> dict[str, Any]:
    peak, source = datasheet_peak(device)
    eager = _bench(plan, device, compiled=False)
    gemm = eager.gemm_peak_gflops * 1e9
    peak = peak or gemm
    rows = _rows(eager, plan, False, peak)
    ratios = {"eager": eager.ratios()}
    skipped = []
    left = plan.budget_s - report.elapsed()
    need = plan.estimates.get("speed_compiled", 0) + plan.estimates.get("loader", 0)  # the loader section follows
    if not plan.compile:
        skipped.append("torch.compile: not in the dry run (Inductor compiles for minutes on 2 cores)")
    elif need > left:
        skipped.append(f"torch.compile: needs up to {need:.0f} s with the loader section, {left:.0f} s of the "
                       "budget left")
    else:
        compiled = _bench(plan, device, compiled=True)
        rows += _rows(compiled, plan, True, peak)
        ratios["compiled"] = compiled.ratios()
    return {"model": plan.speed_model, "image_size": plan.speed_image, "batch": plan.speed_batch,
            "precision": f"{eager.precision['name']} ({eager.precision['forms']}), fused AdamW",
            "compiled_forms": "inference: torch.compile with Inductor freezing (weights as constants); training: "
                              "plain torch.compile",
            "latency_batch_1": [{k: v for k, v in lat.items() if k != "ms"} for lat in eager.to_dict()["latency"]],
            "precision_reason": eager.precision["reason"], "gemm_peaks": eager.gemm_peaks,
            "peak_tflops": peak / 1e12, "peak_source": source, "measured_gemm_tflops": gemm / 1e12,
            "flops_per_train_image": model_flops_per_image(plan.speed_model, plan.speed_image, "train"),
            "rows": rows, "ratios_vitlab_over_timm": ratios, "targets": targets(rows), "skipped": skipped}


def training_images_per_s(section: dict[str, Any]) -> tuple[float, str] | None:
    """What the device's training step consumes: vitlab's compiled img/s if measured, else eager."""
    rows = section.get("rows", [])
    for compiled in (True, False):
        r = _get(rows, "vitlab", "train", compiled)
        if r:
            return r["images_per_s"], f"vitlab {section['model']} training, {'compiled' if compiled else 'eager'}"
    return None
