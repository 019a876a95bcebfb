"""Signals in a distributed job (vitlab.train.distributed): a process whose peer was stopped or killed ends in one
line within the collective timeout, SIGTERM works while it waits, and a collective that lost its peer is one line.
The process-tree helpers here also serve the `vitlab experiment` signal tests (tests/cli)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TINY_VIT_FLAGS
from vitlab.errors import PeerLost
from vitlab.train import distributed
from vitlab.train.distributed import collective_timeout, peer_failure, peers_in_one_line

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process trees from /proc")

def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_until(condition, timeout_s: float, what: str) -> None:
    """Poll `condition` (a loaded CI machine starts torch slowly); fail naming `what` after `timeout_s`."""
    for _ in range(int(timeout_s / 0.2)):
        if condition():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def trained_a_step(run_dir: Path) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.is_file() and '"split": "train"' in metrics.read_text()


# --- a distributed job ------------------------------------------------------------------------------------------
DDP_ARGS = [*TINY_VIT_FLAGS, "--image-size",
            "8", "--batch-size", "8", "--workers", "0", "--log-every", "1", "--eval-every", "0", "--steps", "100000",
            "--data", "digits"]


def start_job(out: Path, timeout_s: int) -> list[subprocess.Popen]:
    """Two processes started by hand, as a launcher would (gloo on CPU), with a collective timeout of `timeout_s`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
               "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
               "VITLAB_DIST_TIMEOUT": str(timeout_s)}
        procs.append(subprocess.Popen([sys.executable, "-m", "vitlab", "train", "--out", str(out), *DDP_ARGS], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def rank0_after(out: Path, timeout_s: int, act) -> subprocess.CompletedProcess:
    """Start the job, wait for its first step, `act(procs)`, and return how rank 0 ended (killed after 90 s)."""
    procs = start_job(out, timeout_s)
    try:
        wait_until(lambda: trained_a_step(out) or any(p.poll() is not None for p in procs), 240, "the first step")
        assert all(p.poll() is None for p in procs), procs[0].communicate()[1][-3000:]
        act(procs)
        stdout, stderr = procs[0].communicate(timeout=90)  # before the fix: 30 minutes (gloo's default)
        return subprocess.CompletedProcess([], procs[0].returncode, stdout, stderr)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def error_lines(stderr: str) -> list[str]:
    """What rank 0 said beyond its banner and step lines."""
    return [line for line in stderr.splitlines() if line.startswith(("vitlab", "[rank", "Traceback", "RuntimeError"))
            and not line.startswith("vitlab demo:")]


@pytest.mark.slow
def test_a_process_waiting_for_a_stopped_peer_exits_on_sigterm_in_one_line(tmp_path):
    def stop_then_term(procs):
        os.kill(procs[1].pid, signal.SIGSTOP)  # a frozen peer: rank 0 waits in the gradient all-reduce
        time.sleep(1)
        os.kill(procs[0].pid, signal.SIGTERM)

    done = rank0_after(tmp_path / "run", 120, stop_then_term)  # a timeout far longer than the grace
    assert done.returncode == 143, done.stderr[-3000:]
    assert error_lines(done.stderr) == [
        "vitlab: SIGTERM while process 0 waits for the other processes of the job (one is stopped or gone; no answer "
        "for 10 s): exiting without a checkpoint; the last one resumes the run (--resume)"], done.stderr[-3000:]


@pytest.mark.slow
def test_a_killed_peer_ends_the_survivor_in_one_line(tmp_path):
    done = rank0_after(tmp_path / "run", 120, lambda procs: os.kill(procs[1].pid, signal.SIGKILL))
    assert done.returncode == 1, done.stderr[-3000:]
    assert error_lines(done.stderr) == [
        "vitlab train: error: process 0: another process of the job is gone (killed or crashed); the job stops here: "
        "start every process again with --resume to continue from the last checkpoint"], done.stderr[-3000:]


@pytest.mark.slow
def test_a_stopped_peer_ends_the_job_after_the_collective_timeout_in_one_line(tmp_path):
    done = rank0_after(tmp_path / "run", 5, lambda procs: os.kill(procs[1].pid, signal.SIGSTOP))
    assert done.returncode == 1, done.stderr[-3000:]
    assert error_lines(done.stderr) == [
        "vitlab train: error: process 0: another process did not answer within 5 s (VITLAB_DIST_TIMEOUT); the job "
        "stops here: start every process again with --resume to continue from the last checkpoint"], done.stderr[-3000:]


# --- the parts, fast --------------------------------------------------------------------------------------------
def test_the_collective_timeout_is_a_few_minutes_and_set_by_the_environment(monkeypatch):
    monkeypatch.delenv("VITLAB_DIST_TIMEOUT", raising=False)
    assert collective_timeout() == 300
    monkeypatch.setenv("VITLAB_DIST_TIMEOUT", "45")
    assert collective_timeout() == 45
    for bad in ("0", "-3", "nan", "inf", "ten", "1e9"):
        monkeypatch.setenv("VITLAB_DIST_TIMEOUT", bad)
        with pytest.raises(ValueError, match=r"^VITLAB_DIST_TIMEOUT='.*' is not a number of seconds from 1 to 86400"):
            collective_timeout()


def test_setup_gives_the_process_group_the_collective_timeout(monkeypatch):
    seen = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("VITLAB_DIST_TIMEOUT", "42")
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, **kw: seen.update(kw, backend=backend))
    distributed.setup("cpu")
    assert seen["backend"] == "gloo" and seen["timeout"].total_seconds() == 42


@pytest.mark.parametrize(("message", "reason"), [
    ("[../gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:4711", "is gone"),
    ("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation to complete",
     "did not answer"),
    ("[../gloo/transport/tcp/pair.cc:598] Connection reset by peer", "is gone"),
])
def test_a_collective_that_lost_its_peer_is_one_line(monkeypatch, message, reason):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")

    @peers_in_one_line
    def step():
        raise RuntimeError(message)

    with pytest.raises(PeerLost, match=rf"^process 1: another process (of the job )?{reason}") as caught:
        step()
    assert caught.value.__suppress_context__ and "gloo" not in str(caught.value)  # no traceback of gloo's


def test_other_errors_pass_through_and_a_single_process_is_left_alone(monkeypatch):
    @peers_in_one_line
    def step(message):
        raise RuntimeError(message)

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        step("shape mismatch")
    assert peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert peer_failure(RuntimeError("DataLoader timed out after 5 seconds")) is None  # not a collective's
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RuntimeError, match="closed by peer") as caught:
        step("Connection closed by peer")
    assert not isinstance(caught.value, PeerLost)


