"""The memory plan's activations are the bytes autograd keeps for the backward, as torch's saved-tensor hooks count
them (float32 exactly; bf16 autocast per image, the cached weight casts apart), with and without activation
checkpointing; its states follow the parallelism (DDP whole, FSDP2 a 1/world share)."""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab.models import model_config
from vitlab.models.flops import count_parameters
from vitlab.models.memory import activation_bytes, memory_plan

SMALL = [("ViT-Ti/16", 32, {}), ("ViT-S/16", 48, {"depth": 2}), ("ViT-B/16", 32, {"depth": 1})]


def kept_bytes(model: torch.nn.Module, batch: int, size: int, autocast: bool = False) -> int:
    """Bytes of the distinct storages autograd keeps after one training forward, parameters left out."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(batch, 3, size, size)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(x).float().sum()  # a sum keeps nothing of its own
    loss.backward()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in weights)


def built(name: str, size: int, overrides: dict) -> tuple[torch.nn.Module, object]:
    torch.manual_seed(0)
    model = vitlab.create_model(name, image_size=size, num_classes=10, **overrides).train()
    return model, model.config


@pytest.mark.parametrize(("name", "size", "overrides"), SMALL)
def test_float32_activations_are_the_bytes_autograd_keeps(name, size, overrides):
    model, config = built(name, size, overrides)
    assert kept_bytes(model, 2, size) == 2 * activation_bytes(config)
    # checkpointed, the forward keeps the block inputs; the plan adds the one block the backward recomputes
    block = activation_bytes(config.replace(depth=2)) - activation_bytes(config.replace(depth=1))
    model.set_grad_checkpointing()
    assert kept_bytes(model, 2, size) == 2 * (activation_bytes(config, checkpointed=True) - block)


@pytest.mark.parametrize(("name", "size", "overrides"), SMALL)
def test_bf16_autocast_activations_per_image(name, size, overrides):
    model, config = built(name, size, overrides)
    per_image = (kept_bytes(model, 4, size, autocast=True) - kept_bytes(model, 2, size, autocast=True)) // 2
    assert per_image == activation_bytes(config, "bf16")


def test_states_per_process_follow_the_parallelism():
    config = model_config("ViT-B/16")
    p = count_parameters(config)
    one = memory_plan(config, 1, "ddp", optimizer="adam")
    assert (one.parameters, one.gradients, one.optimizer, one.parallel) == (4 * p, 4 * p, 8 * p, 0)
    ddp = memory_plan(config, 8, "ddp", optimizer="sgd")
    assert (ddp.optimizer, ddp.parallel, ddp.checkpoint) == (4 * p, 4 * p, 8 * p)  # buckets; rank 0 writes all
    fsdp = memory_plan(config, 8, "fsdp", optimizer="adam", ema=True)
    assert (fsdp.parameters, fsdp.optimizer, fsdp.ema) == (4 * p // 8, 8 * p // 8, 4 * p // 8)
    assert fsdp.checkpoint == 16 * p // 8 and fsdp.save_extra == 0
    assert memory_plan(config, 8, "fsdp", async_save=True).save_extra == 12 * p // 8
    assert memory_plan(config, precision="bf16").autocast == 2 * p
    with pytest.raises(ValueError, match="plain ViTs"):
        memory_plan(model_config("BiT-R50x1"))


def test_the_command_prints_the_plan_and_refuses_what_it_cannot_count(capsys):
    import json

    from vitlab.cli import main

    assert main(["models", "ViT-B/16", "--memory", "--world", "8", "64", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["world"], r["strategy"]) for r in rows] == [(8, "ddp"), (8, "fsdp"), (64, "ddp"), (64, "fsdp")]
    plan = memory_plan(model_config("ViT-B/16", num_classes=1000), 64, "fsdp", "bf16", "adam")
    assert rows[3]["total"] == plan.total(4096 // 64)
    assert main(["models", "BiT-R50x1", "--memory"]) != 0
    assert "plain ViTs" in capsys.readouterr().err
