"""A stop signal that must take effect while this process waits for the others of its job. Python runs a signal
handler only between bytecodes, so a process blocked in a collective (a gradient all-reduce, a barrier) on a peer
that was stopped (`kill -STOP`, a frozen node) ignores SIGTERM until the collective times out; a scheduler's grace
before SIGKILL is shorter than that.

`PeerWatch` learns of a signal at once, from the byte the interpreter's C handler writes to a wakeup file (that
runs whatever the main thread is doing), and then watches the main thread: if it stays on the same instruction
without using the CPU longer than the grace, it is waiting for a peer that does not come, and the process exits
with 128 + the signal number and one line, writing nothing more. What was written before stays valid: checkpoints
are written whole or not at all (train/checkpoint.py), so the run resumes from its last one. A main thread that
moves on (the step finishing, the evaluation going on) is given the time; a step that completes stops the run with
a checkpoint as usual (preemption.StopSignals)."""

from __future__ import annotations

import os
import signal
import statistics
import sys
import threading
import time

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
