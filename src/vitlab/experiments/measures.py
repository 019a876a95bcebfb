"""What the experiments read from finished runs (few-shot and top-1 accuracy, the transfer metrics) and the
statistics over seeds."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .runner import Record
from .scale import Scale


def fewshot(record: Record, data: str, shots: int) -> float:
    """Mean few-shot accuracy (%) of a pre-training run over the protocol's draws."""
    return 100 * record.evaluation(f"fewshot/{data}")["accuracy"][str(shots)]["mean"]


def top1(record: Record) -> float:
    return 100 * record.val["top1"]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std


def stat(values: list[float]) -> dict[str, Any]:
    mean, std = mean_std(values)
    return {"mean": round(mean, 3), "std": round(std, 3), "n": len(values), "values": [round(v, 3) for v in values]}


def show(s: dict[str, Any]) -> str:
    """'41.2±1.3 %' (± one standard deviation over seeds)."""
    return f"{s['mean']:.1f}±{s['std']:.1f} %"


def metric_names(scale: Scale, finetune_data: tuple[str, ...] = ("digits",)) -> list[tuple[str, str]]:
    """(key, caption) of the transfer metrics reported: few-shot per dataset and shot count, fine-tuned per
    dataset."""
    names = [(f"{d}/{k}-shot", f"{k}-shot {d}") for d in scale.fewshot_data for k in scale.shots]
    return names + [(f"{d}/fine-tuned", f"fine-tuned {d}") for d in finetune_data]


def transfer(scale: Scale, pre: Record, finetuned: Mapping[str, Record]) -> dict[str, float]:
    """Every transfer metric of one pre-training run and its fine-tuning runs, by target dataset."""
    values = {f"{d}/{k}-shot": fewshot(pre, d, k) for d in scale.fewshot_data for k in scale.shots}
    for data, record in finetuned.items():
        values[f"{data}/fine-tuned"] = top1(record)
    return values
