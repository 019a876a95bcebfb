"""The weights of a sharded training checkpoint (a step folder of an FSDP run: files/rundir's layout), read into one
state dict in this process: torch.distributed.checkpoint reads every shard's part of each tensor, so `vitlab.load`,
`convert` and `info` take such a folder as they take a weights file."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from vitlab.errors import WeightsError
from vitlab.files.reading import check_regular
from vitlab.files.rundir import SHARDS, STATE
from vitlab.models.config import config_from_dict
from vitlab.models.registry import build_model
from vitlab.weights.record import WeightsRecord

ADVICE = "pass the run directory or another checkpoint"


def read_sharded_checkpoint(path: str | Path) -> WeightsRecord:
    """Config, class names and evaluation settings from the checkpoint's state.pt (never executed: weights_only),
    the tensors from its shards, into a model of that config built on the CPU."""
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_regular(path / STATE)
            state = torch.load(path / STATE, map_location="cpu", weights_only=True)
        config = config_from_dict(state["model_config"])
        meta = dict(state.get("weights_meta") or {})
    except (OSError, pickle.UnpicklingError, KeyError, TypeError, ValueError, RuntimeError) as err:
        raise WeightsError(path, f"{STATE} describes no vitlab model ({type(err).__name__})", ADVICE) from None
    weights = build_model(config).state_dict()
    try:
        with warnings.catch_warnings():  # that it reads in one process, which is the intent
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({"weights": weights}, checkpoint_id=str(path / SHARDS), no_dist=True)
    except Exception as err:  # torch.distributed.checkpoint's CheckpointException gathers the readers' errors
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise WeightsError(path, f"its shards do not hold the model {STATE} describes ({first})", ADVICE) from None
    return WeightsRecord(config, weights, source="vitlab", meta=meta)
