"""Runs of an experiment side by side: models this small use one core poorly with two threads (the GEMMs are
too small to split), so two single-thread runs at once finish sooner than the same runs one after the other on
two threads (benchmarks/parallel_runs.py measures it).

The plan stays plain sequential code. Its dry pass lists what is missing; the runs that can start now are those
whose settings are certain (noted before the dry pass had to guess a choice still to be made, such as a learning
rate chosen from runs not yet trained) and whose init run is finished. They are trained and evaluated in worker
processes, each through `Runner.execute` exactly as the sequential pass would, writing the same result.json; then
the dry pass is repeated, and so on until nothing can start. The real pass then finds every run done (it trains
whatever is left in order, and analyses). A run interrupted in a worker resumes on the next invocation as any
other. Several experiments in one command share one `Pool`: a later one's runs fill the cores an earlier one
leaves idle and go on across the hand-over. A stop (SIGTERM, Ctrl-C: experiments.stopping) reaches the workers
through the pool's event: each stops its run at the next step with a checkpoint, or abandons its evaluation, and
starts nothing more; the pool waits for them, so none is left behind.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from reproduction import stopping
from reproduction.runner import Context, Interrupted, Runner, Todo


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def ready(ctx: Context, runner: Runner) -> list[Todo]:
    """The dry pass's runs that can start now: certain, and with their init run finished."""
    return [t for t in ctx.todo.values() if t.certain and (t.spec.init is None or runner.finished(t.spec.init))]


_STOP: Any = None  # in a worker: the pool's event, set when the command is asked to stop


def _start_worker(threads: int, parent: int, stop: Any = None) -> None:
    global _STOP
    _STOP = stop
    stopping.activate()
    # Ctrl-C reaches every process of the terminal's group: an idle worker must not die of it with a traceback;
    # the experiment process decides, and tells the workers through `stop` (a run's trainer stops on it too)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _stop_with_parent(parent, stop)  # the pid from the experiment process itself: it may already be gone by now
    # before the trainer looks: it picks its own thread count unless OMP_NUM_THREADS says one (train/trainer.py)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    # A spawned process spawns its own children too, so the trainer's loader processes would each import torch
    # again and receive the whole dataset pickled (a rendered 64 px fractal set is ~0.9 GB); forked, as in the
    # sequential pass, they share it.
    multiprocessing.set_start_method("fork", force=True)


_IN_RUN = threading.Event()  # set while this worker trains or evaluates a run (`_busy`)


@contextmanager
def _busy() -> Iterator[None]:
    """A run in this worker: a stop signal outside its trainer's loop (which has its own handler) abandons it."""
    own = os.getpid()

    def stop(signum: int, frame: Any) -> None:
        if os.getpid() != own:  # a loader process forked from the worker: the signal's default, as before
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        stopping.stop_run(signum, frame)

    previous = {s: signal.signal(s, stop) for s in stopping.STOP_SIGNALS}
    _IN_RUN.set()
    try:
        with stopping.interruptible():
            yield
    finally:
        _IN_RUN.clear()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stop_with_parent(parent: int, stop: Any = None, every_s: float = 1.0, grace_s: float = 600.0) -> None:
    """A worker whose experiment process died (killed, or Ctrl-C before the pool shut down) would go on
    training for no one and hold its run's lock, so the command run again could not continue it. When the
    parent is gone the worker gets SIGTERM: a run stops at the next step with a checkpoint (the trainer's
    handler), an idle worker exits. A worker whose run has stopped that way exits as soon as the run is over
    (it would otherwise wait, idle, for work from a parent that is gone); one still in its run `grace_s` later
    exits at once. When the pool's `stop` is set, a run in progress gets SIGTERM the same way."""

    def watch() -> None:
        told = False
        while os.getppid() == parent:
            if stop is not None and not told and _IN_RUN.is_set() and stop.is_set():
                told = True  # once: the worker starts no run after a stop (`_execute`)
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(every_s / 10)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _IN_RUN.is_set() and time.monotonic() < deadline:
            time.sleep(every_s / 10)
        os._exit(1)

    threading.Thread(target=watch, name="vitlab-parent-watch", daemon=True).start()


def _execute(root: str, scale: Any, records: Path | None, todo: Todo) -> tuple[str, float]:
    if _STOP is not None and _STOP.is_set():  # queued before the stop: not started
        raise stopping.Stopped(f"{todo.spec.label} not started")
    started = time.perf_counter()
    runner = Runner(Path(root), scale, records=records)
    done: list[str] = []
    with _busy():  # a run to train that is finished already is known from its record: its weights are wanted
        record = runner.execute(todo.spec, todo.evals, done.append, need_weights=todo.train)
    if "trained" in done:
        done[done.index("trained")] = f"trained, val top-1 {100 * record.val['top1']:.1f}%"
    return "; ".join(done), time.perf_counter() - started


