"""Fixtures shared by the library's tests (tests/) and the reproduction campaign's (reproduction/tests/)."""

import os
import signal
from contextlib import contextmanager

import pytest


def pytest_configure(config):
    """Each pytest-xdist worker computes on its share of the cores (`make test` runs one worker per core): torch
    would give every worker a thread per core, and OpenMP threads spin-waiting for a core another worker holds
    made a 4 s training fixture take 24-51 s. OMP_NUM_THREADS carries the share to the runs and subprocesses the
    tests start; a value already set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        share = max(1, cpus // workers)
        os.environ["OMP_NUM_THREADS"] = str(share)
        torch.set_num_threads(share)


@pytest.fixture
def sigterm_during_step(monkeypatch):
    """`with sigterm_during_step(3): run(...)`: the run receives SIGTERM while it computes step `step` (as a job
    scheduler's preemption would arrive), and trains normally again after the block."""
    import vitlab.train.trainer as loop

    real_step = loop.Trainer._train_step

    @contextmanager
    def during(step: int):
        def step_then_signal(self, batches):
            stats = real_step(self, batches)
            if self.step == step - 1:  # the loop counts the step after this returns
                os.kill(os.getpid(), signal.SIGTERM)
            return stats

        monkeypatch.setattr(loop.Trainer, "_train_step", step_then_signal)
        try:
            yield
        finally:
            monkeypatch.setattr(loop.Trainer, "_train_step", real_step)

    return during


@pytest.fixture(autouse=True)
def _default_verbosity():
    """`vitlab -q …` sets the process-wide verbosity (the `vitlab` logger at WARNING), as it should in a real
    process; tests share one process per worker, so each test starts and ends at the default again (a run's
    console.log lost its INFO lines in a later test otherwise)."""
    from vitlab.progress import set_verbosity

    set_verbosity(0)
    yield
    set_verbosity(0)
