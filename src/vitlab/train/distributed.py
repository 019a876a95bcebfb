"""Processes and devices. torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT, or a
rendezvous for several nodes) selects distributed mode; parallelism wraps the model from outside (the model
itself knows nothing of DDP or FSDP), as torchtitan does.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from vitlab.errors import PeerLost
from vitlab.runtime.device import all_reduce, pick_device
from vitlab.train.console import log

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    local_world: int
    device: torch.device
    owns_group: bool  # we initialised the process group, so we destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


TIMEOUT_ENV = "VITLAB_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0  # longer than any step or checkpoint of the paper's models; gloo's own default is 30 min





def collective_timeout() -> float:
    """Seconds a collective (a gradient all-reduce, a barrier) waits for the other processes before the job fails:
    $VITLAB_DIST_TIMEOUT, default 300. A peer that died or was stopped then ends the job in one line instead of
    after gloo's 30 minutes; a phase where one process works alone longer (a few-shot evaluation of a large set
    on rank 0) needs it raised."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 1 <= seconds <= 86_400):
        raise ValueError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds from 1 to 86400; set it to the longest "
                         "a process may wait for the others, e.g. 300")
    return seconds


def peer_failure(err: BaseException) -> str | None:
    """What a collective's error says about the other processes, or None if it is not about them: gloo's
    'Connection closed by peer' / 'Connection reset' (a peer died) and 'Timed out' (a peer stopped answering)."""
    text = str(err)
    if not (isinstance(err, getattr(dist, "DistError", ())) or "gloo" in text or "c10d" in text):
        return None  # another part's error (a loader's own timeout, say)
    # Before the timeout words: gloo reports a refused connection as "timed out connecting: ... Connection refused",
    # which is a peer that is gone, at once, not one that stopped answering.
    if any(s in text for s in ("closed by peer", "Connection reset", "Broken pipe", "Connection refused")):
        return "another process of the job is gone (killed or crashed)"
    if "Timed out" in text or "timed out" in text or "Timeout" in text:
        return f"another process did not answer within {collective_timeout():g} s ({TIMEOUT_ENV})"
    return None


def peers_in_one_line(run: Callable[P, R]) -> Callable[P, R]:
    """`run` with the error of a collective whose peer died or stopped answering turned into `PeerLost`: one line
    (vitlab train prints it and exits 1), never gloo's traceback; the job's checkpoints stay valid."""

    @functools.wraps(run)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return run(*args, **kwargs)
        except RuntimeError as err:
            reason = peer_failure(err) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
            if reason is None or isinstance(err, PeerLost):
                raise
            rank = os.environ.get("RANK", "0")
            raise PeerLost(f"process {rank}: {reason}; the job stops here: start every process again with --resume "
                           "to continue from the last checkpoint") from None

    return guarded