class Pool:
    """The worker processes of a whole command (`vitlab experiment A B C`), with the runs in flight on them. A run
    that a later experiment started on a core an earlier one left idle goes on while the earlier one finishes,
    is analysed and written, and the next one begins; a pool per experiment would have to wait for it first,
    one core idle for up to a run's length at each hand-over. Each worker gets an equal share of the cores as
    threads. `executor`: for tests (a thread pool running a stand-in trainer)."""

    def __init__(self, jobs: int, executor: Executor | None = None):
        self.jobs = jobs
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited threads, locks or loaders
        self.stop = context.Event()  # set: every worker stops its run at the next step and starts nothing more
        self.executor = executor or ProcessPoolExecutor(
            jobs, mp_context=context, initializer=_start_worker,
            initargs=(max(1, cpu_count() // jobs), os.getpid(), self.stop))
        self.running: dict[Future, tuple[Todo, Runner]] = {}  # -> what it runs, for which experiment's runner
        # the command's signal handler tells the workers at once, from a thread: the handler may run while this
        # thread holds the event's lock (in `is_set`), which it would then wait for forever
        stopping.on_stop(lambda: threading.Thread(target=self.stop.set, name="vitlab-stop").start())
        if stopping.requested():
            self.stop.set()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Wait for the workers: a run in flight finishes, or, after a stop (a signal, a run that stopped on one),
        stops at its next step with a checkpoint; runs not started yet are dropped."""
        stopped = exc_type is not None and issubclass(exc_type, (Interrupted, stopping.Stopped, KeyboardInterrupt))
        if stopped or stopping.requested():
            self.halt()
        with stopping.shielded():  # a signal now tells the workers (`halt`) and the command stops at its next check
            self.executor.shutdown(wait=True, cancel_futures=self.stop.is_set())

    def halt(self) -> None:
        """Tell every worker to stop (its run at the next step with a checkpoint) and to start nothing more."""
        self.stop.set()

    def in_flight(self) -> set[str]:
        return {t.spec.key for t, _ in self.running.values()}

    def submit(self, runner: Runner, todo: Todo) -> None:
        future = self.executor.submit(_execute, str(runner.runs.parent), runner.scale, runner.records, todo)
        self.running[future] = todo, runner

    def collect(self, progress: Any, runner: Runner | None, futures: Any = None) -> None:
        """Collect finished runs (`futures`; None: every one still running, waited for). The running experiment's
        runs are reported on its `progress`: those started for it (`runner`), and those an earlier experiment
        started for it on an idle core, which its estimate counts; the others are a later experiment's."""
        for future in list(self.running if futures is None else futures):
            todo, started_for = self.running.pop(future)
            what, seconds = future.result()  # a worker's error (Interrupted, a bad setting) stops the experiment
            if progress is not None and (started_for is runner or progress.expects(todo.spec)):
                progress.done(todo.spec, what, seconds)
            elif progress is not None and not progress.quiet:  # a later experiment's: not in this one's estimate
                progress.write(f"[next experiment] {todo.spec.label}: {what} ({seconds:.0f} s)")

    def collect_finished(self, progress: Any, runner: Runner) -> None:
        self.collect(progress, runner, [f for f in self.running if f.done()])


def run_parallel(dry_pass: Callable[[], Context], runner: Runner, jobs: int, progress: Any = None,
                 fillers: Sequence[tuple[Callable[[], Context], Runner]] = (), pool: Pool | None = None) -> int:
    """Train and evaluate, `jobs` at a time, every run the repeated dry passes find ready; returns how many ran.
    `fillers`: the dry passes (and runners) of the experiments to run after this one, whose ready runs take a core
    this one leaves idle (its runs wait for a choice still being made, a learning rate). Returns once this one has
    nothing left to start and no run in flight that it lists. `pool`: the command's (`Pool`), whose runs that
    only later experiments list go on after the return; without one, a pool of this call's own, which waits for
    them."""
    if pool is None:
        with Pool(jobs) as own:
            started = run_parallel(dry_pass, runner, jobs, progress, fillers, own)
            own.collect(progress, runner)  # the fillers' runs still going
            return started
    started = 0
    while True:
        pool.collect_finished(progress, runner)
        dry = dry_pass()
        listed = set(dry.todo)
        candidates = [(t, runner) for t in ready(dry, runner)]
        # a run in flight that this experiment lists (started for a later one that reads it too) is waited for:
        # the real pass that follows must not train it a second time beside its worker; and so is one started for
        # it whose result is written but whose worker has not returned yet (the dry pass no longer lists it)
        mine = any(started_for is runner for _, started_for in pool.running.values())
        finished = not candidates and not pool.in_flight() & listed and not mine
        if len(pool.running) < pool.jobs:
            candidates += [(t, r) for fill, r in fillers for t in ready(fill(), r)]
        for todo, where in candidates:
            if len(pool.running) >= pool.jobs:
                break
            if todo.spec.key not in pool.in_flight():
                pool.submit(where, todo)
                started += 1
        if finished:  # the later experiments' ready runs took the idle cores first: they go on during the analysis
            return started
        wait(pool.running, return_when=FIRST_COMPLETED)  # collected at the top: also a run that ended between
