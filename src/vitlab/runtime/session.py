"""The one inference set-up: weights (or a model) on a device, in the precision it computes in, optionally
compiled, with the autocast of that precision. `vitlab.load(precision=)`, `vitlab eval`, `predict`, `fewshot`,
`analyze`, `bench` and the experiments all open a session, so a precision means the same model everywhere.

    session = open_session("model.safetensors", device="auto", precision="auto")
    with torch.inference_mode(), session.autocast():
        logits = session.model(x)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from vitlab.models.unobserved import skip_unread_tokens
from vitlab.runtime.device import pick_device
from vitlab.runtime.precision import (
    Precision,
    autocast_for,
    computed_precision,
    config_width,
    model_shape,
    prepare_for_inference,
    resolve_precision,
)
from vitlab.weights.load import load

if TYPE_CHECKING:  # the compile rule is read when a session is compiled: training never imports it
    from vitlab.runtime.compiling import CompileChoice


@dataclass(frozen=True)
class InferenceSession:
    """A model ready for inference: on `device`, in eval mode, in the form `precision` computes in fastest, and
    its class names (the weights' own, else the class indices as text; none for a model without a vitlab
    config). `compiled`: whether the model was compiled and why; None while `compile auto` waits for the run's
    image count (`compile_session`)."""

    model: nn.Module
    device: torch.device
    precision: Precision
    class_names: tuple[str, ...]
    compiled: CompileChoice | None = None

    def autocast(self) -> AbstractContextManager:
        """What the model's computations run under: bf16 autocast for bf16, nothing otherwise."""
        return autocast_for(self.device, self.precision)


def open_session(
    weights: nn.Module | str | os.PathLike, *, device: str | torch.device = "auto",
    precision: str | Precision = "auto", compile: bool | str = False, image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None, cast_weights: bool = True, images: int | None = None,
) -> InferenceSession:
    """A session for `weights`: a model, or anything `vitlab.load` reads (a file or folder, a run or checkpoint
    directory, a published name) with `image_size` / `num_classes` as `load` takes them.

    `device`: auto, cpu, cuda, cuda:N (`pick_device`). `precision`: auto, fp32, bf16 or int8, resolved for
    inference on that device and the model's width (`resolve_precision`), or a choice already resolved; the
    session's `precision` is what the prepared model computes in (`computed_precision`: a BiT asked for int8 says
    fp32). `cast_weights`: prepare the model in the precision's fastest form (`prepare_for_inference`: every public
    forward path computes in it, float32 in and out); False keeps the float32 model as it is, computing bf16 only
    under `autocast()`. `compile`: on / True compiles the prepared model with frozen weights
    (`compile_for_inference`; the wrapper still exposes `config` and `class_names`; compiling costs seconds, see
    BENCHMARKS.md), off / False does not, auto decides by `resolve_compile` from `images`, the number the caller
    will process; without it the session stays eager and undecided, for `compile_session` once the count is known.
    """
    dev = pick_device(str(device))  # before the weights are read: a device that is not there is refused at once
    if isinstance(weights, nn.Module):
        if image_size is not None or num_classes is not None:
            raise ValueError("image_size and num_classes apply to weights being loaded, not to a model")
        model = weights
    else:
        model = load(weights, image_size=image_size, num_classes=num_classes)
    model = model.to(dev).eval()
    classes = getattr(getattr(model, "config", None), "num_classes", 0)  # 0 for a model of another library
    names = getattr(model, "class_names", None) or [str(i) for i in range(classes)]
    chosen = precision if isinstance(precision, Precision) else resolve_precision(
        precision, dev, use="infer", **model_shape(model))
    if cast_weights:
        model = prepare_for_inference(model, chosen)
        chosen = computed_precision(model, chosen)
    elif chosen.name == "int8":
        raise ValueError("int8 computes in int8 Linear layers, which replace the float32 weights: it needs "
                         "cast_weights; use auto, fp32 or bf16 here")
    model = skip_unread_tokens(model)
    session = InferenceSession(model, dev, chosen, tuple(names))
    from vitlab.runtime.compiling import compile_request

    if compile_request(compile) == "auto" and images is None:
        return session
    return compile_session(session, compile, images)


