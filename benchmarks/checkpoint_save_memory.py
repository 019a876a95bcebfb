"""Peak memory of each process during a checkpoint save: runs `vitlab` as torchrun's worker and, around every
Checkpointer.save, appends this rank's RSS before it and its peak RSS during it (the kernel's high-water mark, reset
at the save's start through /proc/self/clear_refs) to $RSS_OUT. Linux only.

    RSS_OUT=rss.txt torchrun --standalone --nproc-per-node 2 benchmarks/checkpoint_save_memory.py train \
        --model ViT-B/16 --image-size 32 --data digits --steps 1 --batch-size 4 --workers 0 --fsdp --out RUN
"""

import os
import sys

from vitlab.cli import main
from vitlab.train import checkpoint


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024


original = checkpoint.Checkpointer.save


def measured(self, step, training):
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    try:
        return original(self, step, training)
    finally:
        peak = status("VmHWM")
        with open(os.environ["RSS_OUT"], "a") as f:
            f.write(f"rank {os.environ.get('RANK')} step {step}: rss before save {before:.0f} MiB, peak during "
                    f"save {peak:.0f} MiB (+{peak - before:.0f})\n")


checkpoint.Checkpointer.save = measured
sys.exit(main(sys.argv[1:]))
