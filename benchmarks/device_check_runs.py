"""device_check section "runs": `vitlab train` as users run it, on the device.

- one process; then `torchrun --standalone --nproc-per-node 1` with DDP (NCCL on CUDA) and with --fsdp (FSDP2):
  the same global batches, so the same train losses step for step (checked to FSDP_REL relative; whether they
  are bit-identical is recorded too). With one GPU there is one process: FSDP2 shards every block and the root
  (fully_shard runs at any world size), but vitlab wraps in DDP only from 2 processes, so the DDP row proves
  the torchrun start-up, the NCCL process group and rank-0 writing, not the gradient all-reduce (2 processes
  on one GPU are refused by NCCL; on CPU, gloo DDP with 2 processes is tests/train/test_distributed.py's);
- the single run's last checkpoint is removed and the run resumed from the one before: its train losses and
  final weights must be bit-identical to the uninterrupted run's (dropout on, so the RNG state is restored too).
On a GPU every run is a subprocess, so a hung or crashed run fails its row and nothing else; the dry run trains
in this process (`vitlab.cli.main`, the same command line), which saves two interpreter starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

FSDP_REL = 1e-5  # losses of 1 process vs torchrun: same global batch, same arithmetic up to reduction order
RUN_TIMEOUT_S = 180


def train_losses(run_dir: Path) -> list[float]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["loss"] for r in records if r["split"] == "train"]


def train_run(out: Path, args: list[str], device: torch.device, torchrun: bool = False,
           in_process: bool = False, nproc: int = 1) -> None:
    if in_process and not torchrun:
        from vitlab.cli import main

        argv = ["-q", "train", "--out", str(out), *args, "--device", device.type]
        if main(argv) != 0:
            raise RuntimeError(f"vitlab {' '.join(argv)} failed (its error is printed above)")
        return
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)] \
        if torchrun else [sys.executable]
    cmd = [*launcher, "-m", "vitlab", "train", "--out", str(out), *args, "--device", device.type]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-1500:]
        raise RuntimeError(f"{' '.join(cmd[:8])} ... exited {done.returncode}: {tail}")


def compare_losses(name: str, losses: list[float], ref: list[float]) -> dict[str, Any]:
    if len(losses) != len(ref):
        return {"name": name, "value": None, "bound": FSDP_REL, "passed": False,
                "note": f"{len(losses)} logged steps, the single process {len(ref)}"}
    rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref, strict=True))
    return {"name": name, "value": rel, "bound": FSDP_REL, "passed": rel <= FSDP_REL, "bit_identical": losses == ref}


def same_weights(a: Path, b: Path) -> tuple[bool, float]:
    from safetensors.torch import load_file

    wa, wb = load_file(str(a)), load_file(str(b))
    if wa.keys() != wb.keys():
        return False, float("inf")
    worst = max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa)
    return all(torch.equal(wa[k], wb[k]) for k in wa), worst


def resume_check(run_dir: Path, args: list[str], device: torch.device, steps: int,
                 in_process: bool) -> list[dict[str, Any]]:
    """Remove the single run's final checkpoint, resume from the one before, compare with the original."""
    ref_losses, ref_weights = train_losses(run_dir), run_dir.parent / "uninterrupted.safetensors"
    shutil.copyfile(run_dir / "model.safetensors", ref_weights)
    shutil.rmtree(run_dir / "checkpoints" / f"step_{steps:08d}")
    train_run(run_dir, [*args, "--resume"], device, in_process=in_process)
    losses = train_losses(run_dir)
    same, worst = same_weights(run_dir / "model.safetensors", ref_weights)
    return [
        {"name": f"resume at step {steps // 2} on {device.type}: train losses bit-identical",
         "value": losses == ref_losses, "passed": losses == ref_losses, "steps": len(losses)},
        {"name": f"resume at step {steps // 2} on {device.type}: final weights bit-identical", "value": same,
         "passed": same, "max_abs_difference": worst},
    ]


def run(plan: Any, device: torch.device) -> dict[str, Any]:
    # not under --out: checkpoints need not return
    with tempfile.TemporaryDirectory(prefix="vitlab-device-runs-", ignore_cleanup_errors=True) as work:
        return _runs(plan, device, Path(work))


def _runs(plan: Any, device: torch.device, work: Path) -> dict[str, Any]:
    args = list(plan.run_args)
    train_run(work / "single", args, device, in_process=plan.in_process)
    ref = train_losses(work / "single")
    checks, skipped = [], []
    if plan.torchrun:  # NCCL on CUDA, gloo on CPU (tests/test_device_check.py's slow test)
        for name, extra in ((f"DDP ({'NCCL' if device.type == 'cuda' else 'gloo'})", []), ("FSDP2", ["--fsdp"])):
            train_run(work / name.split()[0].lower(), [*args, *extra], device, torchrun=True)
            checks.append(compare_losses(f"torchrun --nproc-per-node 1 {name} vs 1 process: train losses",
                                   train_losses(work / name.split()[0].lower()), ref))
            if name.startswith("DDP"):
                checks[-1]["note"] = "one process: the process group and torchrun start-up; DDP wraps from 2"

    else:
        skipped.append("torchrun DDP/FSDP2: not in the dry run (on CPU, gloo DDP and FSDP2 with 2 processes equal "
                       "one process in tests/train/test_distributed.py)")
    checks += resume_check(work / "single", args, device, plan.run_steps, plan.in_process)
    return {"checks": checks, "skipped": skipped, "train_args": args, "single_process_losses": ref}
