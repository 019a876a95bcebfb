"""Whether an inference run compiles its model (`--compile` / `--no-compile`, `compile=` of the inference functions),
resolved once per run by a measured rule, as the precision and the attention form are.

The rule for `auto`: compile (frozen, `compile_for_inference`) when the run will process at least as many images as
a region of `COMPILE_PAYS_OFF` names for the session's precision and the model's width, on a CPU; stay eager
everywhere else. Compiling costs seconds up front (about 10 for a ViT-B/16, twice that with a cold cache) and
saves a few per cent a batch, so it repays itself only after a thousand images or more; a run whose image count is
not known up front (a model returned by `vitlab.load`) or lies outside every measured region stays eager. The
measurements behind it: BENCHMARKS.md "Frozen compiled inference", `benchmarks/compile_inference.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vitlab.constants import COMPILE_PAYS_OFF

COMPILE_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class CompileChoice:
    """The resolved choice (compile or not; never auto) and why, as the output and records show it."""

    on: bool
    reason: str

    @property
    def name(self) -> str:
        return "on" if self.on else "off"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


def compile_request(requested: bool | str) -> str:
    """`requested` as one of auto, on, off (True / False are on / off); ValueError (one line) otherwise."""
    if requested is True or requested is False:
        return "on" if requested else "off"
    if requested not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_CHOICES)} (or True / False), not {requested!r}")
    return str(requested)


def resolve_compile(requested: bool | str, *, images: int | None, device: torch.device | str, precision: str,
                    width: int | None) -> CompileChoice:
    """`requested` (auto, on, off; True / False) as whether to compile, with the reason: `images` the number the run
    will process (None: not known up front), `device` the session's, `precision` what the session computes in
    (fp32, bf16, int8), `width` the model's (`config_width`; None: a model without a vitlab config)."""
    asked = compile_request(requested)
    if asked != "auto":
        return CompileChoice(asked == "on", "requested")
    if images is None:
        return CompileChoice(False, "auto: the number of images is not known up front")
    kind = torch.device(device).type
    if kind != "cpu":
        return CompileChoice(False, f"auto: compiling is unmeasured on {kind}")
    counted = f"{images:,} image{'s' if images != 1 else ''}"
    regions = [r for r in COMPILE_PAYS_OFF if r["precision"] == precision and width is not None
               and width >= int(r["width"])]
    if not regions:
        return CompileChoice(False, f"auto: compiling is unmeasured (or does not pay) for a {precision} model of "
                                    f"width {width}")
    least = min(int(r["images"]) for r in regions)
    if images >= least:
        return CompileChoice(True, f"auto: {counted} >= {least:,}, after which frozen compiling repays its seconds "
                                   f"({precision}, width >= {min(int(r['width']) for r in regions)})")
    return CompileChoice(False, f"auto: {counted} < {least:,}, the least after which frozen compiling repays its "
                                "seconds")
