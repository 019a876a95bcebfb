"""When a ViT computes its last block for the class token alone: an inference session always, a training step while
nothing observes.

`VisionTransformer.forward` computes every token in every block, as timm's does, so that whatever reaches inside
sees timm's tensors. A token classifier's logits read only token 0, and after the last attention no token mixes
with another: the other tokens' outputs of the last block (its residual, `norm2`, MLP) and of the final norm reach
neither the logits nor the loss, so the loss and the gradients are the same with or without them (with dropout,
the same in distribution: the masks are drawn for the tokens computed), and `VisionTransformer.forward_unobserved`
skips them. An inference session's model takes that path for good (`skip_unread_tokens`: nothing is meant to
reach inside a session); the trainer (and `vitlab bench`'s training step) takes it one call at a time, and only
while nothing could see the difference: a forward or backward hook or pre-hook on the last block, any
of its submodules or the final norm, or a global module hook, would see (N, 1, D) where `forward` gives (N, T, D).
What it is worth: BENCHMARKS.md, "The class-token-only last block".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from torch.nn.modules import module as _module

# The hooks through which a module's inputs, outputs or their gradients can be seen, per module and global.
_MODULE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GLOBAL_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                 "_global_backward_hooks")


def skips_unread_tokens(model: nn.Module) -> bool:
    """Whether `model(x)` may run as `forward_unobserved` now: a vitlab ViT pooling its class token, whose
    `forward` is its class's (not replaced on the instance), with no hook on its last block, the block's
    submodules or the final norm, and no global module hook."""
    if not hasattr(type(model), "forward_unobserved") or "forward" in vars(model):
        return False
    if model.config.classifier != "token" or model.unpooled:  # the head reads every token
        return False
    if any(getattr(_module, name, None) for name in _GLOBAL_HOOKS):
        return False
    watched = [*model.blocks[-1:], model.norm]
    return not any(getattr(m, name, None) for part in watched for m in part.modules() for name in _MODULE_HOOKS)


@contextmanager
def unread_tokens_skipped(model: nn.Module) -> Iterator[bool]:
    """Within, `model(x)` (or a wrapper's call of it: DDP, `model.compile()`) computes as `forward_unobserved` where
    `skips_unread_tokens(model)` holds, else as `forward`; yields which. The choice is made on entry, so a hook
    registered within takes effect at the next entry."""
    skip = skips_unread_tokens(model)
    if skip:
        model.forward = model.forward_unobserved
    try:
        yield skip
    finally:
        if skip:
            del model.forward


def skip_unread_tokens(model: nn.Module) -> nn.Module:
    """`model` whose `forward` is `forward_unobserved` for good, where the model has one (in its prepared
    precision, if prepared: the instance's attribute is the precision's wrapper); returned for chaining. For an
    inference session's model only: a hook on its last block or final norm would see the class token alone."""
    if hasattr(type(model), "forward_unobserved"):
        model.forward = model.forward_unobserved
    return model
