"""Compiled inference freezes the weights into the graph (Inductor's freezing) and says how long each compilation
took; training's compile keeps the plain form. The default suite traces with dynamo's eager backend (seconds); the
`-m slow` tests compile with Inductor, as users get it."""

from __future__ import annotations

import pytest
import torch

import vitlab
from tests.eval.test_inference import random_vit  # a 10-class ViT with random weights
from vitlab.bench import BenchSettings, run_benchmark
from vitlab.runtime.session import compile_for_inference, open_session

CPU = torch.device("cpu")


def test_the_session_compiles_with_frozen_weights_and_static_shapes(compiles):
    open_session(random_vit(16), device=CPU, precision="fp32", compile=True)
    assert compiles == [{"dynamic": False, "options": {"freezing": True}}]


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
def test_frozen_inductor_logits_match_eager(precision, tolerance, monkeypatch):
    """Inductor with frozen weights (its freezing pass runs): logits within 1e-5 of eager in float32 (bf16: within
    bf16's rounding of the same prepared model), at two batch sizes."""
    import torch._inductor.compile_fx as compile_fx

    frozen: list[int] = []
    real = compile_fx.fw_compiler_freezing
    monkeypatch.setattr(compile_fx, "fw_compiler_freezing", lambda *a, **k: frozen.append(1) or real(*a, **k))
    eager = open_session(random_vit(16), device=CPU, precision=precision).model
    compiled = open_session(random_vit(16), device=CPU, precision=precision, compile=True).model
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for n in (4, 3):
            x = torch.randn(n, 3, 16, 16, generator=g)
            reference, got = eager(x), compiled(x)
            assert ((got - reference).abs().max() / reference.abs().max()).item() < tolerance
    assert len(frozen) == 2  # one frozen graph per input shape


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
def test_frozen_inductor_features_match_eager(monkeypatch):
    """The few-shot features' path compiled in place with Inductor and frozen weights: within 1e-5 of eager."""
    import torch._inductor.compile_fx as compile_fx

    frozen: list[int] = []
    real = compile_fx.fw_compiler_freezing
    monkeypatch.setattr(compile_fx, "fw_compiler_freezing", lambda *a, **k: frozen.append(1) or real(*a, **k))
    eager, compiled = random_vit(16), compile_for_inference(random_vit(16), say=lambda line: None,
                                                          method="forward_features")
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        reference, got = eager.forward_features(x), compiled.forward_features(x)
    assert ((got - reference).abs().max() / reference.abs().max()).item() < 1e-5 and frozen == [1]
