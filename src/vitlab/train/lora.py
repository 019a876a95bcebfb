"""LoRA fine-tuning through Hugging Face's `peft` (`--lora RANK`; `pip install 'vitlab[lora]'`).

peft's `get_peft_model` puts a `lora.Linear` in place of each targeted `nn.Linear` of the blocks: the layer's
weight W0 stays frozen and the output gains (α / r)·B·A·x, with A (r × in, Kaiming-uniform) and B (out × r, zero)
trained, so the fine-tune starts from the initial model's outputs. The new zero-initialised head trains in full
(as peft's image-classification guide trains the classifier with `modules_to_save`); nothing else does.

Saved weights (model.safetensors, best.safetensors, a checkpoint's model.safetensors) are peft's
`merge_and_unload()` of a copy of the model: plain weights W0 + (α / r)·B·A under the ViT's own names, which
`vitlab.load`, every exporter and `vitlab eval` read as an ordinary vitlab model. A checkpoint also keeps the
adapters and the frozen W0 of the targeted layers (in state.pt, `tuning`), because the merged sum cannot be split
back bit for bit: a resumed run continues from exactly the tensors it stopped with.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
from torch import nn

# --lora-targets name -> the Linear layer of every block it adapts
LORA_TARGETS = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ValueError("--lora needs the peft package: pip install 'vitlab[lora]'") from None
    return peft


def target_pattern(targets: tuple[str, ...]) -> str:
    """peft's `target_modules` as one regular expression (peft matches it against the whole module name): the
    blocks' layers only, never the patch embedding's `proj` convolution or the head."""
    return r"blocks\.\d+\.(" + "|".join(re.escape(LORA_TARGETS[t]) for t in targets) + ")"


def _is_lora_key(key: str) -> bool:
    """A state-dict entry that exists only in the wrapped model: an adapter or a targeted layer's frozen W0."""
    return ".lora_" in key or ".base_layer." in key


class LoraAdapters:
    """LoRA adapters injected into `model` in place (it stays the vitlab ViT the loop trains and evaluates)."""

    def __init__(self, model: nn.Module, rank: int, alpha: float, targets: tuple[str, ...]):
        peft = _peft()
        if not isinstance(getattr(model, "blocks", None), nn.ModuleList):
            raise ValueError(f"--lora adapts a ViT's blocks, and {model.config.name or 'this model'} has none (a CNN); "
                             "fine-tune it in full or with --freeze backbone")
        config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_pattern(targets), lora_dropout=0.0,
                                 bias="none")
        self.rank, self.alpha, self.targets, self.version = rank, alpha, targets, peft.__version__
        self.peft_model = peft.get_peft_model(model, config)  # injects into `model`; the rest is frozen
        for module in (model.pre_logits, model.head):
            if module is not None:
                module.requires_grad_(True)

    def merged_weights(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`state` (the wrapped model's, e.g. its EMA weights) merged by peft into plain vitlab weights."""
        wrapped = copy.deepcopy(self.peft_model).to("cpu")
        wrapped.get_base_model().load_state_dict(state)
        with torch.no_grad():
            merged = wrapped.merge_and_unload()
        return {k: v.detach() for k, v in merged.state_dict().items()}

    def resume_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps besides the merged weights: the adapters and the targeted layers' W0."""
        return {k: v for k, v in state.items() if _is_lora_key(k)}

    def restore(self, model: nn.Module, saved: dict[str, torch.Tensor]) -> None:
        """Put a checkpoint's adapters and W0 back (the model was rebuilt from its merged weights)."""
        expected = {k for k in model.state_dict() if _is_lora_key(k)}
        if set(saved) != expected:
            missing, extra = sorted(expected - set(saved)), sorted(set(saved) - expected)
            raise ValueError(f"its LoRA adapters do not fit --lora {self.rank} on {','.join(self.targets)} "
                             f"(missing {missing[:2]}, unexpected {extra[:2]})")
        model.load_state_dict(saved, strict=False)

    def describe(self) -> str:
        return (f"LoRA rank {self.rank}, α {self.alpha:g} (scale {self.alpha / self.rank:g}) on "
                f"{', '.join(self.targets)} of every block via peft {self.version}, and the head; the adapters are "
                "merged into the saved weights")
