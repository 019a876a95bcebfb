"""What `vitlab bench` measures and reports: settings, per-implementation measurements, ratios, table."""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

MODES = ("infer", "train")


def verdict(wins: int, n: int, better: str = "faster", worse: str = "slower") -> str:
    """Who won the paired repeats, in words: a mixed count means the difference is within the noise."""
    if wins == n:
        return f"vitlab {better} in every repeat ({n} of {n})"
    if wins == 0:
        return f"vitlab {worse} in every repeat ({n} of {n})"
    return f"no consistent winner: vitlab {better} in {wins} of {n} repeats, {worse} in {n - wins}"


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0-100): a value that was measured, never an interpolation."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class BenchSettings:
    model: str = "ViT-S/16"
    batch_size: int = 32
    image_size: int = 224
    threads: int | None = None  # None: keep torch's current setting
    repeats: int = 3
    warmup: int = 2  # untimed steps per implementation and mode (compilation happens here)
    min_time: float = 1.0  # seconds each timed repeat lasts at least; sets the steps per repeat
    modes: tuple[str, ...] = MODES
    compare: str | None = None  # "timm"
    compile: bool = False
    device: str = "cpu"
    precision: str = "auto"  # auto, fp32, bf16, int8 (vitlab.runtime.precision); both implementations compute in it
    num_classes: int = 1000
    seed: int = 0
    gemm_size: int | None = None  # side of the peak-measuring matmul (default 4096 on CPU, 8192 on CUDA)
    tune_malloc: bool = True  # serve large tensors from glibc's heap (vitlab.runtime.allocator)
    latency: bool = True  # with inference: batch-1 latency of fp32, bf16, int8 (vitlab.bench.latency)
    onnx: str | None = None  # an exported ONNX file whose batch-1 latency is measured beside them
    attention: str = "auto"  # vitlab's training attention: auto (as vitlab train decides it), flash or matmul


@dataclass
class Measurement:
    impl: str  # "vitlab" or "timm"
    model: str  # the model's name in that library
    mode: str  # "infer" or "train"
    images_per_s: list[float]  # one per timed repeat, in repeat order
    macs_per_image: int  # the full model's multiply-adds (paper convention), forward or fwd+bwd
    executed_macs_per_image: int  # what this implementation actually computes
    peak_gflops: float
    steps_per_repeat: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.images_per_s)

    @property
    def gflops(self) -> float:
        """Model GFLOP/s at the median: 2 FLOPs per multiply-add."""
        return 2 * self.macs_per_image * self.median / 1e9

    @property
    def pct_peak(self) -> float:
        return 100 * self.gflops / self.peak_gflops

    @property
    def executed_gflops(self) -> float:
        return 2 * self.executed_macs_per_image * self.median / 1e9

    @property
    def executed_pct_peak(self) -> float:
        return 100 * self.executed_gflops / self.peak_gflops

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(median=self.median, min=min(self.images_per_s), max=max(self.images_per_s), gflops=self.gflops,
                 pct_peak=self.pct_peak, executed_gflops=self.executed_gflops,
                 executed_pct_peak=self.executed_pct_peak)
        return d


@dataclass
class Latency:
    form: str  # fp32, bf16, int8 or "onnx <precision>"
    computes: str  # how, in words (the precision's reason)
    ms: list[float]  # every timed batch-1 call, in order

    @property
    def p50(self) -> float:
        return percentile(self.ms, 50)

    @property
    def p90(self) -> float:
        return percentile(self.ms, 90)

    def to_dict(self) -> dict[str, Any]:
        return {"form": self.form, "computes": self.computes, "batch_size": 1, "p50_ms": self.p50,
                "p90_ms": self.p90, "images_per_s_at_p50": 1000 / self.p50, "samples": len(self.ms), "ms": self.ms}