# The watch on its own: a main thread blocked in one call (as in a collective whose peer is stopped) and SIGTERM.
WATCH_SCRIPT = """
import os, signal, sys, threading, time
import torch
import vitlab.train.distributed as peerwatch
from vitlab.train.distributed import Dist
from vitlab.train.distributed import StopSignals

peerwatch.GRACE_FLOOR_S = 1.0
busy = sys.argv[1] == "busy"
with StopSignals(Dist(0, 2, 0, 2, torch.device("cpu"), False)) as stops:
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    if busy:  # a step that keeps computing: given the time, and the stop is the trainer's
        end = time.monotonic() + 3  # three times the grace
        while time.monotonic() < end:
            sum(range(1000))
    else:  # one call that never returns, as a collective whose peer is stopped
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
print("requested", stops.requested, flush=True)
"""


@pytest.mark.parametrize("main", ["blocked", "busy"])
def test_sigterm_takes_effect_while_the_main_thread_waits_in_one_call(tmp_path, main):
    script = tmp_path / "watch.py"
    script.write_text(WATCH_SCRIPT)
    done = subprocess.run([sys.executable, str(script), main], capture_output=True, text=True, timeout=60)
    if main == "blocked":
        assert done.returncode == 143, done.stderr
        assert done.stderr.splitlines()[-1] == (
            "vitlab: SIGTERM while process 0 waits for the other processes of the job (one is stopped or gone; no "
            "answer for 1 s): exiting without a checkpoint; the last one resumes the run (--resume)")
        assert "requested" not in done.stdout
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "requested SIGTERM"
