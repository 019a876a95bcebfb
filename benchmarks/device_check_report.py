"""device_check.md: the JSON's figures as the tables BENCHMARKS.md records."""

from __future__ import annotations

from typing import Any


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return {True: "yes", False: "**no**", None: "-"}[v]
    if isinstance(v, float) and v == 0:
        return "0"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)


def _checks(checks: list[dict[str, Any]]) -> list[str]:
    lines = ["| check | value | bound | passed |", "|---|---|---|---|"]
    lines += [f"| {c['name']} | {_fmt(c['value'])} | {_fmt(c.get('bound'))} | {_fmt(c['passed'])} |"
              for c in checks]
    return lines


def _speed(r: dict[str, Any]) -> list[str]:
    lines = [f"{r['model']} at {r['image_size']} px, batch {r['batch']}, {r['precision']}; peak "
             f"{_fmt(r['peak_tflops'])} TFLOP/s ({r['peak_source']}); GEMM rate measured in the run (bf16 on CUDA, "
             f"fp32 on CPU) {_fmt(r['measured_gemm_tflops'])} TFLOP/s. Model FLOPs per training image "
             f"{_fmt(r['flops_per_train_image'] / 1e9)} G (3 x forward).", "",
             "| impl | mode | compiled | img/s (median) | TFLOP/s | MFU % | % of measured GEMM |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {x['impl']} | {x['mode']} | {_fmt(x['compiled'])} | {x['images_per_s']:.1f} | {_fmt(x['tflops'])} "
              f"| {x['mfu_pct']:.1f} | {x['pct_measured_gemm']:.1f} |" for x in r["rows"]]
    for kind, ratios in r["ratios_vitlab_over_timm"].items():
        for mode, q in ratios.items():
            lines.append(f"\nvitlab/timm {mode} {kind}: median of paired repeats {q['median']:.3f} "
                         f"(per repeat {', '.join(f'{v:.3f}' for v in q['per_repeat'])})")
    if r["targets"]:
        lines += ["", "| target (issue 23) | value | met |", "|---|---|---|"]
        lines += [f"| {t['name']} | {_fmt(t['value'])} | {_fmt(t['met'])} |" for t in r["targets"]]
    return lines


def _loader(r: dict[str, Any]) -> list[str]:
    lines = [f"{r['images']} JPEGs {r['size']} -> {r['crop']} crops, batch {r['batch']} (generated in "
             f"{r['generate_seconds']} s)", "", "| resize | workers | img/s | per worker | first batch s |",
             "|---|---|---|---|---|"]
    lines += [f"| {x['resize']} | {x['workers']} | {x['images_per_s']:.0f} | {x['per_worker']:.0f} | "
              f"{x['first_batch_s']:.2f} |" for x in r["rows"]]
    lines += ["", f"tensor/pil img/s: {r['tensor_over_pil']:.2f}. Bottleneck: {r['bottleneck']}."]
    return lines


def markdown(data: dict[str, Any]) -> str:
    env = data["environment"]
    where = env.get("gpu") or f"CPU ({env['cpus_available']} cores available)"
    out = [f"## device_check ({data['plan']['name']}): {where}, {env['date'][:10]}", "",
           f"torch {env['torch']}, timm {env.get('timm')}, Python {env['python']}, {env['cpus_available']} CPUs, "
           f"commit {env.get('commit')}; total {data.get('total_seconds', 0)} s of a {data['plan']['budget_s']:.0f} s "
           "budget.", ""]
    renderers = {"speed": _speed, "loader": _loader}
    for name, r in data["sections"].items():
        out.append(f"### {name} ({r['status']}, {r.get('seconds', 0)} s)\n")
        if r["status"] == "error":
            out += [f"error: `{r['error']}`", ""]
            continue
        if r["status"] == "skipped":
            out += [r["reason"], ""]
            continue
        if r.get("checks"):
            out += _checks(r["checks"])
        if name in renderers:
            out += renderers[name](r)
        out += [f"\nskipped: {s}" for s in r.get("skipped", [])] + [""]
    return "\n".join(out) + "\n"
