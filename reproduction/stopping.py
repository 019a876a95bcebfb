"""Stopping `vitlab experiment` on SIGTERM (a preemption) or Ctrl-C, wherever its runs are: a run training in this
process stops at its next step with a checkpoint (the trainer's own handler, train/distributed.py); runs in worker
processes are told to do the same (experiments.parallel); an evaluation is abandoned (its result is written only
when complete); nothing new starts. The command then exits with 128 + the signal's number (130 for Ctrl-C, 143 for
SIGTERM), and running it again continues every stopped run from its checkpoint. Ctrl-C a second time stops without
waiting for the workers (they still stop at their next step with a checkpoint, on their own).

The state is per process: the experiment's process sets it from its handler (`CommandStop`), a worker from its
own (`stop_run`) and from the trainer's (`train.distributed.received_stops`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from vitlab.train import received_stops

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """The command was asked to stop (SIGTERM, Ctrl-C); running it again continues where it stopped."""

    @classmethod
    def raise_if(cls, name: str | None, what: str = "the experiment") -> None:
        if name is not None:
            raise cls(f"{name}: {what} not started")


class _State:
    active: ClassVar[bool] = False  # inside a command (CommandStop) or a worker of one; outside, nothing applies
    requested: ClassVar[list[str]] = []  # the signals this process's handlers received
    baseline: ClassVar[int] = 0  # how many stops the trainers of this process had caught when the command began
    interruptible: ClassVar[int] = 0  # > 0: the handler raises `Stopped` (an experiment or a worker's run)
    shielded: ClassVar[int] = 0  # > 0: it does not after all (the pool is waiting for its workers to stop)
    listeners: ClassVar[list[Callable[[], None]]] = []  # called on the first stop (a pool tells its workers)


def activate() -> None:
    """Begin a command (or a worker of one): earlier stops of this process do not count."""
    _State.active, _State.requested, _State.baseline = True, [], len(received_stops())
    _State.listeners = []


def deactivate() -> None:
    _State.active, _State.listeners = False, []


def requested() -> str | None:
    """The first stop signal of the command, whoever caught it; None without one (or outside a command)."""
    if not _State.active:
        return None
    caught = [*_State.requested, *received_stops()[_State.baseline:]]
    return caught[0] if caught else None


def request(name: str) -> bool:
    """Record a stop signal and tell the listeners; True if it is the command's first."""
    first = requested() is None
    _State.requested.append(name)
    if first:
        for listener in list(_State.listeners):
            listener()
    return first


def raise_if_stopped(what: str) -> None:
    """Called before a run trains or an evaluation starts: after a stop, nothing new starts."""
    Stopped.raise_if(requested(), what)


def exit_code(name: str | None) -> int:
    """128 + the stop signal's number (130 Ctrl-C, 143 SIGTERM); 130 when a run was stopped by a signal that
    only its worker received (None)."""
    return 128 + (signal.Signals[name].value if name else signal.SIGINT)


def on_stop(listener: Callable[[], None]) -> None:
    _State.listeners.append(listener)


@contextmanager
def interruptible() -> Iterator[None]:
    """A stop signal here raises `Stopped` (unless `shielded` inside): an experiment's plan, a worker's run. Outside
    (writing the report between two experiments), it is only noted, and the command stops at its next check."""
    _State.interruptible += 1
    try:
        yield
    finally:
        _State.interruptible -= 1


@contextmanager
def shielded() -> Iterator[None]:
    """A stop signal here is recorded (and the listeners told) but raises nothing: the caller is already waiting
    for the workers to stop, and must go on waiting."""
    _State.shielded += 1
    try:
        yield
    finally:
        _State.shielded -= 1


def stop_run(signum: int, frame: Any) -> None:
    """The handler of a stop signal outside a trainer's loop: the first raises `Stopped` (an evaluation is abandoned,
    the wait for the workers ends); later ones only record it, except a second Ctrl-C, which stops at once."""
    name = signal.Signals(signum).name
    if signum == signal.SIGINT and requested() is not None:
        raise KeyboardInterrupt  # Ctrl-C again (while waiting for the workers, say): stop at once
    if request(name) and _State.interruptible and not _State.shielded:
        raise Stopped(f"{name} received")


class CommandStop:
    """`with CommandStop():` around a command: SIGTERM and Ctrl-C stop it as the module says."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._signal: str | None = None

    def __enter__(self) -> CommandStop:
        activate()
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, stop_run) for s in STOP_SIGNALS}
        return self

    @property
    def signal(self) -> str | None:
        """The command's stop signal so far (after the block: the one it had)."""
        return requested() if _State.active else self._signal

    def __exit__(self, *exc: object) -> None:
        self._signal = requested()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        deactivate()