def setup(device_name: str = "auto") -> Dist:
    """One process per device. Gloo on CPU, NCCL on CUDA; collectives time out after `collective_timeout()`."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    device = pick_device(device_name, local_rank)
    owns = False
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=collective_timeout())
        store = job_store(rank, world, timeout)
        try:
            dist.init_process_group(backend, device_id=device if device.type == "cuda" else None, timeout=timeout,
                                    **({"store": store, "rank": rank, "world_size": world} if store else {}))
        except RuntimeError as err:
            reason = peer_failure(err) or _first_line(err)
            raise PeerLost(f"process {rank}: could not connect to the other processes of the job ({reason}); start "
                           "every process again (with --resume to continue from the last checkpoint)") from None
        owns = True
    return Dist(rank, world, local_rank, local_world, device, owns)


# --------------------------------------------------------------------------------------------------------------
# torchrun's agent keeps one TCPStore for the job's whole life (TORCHELASTIC_USE_AGENT_STORE): a worker group that
# torchrun restarts (--max-restarts, a node that joins) finds in it the keys the previous group's processes wrote
# when they connected, under the same names (the process group's `default_pg/...`, gloo's addresses, NCCL's unique
# id). A restarted process that reads a dead peer's address before the peer's replacement overwrites it gets
# "Connection refused", or hangs on a port that was reused. So each start of the group connects under a prefix of
# its own, a number process 0 draws from the store; the other processes ask for it under a key that holds a fresh
# random word, which no earlier start can have answered. torchrun's restart count cannot serve: after a node joins,
# the agents restart their workers without counting it, and on several nodes their counts differ.

STORE_ROOT = "vitlab"
POLL_S = 0.05


def job_store(rank: int, world: int, timeout: timedelta) -> dist.Store | None:
    """The store this start of the job connects through: torchrun's agent store under a prefix no earlier start
    used, or None (the process group's own rendezvous) when no store outlives the processes."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timeout)
    except RuntimeError as err:
        raise PeerLost(f"process {rank}: torchrun's store at {address} does not answer ({_first_line(err)}); is the "
                       "torchrun agent of this node running?") from None
    start = _draw_start(store, rank, world, timeout.total_seconds(), address)
    return dist.PrefixStore(f"{STORE_ROOT}/{start}/", store)


def _draw_start(store: dist.Store, rank: int, world: int, seconds: float, address: str) -> int:
    """The number of this start of the job, the same in every process: process 0 draws it and answers each
    process's question (a fresh random key) until all of them confirmed under the new number."""
    if rank != 0:
        word = os.urandom(12).hex()
        store.set(f"{STORE_ROOT}/ask/{rank}", word)
        try:
            store.wait([f"{STORE_ROOT}/answer/{word}"], timedelta(seconds=seconds))
        except RuntimeError:
            raise PeerLost(f"process {rank}: process 0 of the job did not answer within {seconds:g} s (torchrun's "
                           f"store at {address}; {TIMEOUT_ENV} sets the wait): it did not start or is gone") from None
        start = int(store.get(f"{STORE_ROOT}/answer/{word}"))
        store.set(f"{STORE_ROOT}/{start}/joined/{rank}", "1")
        return start
    start = store.add(f"{STORE_ROOT}/starts", 1)
    waiting, answered = set(range(1, world)), set()
    deadline = time.monotonic() + seconds
    while waiting:
        for peer in sorted(waiting):
            if store.check([f"{STORE_ROOT}/{start}/joined/{peer}"]):
                waiting.discard(peer)
            elif store.check([f"{STORE_ROOT}/ask/{peer}"]):
                word = store.get(f"{STORE_ROOT}/ask/{peer}").decode()
                if word not in answered:  # an earlier start's question too: nobody waits for that answer
                    store.set(f"{STORE_ROOT}/answer/{word}", str(start))
                    answered.add(word)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(map(str, sorted(waiting)))
            raise PeerLost(f"process 0: process(es) {names} of the job did not connect within {seconds:g} s "
                           f"(torchrun's store at {address}; {TIMEOUT_ENV} sets the wait): they did not start or "
                           "are gone")
        if waiting:
            time.sleep(POLL_S)
    return start


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:200]


def teardown(d: Dist, finished: bool = True) -> None:
    """Leave the process group this process created, so that its gloo threads stop while the interpreter runs:
    a group object whose last reference dies later, during the interpreter's finalization or on one of its own
    worker threads, aborts the process ("terminate called without an active exception", seen under load in CI at
    the exit of a finished FSDP run). Hence, in order: the garbage the run left (an FSDP model's mesh refers to
    the group) collected; after a run that finished, a barrier, so that no rank closes its connections while a
    peer is still in its last collective (after a failure the other ranks may never arrive: torchrun stops them);
    the group destroyed while this function still holds it, and released here, on the main thread, last."""
    if d.owns_group and dist.is_initialized():
        gc.collect()
        if finished:
            dist.barrier()
        group = dist.group.WORLD
        dist.destroy_process_group()
        del group


def wrap_model(model: nn.Module, d: Dist, compile: bool, fsdp: bool) -> nn.Module:
    """Compile in place (state-dict keys unchanged), then shard (FSDP2: each block, then the root) or
    replicate (DDP). Returns the module to call for training. One process trains the model as it is, --fsdp or
    not: there is nothing to shard across (a sharded run resumed on one process)."""
    model.to(d.device)
    if compile:
        model.compile()
    if fsdp and d.world > 1:
        from torch.distributed.fsdp import fully_shard

        for block in getattr(model, "blocks", []):
            fully_shard(block)
        fully_shard(model)
        return model
    if d.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    return model


