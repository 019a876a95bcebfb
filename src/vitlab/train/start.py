"""How a run starts, decided once, from the settings the caller gave and what `out` holds:

1. continue: `resume` and `out` holds a run (its config.json): it goes on from its newest intact checkpoint with its
   recorded settings (vitlab.train.resolve says which flags a resumed run may change).
2. sweep: `resume` and `out` holds an interrupted learning-rate sweep (lr_*/config.json): each of its runs starts
   by these cases in its own folder (vitlab.train.sweep).
3. init: `init` names weights (or a model object): fine-tuning from them, located and read once (resolve.read_init).
4. scratch: a model built from `model` and `model_args`.

`resume auto` with nothing in `out` is case 3 or 4 (a supervisor's first start); a plain `resume` there is refused,
since a typo in `out` must start nothing. Resolution, the command line's checks and `vitlab.fit` ask this one
function; `init` may come from a --config file (`file_values`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vitlab.errors import setting
from vitlab.files.rundir import CONFIG

Case = Literal["continue", "sweep", "init", "scratch"]


@dataclass(frozen=True)
class Start:
    case: Case
    record: Path | None = None  # case 1: the run's config.json

    @property
    def resuming(self) -> bool:
        """A recorded run (case 1) or sweep (case 2) goes on: its settings come from its record."""
        return self.case in ("continue", "sweep")


def decide_start(flags: Mapping[str, Any], file_values: Mapping[str, Any] | None = None) -> Start:
    """The case (module doc) of settings `flags` (TrainConfig fields given; `resume` True or "auto") over a config
    file's `file_values`. ValueError for a `resume` that has nothing to continue."""
    out = flags.get("out")
    if flags.get("resume"):
        if not out:
            raise ValueError(f"{setting('resume')} needs {setting('out')}: the run folder to continue")
        record = Path(out) / CONFIG
        if record.exists():
            return Start("continue", record)  # 1.
        if holds_sweep(out):
            return Start("sweep")  # 2.
        if flags["resume"] != "auto":
            raise ValueError(f"{setting('resume')}: {out} holds no run to continue (no config.json); check the "
                             f"{setting('out')} path, or pass {setting('resume', value='auto')} to start a run there "
                             "when there is none")
    init = flags.get("init", (file_values or {}).get("init"))
    return Start("init") if init else Start("scratch")  # 3., 4.


def holds_sweep(out: str | Path | None) -> bool:
    """Whether `out` holds an interrupted learning-rate sweep (its runs in lr_*/, resumed one by one)."""
    return bool(out) and any(Path(out).glob("lr_*/config.json"))