def compile_session(session: InferenceSession, requested: bool | str, images: int | None,
                    method: str = "forward") -> InferenceSession:
    """`session` with `requested` (auto, on, off; True / False) applied for a run of `images` images
    (`resolve_compile`), the choice in its `compiled`; a session already decided (compiled or not, or one that
    cannot compile: an ONNX file's) is returned as it is. `method`: the forward path to compile
    (`compile_for_inference`; another than "forward" is compiled in place on the model)."""
    if session.compiled is not None:
        return session
    from vitlab.runtime.compiling import resolve_compile

    choice = resolve_compile(requested, images=images, device=session.device, precision=session.precision.name,
                             width=config_width(getattr(session.model, "config", None)))
    model = session.model
    if choice.on:
        model = compile_for_inference(model, method=method)
    return dataclasses.replace(session, model=model, compiled=choice)


def compile_for_inference(model: nn.Module, say: Callable[[str], None] | None = None,
                          method: str = "forward") -> nn.Module:
    """`torch.compile` of a model whose weights do not change: Inductor's freezing folds the weights into the graph
    as constants (prepacked for oneDNN's matmuls on a CPU, pointwise epilogues fused), the form that measures fastest
    for inference (BENCHMARKS.md "Frozen compiled inference"); plain `torch.compile` keeps the weights as inputs,
    as training needs. Dynamo decides whether the weights become constants while it traces, from the global
    `torch._inductor.config.freezing` with autograd off, so every call of the compiled path runs under
    `frozen_call` (freezing on, grad off, the caller's setting restored after). The shapes are static, so the
    first call of each input shape compiles, and `say` (default: a line on stderr unless `vitlab -q`) is told how
    long it took. The weights must not change afterwards: the graph holds them as constants, some as prepacked
    copies, so a change would reach it only in part.

    `method`: "forward" returns the compiled wrapper (it still exposes the model's attributes); another public
    forward path (`forward_features`, what few-shot features call) is compiled in place on the model, which is
    returned."""
    timer = _CompileTimer(say or _say_on_stderr)
    if method == "forward":
        compiled = torch.compile(model, dynamic=False, options={"freezing": True})
        compiled.forward = _timed(frozen_call(compiled.forward), timer)
        return compiled
    path = torch.compile(getattr(model, method), dynamic=False, options={"freezing": True})
    setattr(model, method, _timed(frozen_call(path), timer))
    return model


def frozen_call(fn: Callable) -> Callable:
    """`fn` called with Inductor's freezing in force and autograd off, the two conditions under which a compiled
    module's weights are traced as constants; the global setting is the caller's again when the call returns."""
    import torch._inductor.config as inductor_config

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with inductor_config.patch(freezing=True), torch.no_grad():
            return fn(*args, **kwargs)

    return call


def _timed(fn: Callable, timer: _CompileTimer) -> Callable:
    @functools.wraps(fn)
    def call(*args, **kwargs):
        timer.start()
        out = fn(*args, **kwargs)
        timer.done(args)
        return out

    return call


class _CompileTimer:
    """Says how long the first call of each input shape took: the compilation, plus one call."""

    def __init__(self, say: Callable[[str], None]):
        self.say, self.seen, self.started = say, set(), None

    def start(self) -> None:
        self.started = time.perf_counter()

    def done(self, args: tuple) -> None:
        key = tuple((tuple(a.shape), a.dtype) for a in args if torch.is_tensor(a))
        if key not in self.seen and self.started is not None:
            self.seen.add(key)
            shapes = ", ".join("x".join(map(str, shape)) for shape, _ in key)
            self.say(f"compiled (Inductor, frozen weights) for input {shapes} in "
                     f"{time.perf_counter() - self.started:.1f} s")


def _say_on_stderr(line: str) -> None:
    from vitlab.progress import quiet

    if not quiet():
        print(line, file=sys.stderr, flush=True)
