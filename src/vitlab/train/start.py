"""How a run starts, decided once, from the settings the caller gave and what `out` holds:

1. continue: `resume` and `out` holds a run (its config.json): it goes on from its newest intact checkpoint with its
   recorded settings (vitlab.train.resolution says which flags a resumed run may change); a run stopped before its
   first checkpoint starts over from its recorded `init`, or from scratch.
2. sweep: `resume` and `out` holds an interrupted learning-rate sweep (lr_*/config.json): each of its runs starts
   by these cases in its own folder (vitlab.train.sweep).
3. init: weights named by `init` (the flag, else the --config file's, else the recipe's) or a model object:
   fine-tuning from them, read once by the resolution (`InitWeights`), which every model of the run is built from.
4. scratch: a model built from `model` and `model_args`.

`resume auto` with nothing in `out` is case 3 or 4 (a supervisor's first start); a plain `resume` there is refused,
since a typo in `out` must start nothing. A new run (2 to 4) reads its --config file here, once, and names its
recipe; the resolution takes both from the `Start`, so what the start was decided from is what the run resolves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vitlab.errors import setting
from vitlab.files.rundir import CONFIG
from vitlab.train.config import read_config_file
from vitlab.train.recipes import DEFAULT_RECIPE, RECIPES

Case = Literal["continue", "sweep", "init", "scratch"]


@dataclass(frozen=True)
class Start:
    case: Case
    record: Path | None = None  # case 1: the run's config.json
    recipe: str | None = None  # cases 2-4: the recipe's name (the caller's, else the config file's, else the verb's)
    config_file: str | None = None  # cases 2-4: the --config file, and its settings (read once)
    file_values: Mapping[str, Any] = field(default_factory=dict)
    init: Any = None  # case 3 (and a sweep from weights): what `init` names

    @property
    def resuming(self) -> bool:
        """A recorded run (case 1) or sweep (case 2) goes on: its settings come from its record."""
        return self.case in ("continue", "sweep")


def decide_start(flags: Mapping[str, Any], *, config_file: str | None = None, recipe: str | None = None,
                 verb: str = "train") -> Start:
    """The case (module doc) of settings `flags` (TrainConfig fields given; `resume` True or "auto"), with the
    --config file `config_file` and the `recipe` asked for (None: the file's, else the verb's default). ValueError for
    a `resume` that has nothing to continue, an unknown recipe, or a config file that is not a file of settings."""
    out = flags.get("out")
    sweep = False
    if flags.get("resume"):
        if not out:
            raise ValueError(f"{setting('resume')} needs {setting('out')}: the run folder to continue")
        record = Path(out) / CONFIG
        if record.exists():
            return Start("continue", record)  # 1.
        sweep = holds_sweep(out)
        if not sweep and flags["resume"] != "auto":
            raise ValueError(f"{setting('resume')}: {out} holds no run to continue (no config.json); check the "
                             f"{setting('out')} path, or pass {setting('resume', value='auto')} to start a run there "
                             "when there is none")
    file_values = read_config_file(config_file) if config_file else {}
    name = recipe or file_values.get("recipe") or DEFAULT_RECIPE.get(verb, "demo")
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}")
    init = flags.get("init", file_values.get("init", RECIPES[name].get("init")))
    case: Case = "sweep" if sweep else "init" if init else "scratch"  # 2., 3., 4.
    return Start(case, recipe=name, config_file=config_file, file_values=file_values, init=init)


def holds_sweep(out: str | Path | None) -> bool:
    """Whether `out` holds an interrupted learning-rate sweep (its runs in lr_*/, resumed one by one)."""
    return bool(out) and any(Path(out).glob("lr_*/config.json"))