@dataclass
class BenchResult:
    settings: BenchSettings
    environment: dict[str, Any]
    gemm_peak_gflops: float  # of the precision measured (the one every % peak is a share of)
    measurements: list[Measurement] = field(default_factory=list)
    precision: dict[str, str] = field(default_factory=dict)  # requested, name (resolved), reason, forms
    gemm_peaks: dict[str, dict[str, float]] = field(default_factory=dict)  # precision -> gflops, size
    latency: list[Latency] = field(default_factory=list)  # batch 1, one per serving form (inference only)

    def get(self, impl: str, mode: str) -> Measurement | None:
        return next((m for m in self.measurements if m.impl == impl and m.mode == mode), None)

    def ratios(self) -> dict[str, dict[str, Any]]:
        """vitlab/other per mode. Repeats are paired (run back to back), so each pair's ratio cancels the
        machine's slow drift; min and median are over those pairs. `of_medians` is the ratio of the two
        columns' medians in the table: it can point the other way when repeats disagree."""
        out: dict[str, dict[str, Any]] = {}
        for mode in self.settings.modes:
            ours, theirs = self.get("vitlab", mode), self.get(self.settings.compare or "", mode)
            if ours is None or theirs is None:
                continue
            pairs = [a / b for a, b in zip(ours.images_per_s, theirs.images_per_s, strict=True)]
            out[mode] = {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs),
                         "per_repeat": pairs, "of_medians": ours.median / theirs.median,
                         "vitlab_faster_in": sum(p > 1 for p in pairs), "repeats": len(pairs)}
        return out

    def ratio_lines(self) -> list[str]:
        """One line per mode that says in words who was faster, then how the numbers are made."""
        other, lines = self.settings.compare, []
        for mode, r in self.ratios().items():
            pairs = ", ".join(f"{v:.3f}" for v in r["per_repeat"])
            lines.append(f"vitlab/{other} {mode}: per repeat {pairs}; median {r['median']:.3f}, ratio of the "
                         f"img/s medians above {r['of_medians']:.3f}; {verdict(r['vitlab_faster_in'], r['repeats'])}")
        if lines:
            lines.append(f"(vitlab img/s / {other} img/s of repeats timed back to back, so slow drift of the machine "
                         "cancels within a pair; their median need not equal the ratio of the medians. Mixed "
                         "directions mean the difference is within this machine's noise: raise --repeats and "
                         "--min-time.)")
        return lines

    def table(self) -> str:
        """Markdown: a header line, one row per implementation and mode, then the ratios."""
        s, env = self.settings, self.environment
        peaks = ", ".join(f"{k} {v['gflops']:.1f}" for k, v in self.gemm_peaks.items())
        lines = [
            f"{s.model}, batch {s.batch_size}, {s.image_size}x{s.image_size}, {s.device} {env['precision']}, "
            f"{env['threads']} threads, malloc: {env.get('malloc', 'not recorded')}, compile={s.compile}; "
            f"GEMM peak {self.gemm_peak_gflops:.1f} GFLOP/s"
            + (f" ({peaks} GFLOP/s measured)" if len(self.gemm_peaks) > 1 else ""),
            *([f"precision: {self.precision['name']} ({self.precision['reason']}); {self.precision['forms']}"]
              if self.precision else []),
            *([f"vitlab's training attention: {a['name']} ({a['reason']})"] if (a := env.get("attention")) else []),
            "",
            "| impl | model | mode | img/s median | img/s min-max | GMACs/img | GFLOP/s | % peak | % peak executed |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for m in self.measurements:
            lines.append(
                f"| {m.impl} | {m.model} | {m.mode} | {m.median:.2f} | {min(m.images_per_s):.2f}-"
                f"{max(m.images_per_s):.2f} | {m.macs_per_image / 1e9:.3f} | {m.gflops:.1f} | {m.pct_peak:.1f} | "
                f"{m.executed_pct_peak:.1f} |"
            )
        ratios = self.ratio_lines()
        lines += ["", *ratios] if ratios else []
        lines += self.latency_lines()
        return "\n".join(lines).rstrip()

    def latency_lines(self) -> list[str]:
        """The batch-1 latency table of the serving forms (empty without one)."""
        if not self.latency:
            return []
        lines = ["", f"batch-1 latency, vitlab's {self.settings.model} (forms called in turn, "
                     f"{len(self.latency[0].ms)} calls each):", "",
                 "| form | p50 ms | p90 ms | img/s at p50 | computes |", "|---|---|---|---|---|"]
        for lat in self.latency:
            lines.append(f"| {lat.form} | {lat.p50:.2f} | {lat.p90:.2f} | {1000 / lat.p50:.1f} | {lat.computes} |")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"settings": dataclasses.asdict(self.settings), "environment": self.environment,
                "gemm_peak_gflops": self.gemm_peak_gflops, "gemm_peaks": self.gemm_peaks, "precision": self.precision,
                "measurements": [m.to_dict() for m in self.measurements], "ratios": self.ratios(),
                "latency": [lat.to_dict() for lat in self.latency]}
