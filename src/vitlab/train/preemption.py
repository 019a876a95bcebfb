"""Stopping a run cleanly. SIGTERM (a preemption) and Ctrl-C ask the trainer to stop after the current step, or at
once during an evaluation, and to save what resume needs; a second Ctrl-C aborts without saving. The processes of
a job agree on the step they stop at, even if only some of them received the signal; one waiting for a peer that
does not come (stopped, gone) exits instead (peerwatch.py)."""

from __future__ import annotations

import signal
import threading
from typing import Any

import torch

from vitlab.runtime.device import all_reduce
from vitlab.train.distributed import Dist
from vitlab.train.peerwatch import PeerWatch
from vitlab.train.runlog import log

_RECEIVED: list[str] = []  # every stop signal a trainer of this process caught, in order


def received_stops() -> tuple[str, ...]:
    """The stop signals the trainers of this process caught so far (`vitlab experiment`: a run that completed its
    last step anyway still means the command was asked to stop, and the signal sets its exit code)."""
    return tuple(_RECEIVED)


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
