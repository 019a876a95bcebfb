"""Compiled inference freezes the weights into the graph (Inductor's freezing: the weights traced as constants,
not graph inputs) and says how long each compilation took; training's compile keeps the plain form. The default
suite traces with dynamo's eager backend (seconds); the `-m slow` tests compile with Inductor, as users get it."""

from __future__ import annotations

import re

import pytest
import torch

import vitlab
from tests.eval.test_inference import random_vit  # a 10-class ViT with random weights
from vitlab.bench import BenchSettings, run_benchmark
from vitlab.runtime.session import compile_for_inference, open_session

CPU = torch.device("cpu")
ONE_ARGUMENT = r"^ +\w+, = args$"  # how Inductor's generated `call` unpacks a single input


def test_the_session_compiles_with_frozen_weights_and_static_shapes(compiles):
    open_session(random_vit(16), device=CPU, precision="fp32", compile=True)
    assert compiles == [{"dynamic": False, "options": {"freezing": True}}]


@pytest.fixture
def graph_inputs(monkeypatch) -> list[int]:
    """The number of inputs (placeholders) of every graph dynamo hands to the compiler, traced with a backend that
    only counts them; a weight that is not a constant of the graph is one of these inputs. Dynamo's caches are
    cleared first: earlier tests' compilations of the same code would count against its recompile limit."""
    torch._dynamo.reset()
    counts: list[int] = []
    real = torch.compile

    def count(gm, example_inputs):
        counts.append(sum(node.op == "placeholder" for node in gm.graph.nodes))
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: real(model, backend=count, dynamic=False))
    return counts


@pytest.mark.parametrize("method", ["forward", "forward_features", "forward_inspect"])
@pytest.mark.parametrize("grad", ["inference_mode", "no_grad", "grad enabled"])
def test_compiled_paths_trace_the_weights_as_constants(graph_inputs, method, grad):
    """Every path the inference verbs compile is traced with its weights as constants of the graph (its only
    input is the images), whatever autograd mode the caller is in; the caller's global freezing setting is the same
    after each call."""
    model = random_vit(16)
    compiled = compile_for_inference(model, say=lambda line: None, method=method)
    path = compiled if method == "forward" else getattr(compiled, method)
    mode = {"inference_mode": torch.inference_mode(), "no_grad": torch.no_grad()}.get(grad)
    assert torch._inductor.config.freezing is False
    with mode or torch.enable_grad():
        for n in (2, 3):
            path(torch.randn(n, 3, 16, 16))
            assert torch._inductor.config.freezing is False
    assert len(list(model.parameters())) > 1 and graph_inputs == [1, 1]


def test_the_callers_own_freezing_setting_is_kept(graph_inputs):
    """A caller that turned freezing on keeps it on after a compiled call (the setting is restored, not reset)."""
    import torch._inductor.config as inductor_config

    compiled = compile_for_inference(random_vit(16), say=lambda line: None)
    with inductor_config.patch(freezing=True):
        compiled(torch.randn(2, 3, 16, 16))
        assert inductor_config.freezing is True
    assert inductor_config.freezing is False


def test_each_input_shape_compiles_once_and_is_said(compiles):
    said: list[str] = []
    model = compile_for_inference(random_vit(16), say=said.append)
    assert said == []  # nothing compiles before the first call
    with torch.inference_mode():
        for n in (4, 4, 2, 4):
            model(torch.randn(n, 3, 16, 16))
    assert [line.split(" in ")[0] for line in said] == [
        "compiled (Inductor, frozen weights) for input 4x3x16x16",
        "compiled (Inductor, frozen weights) for input 2x3x16x16"]
    assert all(line.endswith(" s") for line in said)


def test_bench_compiles_inference_frozen_and_training_plain(compiles):
    run_benchmark(BenchSettings(model="ViT-Ti/16", batch_size=2, image_size=32, repeats=1, warmup=1, min_time=0.0,
                                gemm_size=64, threads=1, compile=True, latency=False))
    assert compiles == [{"dynamic": False, "options": {"freezing": True}}, {}]


@pytest.mark.slow
@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-5), ("bf16", 2e-2)])
def test_frozen_inductor_code_takes_only_the_images_and_matches_eager(precision, tolerance):
    """Inductor's generated code for the session's compiled model takes the images as its one argument (the
    weights are constants, folded and prepacked), and its logits are within 1e-5 of eager in float32 (bf16: within
    bf16's rounding of the same prepared model), at two batch sizes."""
    from torch._inductor.utils import run_and_get_code

    eager = open_session(random_vit(16), device=CPU, precision=precision).model
    compiled = open_session(random_vit(16), device=CPU, precision=precision, compile=True).model
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for n in (4, 3):
            x = torch.randn(n, 3, 16, 16, generator=g)
            got, code = run_and_get_code(compiled, x)
            assert len(code) == 1 and re.findall(ONE_ARGUMENT, code[0], flags=re.MULTILINE), code[0][:2000]
            reference = eager(x)
            assert ((got - reference).abs().max() / reference.abs().max()).item() < tolerance


def test_fewshot_compile_freezes_the_features_path_and_gives_eager_accuracy(compiles, tmp_path, capsys):
    """`vitlab fewshot --compile` compiles `forward_features`, the path its features take, with frozen weights and
    draws the same table as eager."""
    import json

    from vitlab.cli import main

    vitlab.save(random_vit(16), tmp_path / "m.safetensors")
    tables = []
    for extra in ([], ["--compile"]):
        out = tmp_path / f"fs{len(extra)}.json"
        assert main(["fewshot", "--weights", str(tmp_path / "m.safetensors"), "--data", "digits", "--shots", "1,5",
                     "--seeds", "2", "--json", str(out), "--device", "cpu", "--precision", "fp32", *extra]) == 0
        tables.append(json.loads(out.read_text())["accuracy"])
    assert compiles == [{"dynamic": False, "options": {"freezing": True}}]
    assert "compiled (Inductor, frozen weights) for input " in capsys.readouterr().err
    assert tables[1] == tables[0]


@pytest.mark.slow
def test_frozen_inductor_features_match_eager():
    """The few-shot features' path compiled in place with Inductor and frozen weights: within 1e-5 of eager."""
    from torch._inductor.utils import run_and_get_code

    eager, compiled = random_vit(16), compile_for_inference(random_vit(16), say=lambda line: None,
                                                          method="forward_features")
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        reference = eager.forward_features(x)
        got, code = run_and_get_code(compiled.forward_features, x)
    assert ((got - reference).abs().max() / reference.abs().max()).item() < 1e-5
    assert len(code) == 1 and re.findall(ONE_ARGUMENT, code[0], flags=re.MULTILINE), code[0][:2000]
