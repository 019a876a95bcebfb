"""device_check section "multi": `vitlab train` on several processes as users run it, NCCL on CUDA, gloo on CPU.

- an FSDP2 run (`torchrun --standalone --nproc-per-node N ... --fsdp`, N the GPUs, 2 gloo processes on CPU) writes
  sharded checkpoints: every step folder holds one shard file per process and the shards' metadata;
- its last checkpoint removed, the run resumes on another world size (1 process, the shards read whole) and
  finishes with the same train losses (to FSDP_REL: one process sums in another order);
- `vitlab convert RUN/checkpoints/step_N out.safetensors` equals the run's gathered final weights, bit for bit;
- a DDP run of N processes trains the same losses as the FSDP2 run (same global batches).
With one GPU, N is 1: one process trains the model unsharded and writes gathered checkpoints, so the shard and
world-size checks are skipped with that reason (1 -> 1 proves nothing); the commands and the conversion still run.
Every run is a subprocess, so a hung or crashed run fails this section and nothing else.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from device_check_runs import FSDP_REL, compare_losses, same_weights, train_losses, train_run

from vitlab.files import CHECKPOINTS, WEIGHTS


def world_size(device: torch.device) -> int:
    """Every GPU on CUDA (NCCL takes one GPU per process); 2 gloo processes on CPU, the smallest that shards."""
    return max(torch.cuda.device_count(), 1) if device.type == "cuda" else 2


def shard_files(step_dir: Path) -> list[str]:
    """The shard files of a sharded step folder (torch.distributed.checkpoint's layout), sorted."""
    shards = step_dir / "shards"
    return sorted(p.name for p in shards.iterdir()) if shards.is_dir() else []


def run(plan: Any, device: torch.device) -> dict[str, Any]:
    if not plan.torchrun:
        return {"checks": [], "skipped": [
            "torchrun FSDP2 sharded save, resume on another world size and DDP: not in the dry run (on CPU with 2 "
            "gloo processes in tests/test_device_check.py)"]}
    # not under --out: checkpoints need not return
    with tempfile.TemporaryDirectory(prefix="vitlab-device-multi-", ignore_cleanup_errors=True) as work:
        return _multi(plan, device, Path(work))


def _multi(plan: Any, device: torch.device, work: Path) -> dict[str, Any]:
    from vitlab.cli import main

    # no dropout: its masks are drawn per process, so runs of different world sizes would draw different ones
    args, steps, nproc = [*plan.run_args, "--dropout", "0"], plan.run_steps, world_size(device)
    backend = "NCCL" if device.type == "cuda" else "gloo"
    fsdp, last = work / "fsdp", f"step_{steps:08d}"
    checks: list[dict[str, Any]] = []
    skipped: list[str] = []
    train_run(fsdp, [*args, "--fsdp"], device, torchrun=True, nproc=nproc)
    ref = train_losses(fsdp)
    checks.append({"name": f"FSDP2 ({backend}) on {nproc} process(es): the run finishes", "value": len(ref),
                   "passed": len(ref) == steps and (fsdp / WEIGHTS).is_file(), "note": "logged train steps"})
    if nproc > 1:
        want = sorted([".metadata", *(f"__{rank}_0.distcp" for rank in range(nproc))])
        for step_dir in sorted((fsdp / CHECKPOINTS).glob("step_*")):
            got = shard_files(step_dir)
            checks.append({"name": f"FSDP2 {step_dir.name}: one shard file per process", "value": len(got),
                           "bound": len(want), "passed": got == want, "files": got})
    else:
        skipped.append("per-rank shards: one GPU, so one process, which trains unsharded and writes gathered "
                       "checkpoints")
    out = work / "converted.safetensors"
    converted = main(["-q", "convert", str(fsdp / CHECKPOINTS / last), str(out)]) == 0
    same, worst = same_weights(out, fsdp / WEIGHTS) if converted else (False, float("inf"))
    checks.append({"name": f"vitlab convert {CHECKPOINTS}/{last} equals the run's gathered weights", "value": same,
                   "passed": same, "max_abs_difference": worst})
    if nproc > 1:
        resumed = work / "resumed"
        shutil.copytree(fsdp, resumed)
        shutil.rmtree(resumed / CHECKPOINTS / last)
        (resumed / WEIGHTS).unlink()
        train_run(resumed, [*args, "--fsdp", "--resume"], device, in_process=plan.in_process)
        row = compare_losses(f"FSDP2 resumed from step {steps // 2} on 1 process (saved on {nproc}): train losses",
                       train_losses(resumed), ref)
        row["passed"] = row["passed"] and (resumed / WEIGHTS).is_file() and (resumed / CHECKPOINTS / last).is_dir()
        checks.append(row)
    else:
        skipped.append("resume on another world size: one GPU, so the run was saved on 1 process (1 -> 1 tests "
                       "nothing)")
    ddp = work / "ddp"
    train_run(ddp, args, device, torchrun=True, nproc=nproc)
    row = compare_losses(f"DDP ({backend}) vs FSDP2 on {nproc} process(es): train losses", train_losses(ddp), ref)
    if nproc == 1:
        row["note"] = "one process: the process group and torchrun start-up; DDP wraps from 2"
    checks.append(row)
    return {"checks": checks, "skipped": skipped, "nproc": nproc, "backend": backend, "train_args": args,
            "fsdp_losses": ref, "bound": FSDP_REL}
