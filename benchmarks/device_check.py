"""The GPU path proven by one command (issue 23): CUDA parity, bf16 training MFU and inference against timm,
DDP/FSDP2 under torchrun (on every GPU: sharded FSDP2 checkpoints, resumed on another world size), an exact CUDA
resume, and the training loader against what the GPU consumes.

    python benchmarks/device_check.py --out DIR             # on a GPU: the full check, about 7 minutes on an H200
    python benchmarks/device_check.py --dry-run --out DIR   # anywhere: tiny models, few steps (the test suite's)

On the device tool's machine (torch and timm preinstalled, no network), from the repository root:

    python3 -m pip install -q --no-deps --no-build-isolation -e . && python3 benchmarks/device_check.py --out $OUT

Writes DIR/device_check.json (every figure, each section's seconds, errors) and DIR/device_check.md (the
tables), both rewritten after every section, so a run stopped by its time limit still leaves what it measured.
A section that fails records its error and the script goes on; one that cannot run here (no CUDA, no time
left in the budget) records why it was skipped and prints the reason. Exit code 0 unless a parity bound or an
equality check failed (1); performance targets are reported, not enforced.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the device_check_* section modules beside this file

import torch  # noqa: E402

TINY = {"depth": 1, "width": 32, "num_heads": 2, "mlp_dim": 64}  # a dry run's ViT: every code path, no cost


@dataclass(frozen=True)
class Plan:
    """What each section runs: `full` on a GPU, `dry_run` anywhere in well under a minute."""

    name: str
    budget_s: float  # the whole script; a section whose estimate no longer fits is skipped
    parity_models: tuple[tuple[str, dict[str, int], int], ...]  # (registry name, overrides, image size)
    parity_batch: int
    speed_model: str  # a registry name with a timm equivalent (vitlab.bench.compare)
    speed_image: int
    speed_batch: int
    speed_repeats: int
    speed_min_time: float
    speed_warmup: int
    compile: bool
    gemm_size: int | None  # side of the peak-measuring matmul (None: vitlab.bench's default, 8192 on CUDA)
    threads: int | None  # torch threads in this process (None: torch's default)
    run_args: tuple[str, ...]  # `vitlab train` flags of the DDP/FSDP2/resume runs
    run_steps: int
    torchrun: bool
    in_process: bool  # the single-process runs in this process (dry run) rather than as subprocesses
    loader_images: int  # generated 500x375 JPEGs
    loader_batch: int
    loader_steps: int
    estimates: dict[str, float] = field(default_factory=dict)  # section -> seconds it needs at most
    precision: str = "auto"  # the speed section's --precision (vitlab bench's); int8 times inference only


def _run_args(steps: int, batch: int, workers: int) -> tuple[str, ...]:
    return ("--model", "ViT-Ti/4", "--depth", "2", "--width", "64", "--heads", "2", "--mlp-dim", "128",
            "--image-size", "16", "--batch-size", str(batch), "--warmup", "2", "--workers", str(workers),
            "--log-every", "1", "--eval-every", str(steps // 2), "--save-every", str(steps // 2), "--keep-last", "2",
            "--steps", str(steps), "--dropout", "0.1")  # dropout: the resume must restore the RNG too


FULL = Plan(
    name="full", budget_s=540,
    parity_models=(("ViT-B/16", {}, 224), ("R50+ViT-B/16", {}, 224), ("BiT-R50x1", {}, 224)), parity_batch=8,
    speed_model="ViT-B/16", speed_image=224, speed_batch=256, speed_repeats=3, speed_min_time=2.0, speed_warmup=3,
    compile=True, gemm_size=None, threads=None, run_args=_run_args(20, 64, 2),
    run_steps=20, torchrun=True, in_process=False,
    loader_images=2000, loader_batch=256, loader_steps=16,
    estimates={"parity": 60, "speed_eager": 60, "speed_compiled": 240, "runs": 120, "multi": 120, "loader": 60},
)
DRY_RUN = Plan(
    name="dry-run", budget_s=120,
    parity_models=(("ViT-B/16", TINY, 32), ("R50+ViT-B/16", TINY, 32), ("BiT-R50x1", {}, 32)), parity_batch=2,
    speed_model="ViT-Ti/16", speed_image=32, speed_batch=4, speed_repeats=2, speed_min_time=0.05, speed_warmup=1,
    compile=False, gemm_size=256, threads=1, run_args=_run_args(6, 16, 0),
    run_steps=6, torchrun=False, in_process=True,
    loader_images=24, loader_batch=8, loader_steps=4,
    estimates={"parity": 20, "speed_eager": 20, "speed_compiled": 0, "runs": 40, "multi": 0, "loader": 30},
)


class Report:
    """The JSON being built, rewritten (with its Markdown) after every section."""

    def __init__(self, out: Path, plan: Plan, device: torch.device):
        self.out, self.started = out, time.perf_counter()
        self.data: dict[str, Any] = {"plan": asdict(plan), "environment": environment(device), "sections": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def record(self, name: str, result: dict[str, Any]) -> None:
        self.data["sections"][name] = result
        self.data["total_seconds"] = round(self.elapsed(), 1)
        self.write()

    def write(self) -> None:
        from device_check_report import markdown

        from vitlab.files import atomic_write

        text = json.dumps(self.data, indent=1, default=str)
        atomic_write(self.out / "device_check.json", lambda tmp: Path(tmp).write_text(text))
        md = markdown(self.data)
        atomic_write(self.out / "device_check.md", lambda tmp: Path(tmp).write_text(md))

    def failed_checks(self) -> list[str]:
        return [f"{s}: {c['name']}" for s, r in self.data["sections"].items() for c in r.get("checks", [])
                if c.get("passed") is False]


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "device": str(device),
        "torch": torch.__version__, "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "commit": _git_commit(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)
    try:
        import timm

        env["timm"] = timm.__version__
    except ImportError:
        env["timm"] = None
    return env


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def log(msg: str) -> None:
    print(f"[device_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_section(report: Report, plan: Plan, name: str, fn: Callable[[], dict[str, Any]], estimate: str = "") -> None:
    """Run one section with its time and its error, if any, recorded; skipped when the budget is spent."""
    left = plan.budget_s - report.elapsed()
    need = plan.estimates.get(estimate or name, 0)
    if need > left:
        reason = f"skipped: it needs up to {need:.0f} s and {left:.0f} s of the {plan.budget_s:.0f} s budget are left"
        log(f"{name}: {reason}")
        report.record(name, {"status": "skipped", "reason": reason, "seconds": 0.0})
        return
    log(f"{name}: start ({left:.0f} s of the budget left)")
    t0 = time.perf_counter()
    try:
        result = fn()
        result.setdefault("status", "ok")
    except Exception as err:  # a section that fails must not stop the others: its error is the result
        result = {"status": "error", "error": f"{type(err).__name__}: {err}",
                  "traceback": traceback.format_exc(limit=8)[-3000:]}
        log(f"{name}: error: {result['error']}")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    for skipped in result.get("skipped", []):
        log(f"{name}: skipped {skipped}")
    log(f"{name}: {result['status']} in {result['seconds']} s")
    report.record(name, result)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for device_check.json and device_check.md")
    p.add_argument("--dry-run", action="store_true", help="tiny models and few steps: the CPU check of the script")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    p.add_argument("--budget", type=float, help="seconds for the whole script (default: 540, dry run 120)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="auto",
                   help="what the speed section computes in, as vitlab bench --precision (default auto: bf16 on CUDA)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda asked for, but torch sees no CUDA device")
    if device.type != "cuda" and not args.dry_run:
        p.error("the full check needs a CUDA device (torch sees none); --dry-run checks the script on CPU")
    plan = DRY_RUN if args.dry_run else FULL
    if args.budget:
        plan = Plan(**{**asdict(plan), "budget_s": args.budget})
    plan = Plan(**{**asdict(plan), "precision": args.precision})
    args.out.mkdir(parents=True, exist_ok=True)
    if plan.threads:  # one thread: on a shared 2-core machine OpenMP's second thread waits for a core
        torch.set_num_threads(plan.threads)
    return run_all(plan, device, args.out)


def run_all(plan: Plan, device: torch.device, out: Path) -> int:
    import device_check_loader
    import device_check_multi
    import device_check_parity
    import device_check_runs
    import device_check_speed

    report = Report(out, plan, device)
    log(f"plan {plan.name} on {device}: budget {plan.budget_s:.0f} s, output {out}")
    report.write()
    # Correctness first; the compiled speed part, the longest, takes what is left after the loader's share.
    run_section(report, plan, "parity", lambda: device_check_parity.run(plan, device))
    run_section(report, plan, "runs", lambda: device_check_runs.run(plan, device))
    run_section(report, plan, "multi", lambda: device_check_multi.run(plan, device))
    run_section(report, plan, "speed", lambda: device_check_speed.run(plan, device, report), estimate="speed_eager")
    consumed = device_check_speed.training_images_per_s(report.data["sections"].get("speed", {}))
    run_section(report, plan, "loader", lambda: device_check_loader.run(plan, device, consumed))
    failed = report.failed_checks()
    errors = [n for n, r in report.data["sections"].items() if r["status"] == "error"]
    log(f"done in {report.elapsed():.0f} s: {len(failed)} failed check(s) {failed}, {len(errors)} section error(s) "
        f"{errors}; {out / 'device_check.md'}")
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
