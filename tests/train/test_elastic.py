"""torchrun's fault tolerance: a worker of a `--max-restarts` job killed with SIGKILL around a checkpoint (just after
one, while rank 0 writes one, between two) is restarted by torchrun, the new processes connect again, resume from
the newest intact checkpoint, and the job ends by itself with weights equal bit for bit to the uninterrupted run's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import TINY_VIT_FLAGS
from tests.train.test_distributed import TORCHRUN
from tests.train.test_distributed_signals import alive, descendants

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process trees from /proc")

STEPS, SAVE_EVERY = 30, 5
ARGS = [*TINY_VIT_FLAGS, "--image-size", "8", "--batch-size", "16", "--warmup", "3", "--workers", "0",
        "--log-every", "1", "--eval-every", "0", "--steps", str(STEPS), "--save-every", str(SAVE_EVERY),
        "--data", "digits", "--resume", "auto"]
JOB_TIMEOUT_S = 420  # a loaded 2-core machine starts torch slowly; a hang (the failure this guards) never ends


def elastic_job(out: Path) -> subprocess.Popen:
    """`torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m vitlab train ... --resume auto`."""
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "-m", "vitlab", "train",
           "--out", str(out), *ARGS]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(job: subprocess.Popen) -> str:
    try:
        output, _ = job.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        pytest.fail(f"the job did not end within {JOB_TIMEOUT_S} s:\n{output[-4000:]}")
    assert job.returncode == 0, output[-4000:]
    return output


def worker(job: subprocess.Popen, rank: int) -> int | None:
    """The pid of the training process of `rank` (its RANK in /proc/PID/environ), None before it started."""
    for pid in descendants(job.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            args = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"vitlab" in args and f"RANK={rank}".encode() in environ:
            return pid
    return None


def trained_to(out: Path, step: int) -> bool:
    metrics = out / "metrics.jsonl"
    return metrics.is_file() and f'"step": {step}, "split": "train"' in metrics.read_text()


def writing(out: Path, pid: int) -> bool:
    """Whether process `pid` is writing a checkpoint (its temporary step folder exists)."""
    return any((out / "checkpoints").glob(f".step_*.tmp{pid}"))


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("elastic") / "whole"
    finish(elastic_job(out))
    return weights(out)


def kill_when(job: subprocess.Popen, rank: int, moment, timeout_s: float = 300) -> int:
    """SIGKILL the process of `rank` as soon as `moment(pid)` holds; returns its pid."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and job.poll() is None:
        pid = worker(job, rank)
        if pid is not None and moment(pid):
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.001)
    os.killpg(job.pid, signal.SIGKILL)
    pytest.fail(f"the moment to kill rank {rank} never came:\n{job.communicate()[0][-3000:]}")


MOMENTS = {
    # rank 1 killed as soon as the step-10 checkpoint is complete (rank 0 may still be in its barrier or pruning)
    "just after a checkpoint": (1, lambda out: lambda pid: (out / "checkpoints" / "step_00000010").is_dir()),
    # rank 0, the writer, killed while its temporary step folder exists: the half-written checkpoint is ignored
    "during a checkpoint's write": (0, lambda out: lambda pid: trained_to(out, 10) and writing(out, pid)),
    # rank 1 killed between two checkpoints: the steps after the last one are trained again
    "between checkpoints": (1, lambda out: lambda pid: trained_to(out, 13)),
}


@pytest.mark.parametrize("moment", [
    "just after a checkpoint",
    pytest.param("during a checkpoint's write", marks=pytest.mark.slow),
    pytest.param("between checkpoints", marks=pytest.mark.slow),
])
def test_a_killed_worker_is_restarted_and_the_job_ends_as_if_uninterrupted(tmp_path, uninterrupted, moment):
    out = tmp_path / "run"
    rank, condition = MOMENTS[moment]
    job = elastic_job(out)
    killed = kill_when(job, rank, condition(out))
    if moment == "during a checkpoint's write":
        assert writing(out, killed), "the kill missed the write"  # its half-written folder is left behind
    output = finish(job)
    assert not alive(killed)
    assert "resuming from" in output and "failed (exitcode: -9)" in output
    assert "Traceback" not in output and "connectFullMesh" not in output, output[-4000:]
    resumed = weights(out)
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in uninterrupted.items():
        assert torch.equal(resumed[name], tensor), name  # bit for bit
    assert not list((out / "checkpoints").glob(".step_*"))  # the half-written folder was cleaned up


def test_an_earlier_start_of_the_job_leaves_nothing_a_restart_reads(tmp_path):
    """The restarted processes of a torchrun job connect under a prefix of their own in the agent's store, which
    outlives them: process 1 of the first start dies after connecting, and the second start connects even though
    its process 1 comes late (its predecessor's address was still in the store)."""
    script = tmp_path / "job.py"
    script.write_text(
        "import os, time\nimport torch.distributed as dist\nfrom vitlab.train.distributed import setup\n"
        "start, rank = int(os.environ['TORCHELASTIC_RESTART_COUNT']), int(os.environ['RANK'])\n"
        "if start == 1 and rank == 1:\n    time.sleep(2)\n"
        "setup('cpu')\ndist.barrier()\nos.write(1, f'start {start} rank {rank} connected\\n'.encode())\n"
        "if start == 0 and rank == 1:\n    os._exit(9)\n"
        "time.sleep(3 if start == 0 else 0)\ndist.destroy_process_group()\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VITLAB_DIST_TIMEOUT": "60",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", str(script)],
                          env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("start")) == [
        "start 0 rank 0 connected", "start 0 rank 1 connected", "start 1 rank 0 connected", "start 1 rank 1 connected"]
