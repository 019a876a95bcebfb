"""The checks a model's pixel input passes before its first layer, so that an ordinary mistake (a uint8 image, a
missing batch dimension, channels last, a float64 array) is one line naming the fix instead of a convolution's
message about bias types or group sizes.

Only attributes are read (type, dim, one size, dtype): no pass over the values, nothing that breaks graph capture.
Under torch.export / ONNX tracing the channel count is static, so the comparisons add no guards on dynamic sizes.
Under torch.fx symbolic tracing the input is a Proxy whose sizes are unknown: the model modules register these
checks (and their other size-dependent helpers) as fx leaves with `torch.fx.wrap`, so a trace records each call as
one graph node that runs, with its messages, on the real tensor.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F


def check_pixels(x: object, in_chans: int, weight: torch.Tensor | None = None) -> None:
    """TypeError / ValueError for a `model(x)` input that is not a floating-point (N, in_chans, H, W) tensor of the
    model's dtype (another dtype is fine under autocast, which casts it). `weight`: the first layer's weight."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"model input must be a torch.Tensor of shape (N, {in_chans}, H, W), got "
                        f"{type(x).__name__}; convert images with vitlab.transforms(model) and stack them")
    if x.dim() != 4:
        shape = tuple(x.shape)
        fix = "add the batch dimension with x[None]" if x.dim() == 3 else "pass a batch of shape (N, C, H, W)"
        raise ValueError(f"model input must be 4-D (N, {in_chans}, H, W), got shape {shape}; {fix}")
    if x.shape[1] != in_chans:
        raise ValueError(f"model input must have {in_chans} channels in dimension 1, got shape {tuple(x.shape)}; "
                         + _channel_fix(x, in_chans))
    if not x.is_floating_point():
        raise TypeError(f"model input must be floating point, got {x.dtype}; pre-process images with "
                        "vitlab.transforms(model), or scale with x.float() / 255 and normalise with the model's "
                        "config.mean and config.std")
    if weight is not None and x.dtype != weight.dtype and not _autocast(x):
        raise TypeError(f"model input is {x.dtype} but the model's weights are {weight.dtype}; convert the input "
                        f"with x.to({weight.dtype}) (or the model with model.to({x.dtype}))")


def check_image_size(x: torch.Tensor, image_size: tuple[int, int], stride: int, dynamic: bool) -> None:
    """ValueError for pixels of another height or width than the model's native `image_size`, unless `dynamic`
    (timm's `dynamic_img_size`: any size, the position embedding resampled per call). timm refuses them too: a
    forgotten resize or crop would otherwise run at another resolution and give plausible, worse outputs."""
    if dynamic or tuple(x.shape[-2:]) == tuple(image_size):
        return
    (h, w), (mh, mw) = x.shape[-2:], image_size
    raise ValueError(f"model input is {h}×{w} pixels but this model takes {mh}×{mw}; resize and crop with "
                     f"vitlab.transforms(model), or set model.dynamic_img_size = True (create_model(..., "
                     f"dynamic_img_size=True)) to take any multiple of {stride}, the position embedding resampled")


def pad_to_stride(x: torch.Tensor, stride: int, pad: bool) -> torch.Tensor:
    """x zero-padded right and bottom to a multiple of `stride` (timm's dynamic_img_pad) if `pad`; else x, or
    ValueError when its height or width is not a multiple."""
    if not (x.shape[-2] % stride or x.shape[-1] % stride):
        return x
    if pad:
        return F.pad(x, (0, -x.shape[-1] % stride, 0, -x.shape[-2] % stride))
    raise ValueError(f"input size {tuple(x.shape[-2:])} is not divisible by the effective patch size {stride}; "
                     f"resize or crop to a multiple of {stride}")


def is_symbolic(value: object) -> bool:
    """True for a torch.fx Proxy, the stand-in for a tensor or size during symbolic tracing: a cache keyed on
    values cannot be read or filled then."""
    return isinstance(value, torch.fx.Proxy)


def _channel_fix(x: torch.Tensor, in_chans: int) -> str:
    if x.shape[-1] == in_chans:
        return "it looks channels-last (N, H, W, C): use x.permute(0, 3, 1, 2)"
    if x.shape[1] == 1 and in_chans == 3:
        return "a grey image: repeat it with x.expand(-1, 3, -1, -1)"
    if x.shape[1] == 4 and in_chans == 3:
        return "drop the alpha channel with x[:, :3]"
    return f"convert the images to {in_chans} channels"


def _autocast(x: torch.Tensor) -> bool:
    device = x.device.type if x.device.type in ("cpu", "cuda", "xpu", "mps") else "cpu"
    try:
        return torch.is_autocast_enabled(device)
    except TypeError:  # torch < 2.4 takes no argument and answers for CUDA
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


def check_tokens(tokens: object, width: int) -> None:
    """ValueError for a `forward_head` input that is not (N, T, width) tokens (what forward_features returns)."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 3 or tokens.shape[-1] != width:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"forward_head takes the tokens forward_features returns, (N, T, {width}), got {shape}; "
                         "call model.forward_head(model.forward_features(x))")