def grad_sync(model: nn.Module, sync: bool) -> AbstractContextManager:
    """Skip the gradient all-reduce on accumulation micro-steps but the last."""
    if sync:
        return nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        return _ResyncOnExit(model)
    return nullcontext()


class _ResyncOnExit(AbstractContextManager):
    def __init__(self, model: nn.Module):
        self.model = model

    def __exit__(self, *exc: object) -> None:
        self.model.set_requires_gradient_sync(True)


def all_gather_objects(obj: object) -> list[object]:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


# --------------------------------------------------------------------------------------------------------------
# A stop signal that must take effect while this process waits for the others of its job. Python runs a signal
# handler only between bytecodes, so a process blocked in a collective (a gradient all-reduce, a barrier) on a peer
# that was stopped (`kill -STOP`, a frozen node) ignores SIGTERM until the collective times out; a scheduler's grace
# before SIGKILL is shorter than that.
#
# `PeerWatch` learns of a signal at once, from the byte the interpreter's C handler writes to a wakeup file (that
# runs whatever the main thread is doing), and then watches the main thread: if it stays on the same instruction
# without using the CPU longer than the grace, it is waiting for a peer that does not come, and the process exits
# with 128 + the signal number and one line, writing nothing more. What was written before stays valid: checkpoints
# are written whole or not at all (train/checkpoint.py), so the run resumes from its last one. A main thread that
# moves on (the step finishing, the evaluation going on) is given the time; a step that completes stops the run with
# a checkpoint as usual (preemption.StopSignals).

GRACE_FLOOR_S = 10.0  # never less: a backward pass runs in C++ as one call, its frame unchanged throughout
STEP_MULTIPLE = 3.0  # and at least this many typical steps
BUSY_FRACTION = 0.05  # a main thread on the CPU this much of the time computes (a collective waits asleep)
WATCHED = (signal.SIGTERM, signal.SIGINT)


class PeerWatch:
    """Started and stopped from the main thread (`start`, `stop`), around the training loop of a job of several
    processes; `step()` at each step keeps the typical step time that sets the grace."""

    def __init__(self, rank: int, every_s: float = 0.2):
        self.rank, self.every_s = rank, every_s
        self.steps: list[float] = []  # recent intervals between steps, seconds
        self._last_step: float | None = None
        self._main = threading.main_thread().ident
        self._clock = _thread_clock(self._main)
        self._done = threading.Event()
        self._pipe: tuple[int, int] | None = None
        self._previous_fd = -1

    def grace(self) -> float:
        typical = statistics.median(self.steps) if self.steps else 0.0
        return max(GRACE_FLOOR_S, STEP_MULTIPLE * typical)

    def step(self) -> None:
        now = time.monotonic()
        if self._last_step is not None:
            self.steps = [*self.steps[-19:], now - self._last_step]
        self._last_step = now

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():  # set_wakeup_fd: the main thread only
            return
        read, write = os.pipe()
        os.set_blocking(write, False)  # the C handler must never block on a full pipe
        self._pipe = read, write
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read,), name="vitlab-peer-watch", daemon=True).start()

    def stop(self) -> None:
        if self._pipe is None:
            return
        self._done.set()
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._pipe[1])  # the watching thread reads the end of the pipe and closes its side
        self._pipe = None

    def _watch(self, read: int) -> None:
        try:
            while not self._done.is_set():
                data = os.read(read, 16)
                if not data:
                    return
                received = [s for s in data if s in WATCHED]
                if received:
                    self._wait_for_main(received[0])
                    return
        finally:
            os.close(read)

    def _wait_for_main(self, signum: int) -> None:
        """Exit if the main thread stays on one instruction, asleep, past the grace: blocked on a peer."""
        where, cpu, since = self._position(), self._cpu(), time.monotonic()
        while not self._done.wait(self.every_s):
            now_at, now_cpu = self._position(), self._cpu()
            if now_at != where or now_cpu - cpu > BUSY_FRACTION * self.every_s:
                where, since = now_at, time.monotonic()
            cpu = now_cpu
            if time.monotonic() - since > self.grace():
                name = signal.Signals(signum).name
                line = (f"vitlab: {name} while process {self.rank} waits for the other processes of the job (one is "
                        f"stopped or gone; no answer for {self.grace():.0f} s): exiting without a checkpoint; the "
                        "last one resumes the run (--resume)\n")
                sys.stderr.flush()
                os.write(2, line.encode())
                os._exit(128 + signum)

    def _position(self) -> tuple[int, int] | None:
        frame = sys._current_frames().get(self._main)
        return None if frame is None else (id(frame.f_code), frame.f_lasti)

    def _cpu(self) -> float:
        """The main thread's CPU seconds (0 where the platform cannot tell: the position alone decides)."""
        return time.clock_gettime(self._clock) if self._clock is not None else 0.0


