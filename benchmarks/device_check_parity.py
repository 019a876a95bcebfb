"""device_check section "parity": the same weights and input on the device and on the CPU.

Error measure: max |a - b| / max |b| over the whole output, b the reference, so the bound reads as a share of
the output's scale (logits, or attention weights). Rows per model:
- fp32 CPU against fp64 CPU: what float32 itself costs on this model, the floor the device comparison can
  reach (reported, no bound);
- fp32 on CUDA with TF32 off (matmul and cuDNN) against fp32 CPU: at most FP32_BOUND;
- bf16 autocast on the device against fp32 CPU (on CPU: CPU bf16 autocast): at most BF16_BOUND for the ViTs.
  bf16 keeps 8 significant bits (a relative rounding step of 2^-8 = 4e-3), and errors of that size accumulate
  over the blocks: measured 0.9-1.5 % at depth 1, so 5 % leaves room for depth 12. A random-initialised BiT is
  ill-conditioned: its final GroupNorm cancels a large common offset of the residual stream, so float32 alone
  is already 1.5e-5 from float64 (15x a ViT's) and timm's resnetv2_50x1_bit in bf16 is 19 % from its own fp32
  on the same weights and input. BiT's bf16 bound is therefore relative to that independent implementation:
  at most BIT_BF16_VS_TIMM x timm's bf16 error, measured in the same run;
- ViTs: the attention weights of every layer (`forward_inspect`, or the dict-returning
  `forward_intermediates` it was called before), the same three rows.
- `vitlab train`'s AdamW step on the device: the fused kernel against the per-tensor (foreach) one, 20 steps on the
  same gradients, at most FUSED_BOUND apart;
- compiled inference as the inference verbs compile it (Inductor with frozen weights, `--compile`) against eager on
  the device, float32 (TF32 off) at most FP32_BOUND and bf16 at most BF16_BOUND (full plan only: Inductor
  compiles for minutes on a small CPU).
The head is re-drawn at random (std 0.02): a zero-initialised head would make every logit 0 and the
comparison empty.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

FP32_BOUND = 1e-5
BF16_BOUND = 5e-2
BIT_BF16_VS_TIMM = 2.0
FUSED_BOUND = 1e-6
FROZEN_MODEL = ("ViT-B/16", {"depth": 2}, 224)  # B/16's layers at 224 px; two blocks keep the compile short


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def check(name: str, value: float, bound: float | None) -> dict[str, Any]:
    return {"name": name, "value": value, "bound": bound, "passed": None if bound is None else bool(value <= bound)}


def _inspect(model: nn.Module):
    """The method that returns per-layer attention as a dict (it was renamed while this was written)."""
    for name in ("forward_inspect", "forward_intermediates"):
        fn = getattr(model, name, None)
        if fn is not None:
            return fn
    return None


def _attention(model: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    fn = _inspect(model)
    if fn is None:
        return None
    out = fn(x)
    if not isinstance(out, dict) or "attention" not in out:
        return None
    return torch.stack([a.float() for a in out["attention"]])  # (L, N, heads, T, T)


def _outputs(model: nn.Module, x: torch.Tensor, attention: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    with torch.no_grad():
        logits = model(x).float()
        attn = _attention(model, x) if attention else None
    return logits.cpu(), None if attn is None else attn.cpu()


def _build(name: str, overrides: dict[str, int], size: int) -> nn.Module:
    from vitlab import create_model

    torch.manual_seed(0)
    model = create_model(name, num_classes=10, image_size=size, **overrides).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.startswith("head"):
                nn.init.normal_(p, std=0.02)
    return model


def _rows(prefix: str, ref: torch.Tensor, ref64: torch.Tensor, dev32: torch.Tensor | None,
          bf16: torch.Tensor, device: torch.device, bf16_bound: float | None = BF16_BOUND) -> list[dict[str, Any]]:
    rows = [check(f"{prefix} fp32 cpu vs fp64 cpu", rel_error(ref, ref64), None)]
    if dev32 is not None:
        rows.append(check(f"{prefix} fp32 {device.type} (TF32 off) vs fp32 cpu", rel_error(dev32, ref), FP32_BOUND))
    rows.append(check(f"{prefix} bf16 autocast {device.type} vs fp32 cpu", rel_error(bf16, ref), bf16_bound))
    return rows


def timm_bit_bf16_error(model: nn.Module, x: torch.Tensor, device: torch.device) -> float | None:
    """timm's ResNetV2 with `model`'s weights: its bf16 autocast error against its own fp32 CPU output."""
    try:
        from vitlab.bench import timm_equivalent
        from vitlab.weights import to_timm_bit_state_dict

        _, theirs = timm_equivalent(model.config.name, model.config.num_classes)
    except (ImportError, ValueError):
        return None
    theirs.load_state_dict(to_timm_bit_state_dict(model))
    theirs.eval()
    ref, _ = _outputs(theirs, x, False)
    theirs.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        bf16, _ = _outputs(theirs, x.to(device), False)
    return rel_error(bf16, ref)


def model_parity(name: str, overrides: dict[str, int], size: int, batch: int,
                 device: torch.device) -> list[dict[str, Any]]:
    model = _build(name, overrides, size)
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))
    from vitlab.models import ViTConfig

    attention = isinstance(model.config, ViTConfig) and _inspect(model) is not None  # BiT has no attention
    ref, ref_attn = _outputs(model, x, attention)
    ref64, ref64_attn = _outputs(copy.deepcopy(model).double(), x.double(), attention)
    dev32 = dev32_attn = None
    if device.type == "cuda":
        model = model.to(device)
        dev32, dev32_attn = _outputs(model, x.to(device), attention)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        bf16, bf16_attn = _outputs(model, x.to(device), attention)
    bound = BF16_BOUND
    if not isinstance(model.config, ViTConfig):
        timm_error = timm_bit_bf16_error(model.cpu(), x, device)
        bound = None if timm_error is None else BIT_BF16_VS_TIMM * timm_error
    rows = _rows(f"{name} logits", ref, ref64, dev32, bf16, device, bound)
    if bound is not BF16_BOUND:
        rows[-1]["note"] = f"bound: {BIT_BF16_VS_TIMM:g} x timm's bf16 error on the same weights and input"
    if ref_attn is not None:
        rows += _rows(f"{name} attention", ref_attn, ref64_attn, dev32_attn, bf16_attn, device)
    return rows


def fused_adamw_parity(device: torch.device, steps: int = 20) -> dict[str, Any]:
    """`vitlab train`'s optimizer (fused where torch has it) against foreach AdamW, both fed the same gradients."""
    from vitlab.train import TrainConfig
    from vitlab.train.optim import build_optimizer, param_groups

    model = _build("ViT-B/16", {"depth": 1, "width": 64, "num_heads": 2, "mlp_dim": 128}, 32).to(device).train()
    twin = copy.deepcopy(model)
    cfg = TrainConfig(lr=3e-3, weight_decay=0.1)
    fused = build_optimizer(model, cfg)
    foreach = torch.optim.AdamW(param_groups(twin, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8,
                                foreach=True)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        for a, b in zip(model.parameters(), twin.parameters(), strict=True):
            grad = torch.randn(a.shape, generator=g).to(device)
            a.grad, b.grad = grad.clone(), grad.clone()
        fused.step()
        foreach.step()
    ours = torch.cat([p.detach().flatten() for p in model.parameters()])
    theirs = torch.cat([p.detach().flatten() for p in twin.parameters()])
    form = "fused" if fused.param_groups[0].get("fused") else "foreach (no fused kernel here)"
    return check(f"AdamW {form} vs foreach {device.type}, {steps} steps", rel_error(ours, theirs), FUSED_BOUND)


def frozen_compile_parity(device: torch.device, batch: int) -> list[dict[str, Any]]:
    """The inference verbs' compiled form (Inductor freezing) against the same prepared model run eagerly."""
    from vitlab.runtime import open_session

    name, overrides, size = FROZEN_MODEL
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1)).to(device)
    rows = []
    for precision, bound in (("fp32", FP32_BOUND), ("bf16", BF16_BOUND)):
        eager = open_session(_build(name, overrides, size), device=device, precision=precision).model
        compiled = open_session(_build(name, overrides, size), device=device, precision=precision,
                                compile=True).model
        with torch.inference_mode():
            ref, out = eager(x).float().cpu(), compiled(x).float().cpu()
        shape = ", ".join(f"{k} {v}" for k, v in overrides.items())
        rows.append(check(f"{name} ({shape}) {precision} compiled with frozen weights vs eager {device.type}",
                          rel_error(out, ref), bound))
    return rows


def run(plan: Any, device: torch.device) -> dict[str, Any]:
    skipped = []
    if device.type != "cuda":
        skipped.append("fp32 CUDA vs CPU rows: no CUDA device (bf16 autocast runs on the CPU instead)")
    # TF32 would round fp32 matmul and convolution inputs to 10 bits: the fp32 rows compare true fp32 kernels.
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    checks = []
    try:
        for name, overrides, size in plan.parity_models:
            checks += model_parity(name, overrides, size, plan.parity_batch, device)
        checks.append(fused_adamw_parity(device))
        if plan.compile:
            checks += frozen_compile_parity(device, plan.parity_batch)
        else:
            skipped.append("compiled inference with frozen weights: not in the dry run (Inductor compiles for "
                           "minutes on 2 cores)")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    return {"checks": checks, "skipped": skipped, "error_measure": "max|a-b| / max|ref|",
            "bounds": {"fp32": FP32_BOUND, "bf16": BF16_BOUND, "fused_adamw": FUSED_BOUND}}
