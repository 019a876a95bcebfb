"""`--compile` on the inference verbs: `vitlab eval --compile` and `vitlab predict --compile` wrap the
prepared model with torch.compile and give the results eager gives. The default suite traces with dynamo's
"eager" backend (the wrapper, its attribute forwarding and the verbs' plumbing, in seconds); the `-m slow` test
compiles with Inductor, as users get it, and compares logits with eager's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.models.vit import VisionTransformer, ViTConfig
from vitlab.runtime.session import open_session

CPU = torch.device("cpu")


def random_vit(image_size: int = 8) -> VisionTransformer:
    """A 10-class ViT with every parameter drawn at random (a zero head would make every prediction agree)."""
    model = VisionTransformer(ViTConfig(image_size=image_size, patch_size=4, width=32, depth=2, mlp_dim=64,
                                        num_heads=2, num_classes=10, name="tiny"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "model.safetensors"
    vitlab.save(random_vit(), path)
    return str(path)


def test_eval_compile_gives_eager_metrics_and_says_so(weights, compiles, capsys):
    argv = ["eval", "--weights", weights, "--data", "digits", "--json", "--precision", "fp32"]
    assert main(argv) == 0
    eager = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert compiles == [] and eager["compile"]["name"] == "off"  # auto: 359 images of a tiny float32 model
    assert eager["compile"]["reason"].startswith("auto: ")
    assert main(argv + ["--compile"]) == 0
    compiled = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert len(compiles) == 1 and compiled["compile"] == {"name": "on", "reason": "requested"}
    assert 0.05 < eager["top1"] < 0.95  # random weights: neither all right nor all wrong, so equality means something
    for key in ("top1", "top5", "count", "per_class"):
        assert compiled[key] == eager[key], key
    assert compiled["loss"] == pytest.approx(eager["loss"], rel=1e-5)


def test_predict_compile_gives_eager_predictions(weights, compiles, capsys, tmp_path):
    rng = np.random.default_rng(0)
    for i in range(5):  # batch size 2: batches of 2, 2, 1 (a second shape for the compiled model)
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(tmp_path / f"im{i}.png")
    argv = ["predict", "--weights", weights, str(tmp_path), "--json", "--batch-size", "2", "--precision", "fp32"]
    assert main(argv) == 0
    eager = json.loads(capsys.readouterr().out)
    assert main(argv + ["--compile"]) == 0
    compiled = json.loads(capsys.readouterr().out)
    assert len(compiles) == 1 and len(eager) == 5
    for e, c in zip(eager, compiled, strict=True):
        assert [t["index"] for t in c["top"]] == [t["index"] for t in e["top"]]
        assert [t["probability"] for t in c["top"]] == pytest.approx([t["probability"] for t in e["top"]], rel=1e-5)


def test_the_compiled_model_keeps_what_callers_read(compiles):
    session = open_session(random_vit(), device=CPU, precision="int8", compile=True)
    model = session.model
    assert session.precision.name == "int8" and len(compiles) == 1
    assert model.config.num_classes == 10  # evaluate and predict read the config through the wrapper
    with torch.no_grad():
        assert model(torch.randn(3, 3, 8, 8)).shape == (3, 10)


@pytest.mark.slow
def test_inductor_compiled_logits_match_eager():
    """The real thing (Inductor, C++ code generation): logits within 1e-5 of eager, float32, two batch sizes."""
    eager = random_vit(image_size=32)
    compiled = open_session(random_vit(image_size=32), device=CPU, precision="fp32", compile=True).model
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n in (4, 3):
            x = torch.randn(n, 3, 32, 32, generator=g)
            reference, got = eager(x), compiled(x)
            assert ((got - reference).abs().max() / reference.abs().max()).item() < 1e-5