def _thread_clock(ident: int | None) -> int | None:
    try:
        return time.pthread_getcpuclockid(ident) if ident is not None else None
    except (AttributeError, OSError):  # not on this platform
        return None


# --------------------------------------------------------------------------------------------------------------
# Stopping a run cleanly. SIGTERM (a preemption) and Ctrl-C ask the trainer to stop after the current step, or at
# once during an evaluation, and to save what resume needs; a second Ctrl-C aborts without saving. The processes of
# a job agree on the step they stop at, even if only some of them received the signal; one waiting for a peer that
# does not come (stopped, gone) exits instead (peerwatch.py).

_RECEIVED: list[str] = []  # every stop signal a trainer of this process caught, in order


def received_stops() -> tuple[str, ...]:
    """The stop signals the trainers of this process caught so far (`vitlab experiment`: a run that completed its
    last step anyway still means the command was asked to stop, and the signal sets its exit code)."""
    return tuple(_RECEIVED)


def stop_exit_code() -> int:
    """The exit code of a command whose run a stop signal ended with a checkpoint: 128 + the signal's number (143
    for SIGTERM, 130 for Ctrl-C), what a shell reports for a process that signal ended. A scheduler then reads a
    preempted run as stopped, never as finished (0), and requeues it; the command prints how to continue. A process
    of a job that stopped because a peer did (no signal of its own) gives 143."""
    last = _RECEIVED[-1] if _RECEIVED else "SIGTERM"
    return 128 + signal.Signals[last].value


class Preempted(RuntimeError):
    """A stop signal ended one run of a learning-rate sweep with a checkpoint, so the sweep stops there; the message
    is one line saying how to continue."""


class StopDuringEvaluation(Exception):
    """A stop was requested while evaluating: the evaluation is abandoned, the finished step is saved."""


class StoppableBatches:
    """A loader's batches until `stop()` says so. It keeps the loader's `dataset`: the evaluation reads the
    split's --strict and the files already reported from it (a bare generator hid both, so --strict never
    failed an evaluation during training and every evaluation warned again)."""

    def __init__(self, loader: Any, stop: Any):
        self.loader, self.stop = loader, stop
        self.dataset = getattr(loader, "dataset", None)

    def __iter__(self) -> Any:
        for batch in self.loader:
            if self.stop():
                raise StopDuringEvaluation
            yield batch


class StopSignals:
    """`with StopSignals(d) as stops:` catches SIGTERM and SIGINT for the block (the previous handlers come back
    after it); `stops.requested` is the first signal's name, False before one arrived."""

    def __init__(self, d: Dist):
        self.d = d
        self.requested: str | bool = False
        self._previous: dict[int, Any] = {}
        self.watch = PeerWatch(d.rank) if d.world > 1 else None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
            self._previous = {s: signal.signal(s, self._request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
            if self.watch is not None:
                self.watch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.watch is not None:
            self.watch.stop()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _request_stop(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt
        self.requested = self.requested or name
        _RECEIVED.append(name)
        log.warning("%s: stopping after this step with a checkpoint (Ctrl-C again: stop without saving)", name)

    def stoppable(self, loader: Any) -> StoppableBatches:
        """The evaluation batches, ending the evaluation when a stop is requested (one process: a job's
        processes would have to agree first, so they finish the evaluation and stop after the step)."""
        return StoppableBatches(loader, lambda: bool(self.requested) and self.d.world == 1)

    def agreed(self) -> bool:
        """Whether the job stops now: every process stops at the same step."""
        if self.watch is not None:
            self.watch.step()  # the typical step time: how long a stop may wait for the others
        flag = torch.tensor([1.0 if self.requested else 0.0])
        if self.d.world > 1:
            flag = all_reduce(flag.to(self.d.device), "max").cpu()
        return flag.item() > 0
