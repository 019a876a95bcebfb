"""How long a run will take, from a step it has measured: one line after the banner, before the first step line.

The estimate times one step, not a guess from the model's size: step 2 of the run (step 1 pays once for the
loader workers' start-up, the first allocations and, on a GPU, kernel selection), or step 1 when the first log
line comes at step 1 or the run has one step left. A step takes its compute time, or the time the loader workers
need to produce its batch if that is longer (they run beside the compute); with no worker processes the loading
happens inside the step and counts in full. Evaluations, few-shot probes and checkpoints come on top, and a run
that becomes data-bound or is slowed by other programs later takes longer: the line says what it measured.
"""

from __future__ import annotations


def estimate_step(start_step: int, total_steps: int, log_every: int) -> int:
    """The step whose time the estimate uses (see the module doc)."""
    return start_step + (2 if log_every >= 2 and total_steps - start_step >= 2 else 1)


def step_seconds(stats: dict[str, float], workers: int) -> float:
    """The time one step takes in a steady run, from one measured step's stats (the loop's `_train_step`)."""
    compute = max(stats["seconds"] - stats["wait"], 0.0)
    if workers <= 0:
        return stats["seconds"]  # loading happened in this process, inside the step
    return max(compute, stats["load"] / workers)


def estimate_line(stats: dict[str, float], workers: int, remaining: int, measured: int, total: int) -> str:
    """One line: the time the `remaining` steps of a `total`-step run will take at step `measured`'s pace."""
    per_step = step_seconds(stats, workers)
    loading = (f"{stats['load'] / workers:.3g} s of loading over {workers} worker{'s' if workers != 1 else ''} "
               "beside it" if workers > 0 else f"{stats['wait']:.3g} s of it loading in this process")
    return (f"time    about {duration(per_step * remaining)} for {remaining:,} of {total:,} steps: "
            f"{per_step:.3g} s a step, measured on step {measured} (compute "
            f"{max(stats['seconds'] - stats['wait'], 0.0):.3g} s, {loading}); evaluations and checkpoints not "
            "included")


def duration(seconds: float) -> str:
    """`45 s`, `12 min`, `3.4 h`, `2.1 days`: as precise as an estimate is."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
