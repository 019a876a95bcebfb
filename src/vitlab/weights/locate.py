"""What a weights argument means, as a local file: the one rule every reader shares (`vitlab.load`, `info`,
`convert`, `eval`, `--init`, `vitlab.transforms`).

- a published name (`augreg-i21k:ViT-B/16`, `hf-hub:owner/name`, a timm name): its file in the download cache,
  fetched once (vitlab.hub);
- a run directory: its final model.safetensors, else the one of its newest intact checkpoint;
- a learning-rate sweep's folder (`finetune --lr-sweep`): the run it chose (its refit, if it made one), as a run;
- a checkpoint directory: its model.safetensors, once its manifest checks (as resuming from it would), or the
  folder itself for a sharded one (its shards, read by weights.sharded);
- anything else (a file, a timm or HF folder): itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vitlab.errors import WeightsError
from vitlab.files.reading import check_regular
from vitlab.files.rundir import (
    WEIGHTS,
    is_checkpoint_dir,
    is_run_dir,
    is_sharded_checkpoint,
    is_sweep_dir,
    latest_valid_checkpoint,
    sweep_choice,
    verify_checkpoint,
)
from vitlab.hub import Entry, resolve

log = logging.getLogger("vitlab.weights")
_ANNOUNCED: set[str] = set()


def locate(name_or_path: str | Path, pretrained: str | bool | None = None) -> Path:
    """The local weights file (or timm / HF folder) that `name_or_path` means, verified; see the module doc."""
    return locate_published(name_or_path, pretrained)[1]


def locate_published(name_or_path: str | Path, pretrained: str | bool | None = None) -> tuple[Entry | None, Path]:
    """`locate`, with the catalogue entry when a published checkpoint was asked for (None otherwise)."""
    entry, path = resolve(name_or_path, pretrained)
    return entry, weights_path(path)


def weights_path(path: str | Path) -> Path:
    """The file or folder holding the weights a local `path` means: a run or checkpoint directory its
    model.safetensors (a checkpoint's verified against its manifest), any other path as it is."""
    path = Path(path)
    if is_checkpoint_dir(path):
        problem = verify_checkpoint(path)
        if problem is not None:
            raise WeightsError(path, f"damaged checkpoint ({problem})", "pass the run directory or another checkpoint")
        return path if is_sharded_checkpoint(path) else path / WEIGHTS
    if is_sweep_dir(path):
        chosen, why = sweep_choice(path)
        if chosen is None:
            raise WeightsError(path, why)
        if str(path) not in _ANNOUNCED:  # once: a load asks for the weights' path several times
            _ANNOUNCED.add(str(path))
            log.info("%s: a learning-rate sweep; reading the run it chose, %s", path, chosen)
        path = chosen
    if not is_run_dir(path):
        return path
    check_regular(path / WEIGHTS)  # a FIFO or folder in its place is named, not passed over for a checkpoint
    if (path / WEIGHTS).is_file():  # written when the run completed
        return path / WEIGHTS
    ckpt = latest_valid_checkpoint(path)
    if ckpt is None:
        raise WeightsError(path, "run directory has no final model.safetensors and no intact checkpoint",
                           "wait for its first checkpoint, or resume the run")  # fmt: skip
    return ckpt if is_sharded_checkpoint(ckpt) else ckpt / WEIGHTS
