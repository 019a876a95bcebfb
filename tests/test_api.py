"""Ordinary mistakes in the Python API (a uint8 or float64 tensor, no batch dimension, channels
not 3, a bool or negative class count, an unbounded size, wrong types) raise vitlab's one-line TypeError or
ValueError naming the argument and the fix, not torch's or numpy's messages; the checks leave torch.export working.
16-bit and float images are scaled, not clipped; a torch.hub entry's weights= must hold its model;
prune_intermediate_layers then save round-trips or is refused; class names are escaped in model cards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.data.sources import decode_rgb
from vitlab.weights.card import model_card

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vit():
    return vitlab.create_model("ViT-Ti/16", num_classes=3, image_size=32, depth=2).eval()


@pytest.fixture(scope="module")
def bit():
    return vitlab.create_model("BiT-R50x1", num_classes=3, image_size=32, layers=(1, 1, 1, 1)).eval()


def x(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


FLOATING = "model input must be floating point, got {}; pre-process images with vitlab.transforms(model)"
# case -> (call on the ViT `m` and the BiT `b`, exception type, the start of its message)
FORWARD = {
    "uint8": (lambda m, b: m(x(1, 3, 32, 32, dtype=torch.uint8)), TypeError, FLOATING.format("torch.uint8")),
    "int64": (lambda m, b: m(x(1, 3, 32, 32, dtype=torch.long)), TypeError, FLOATING.format("torch.int64")),
    "bool": (lambda m, b: m(x(1, 3, 32, 32, dtype=torch.bool)), TypeError, FLOATING.format("torch.bool")),
    "float64": (lambda m, b: m(x(1, 3, 32, 32, dtype=torch.float64)), TypeError,
                "model input is torch.float64 but the model's weights are torch.float32; convert the input with "
                "x.to(torch.float32)"),
    "float16": (lambda m, b: m(x(1, 3, 32, 32, dtype=torch.float16)), TypeError,
                "model input is torch.float16 but the model's weights are torch.float32"),
    "no batch dimension": (lambda m, b: m(x(3, 32, 32)), ValueError,
                           "model input must be 4-D (N, 3, H, W), got shape (3, 32, 32); add the batch dimension "
                           "with x[None]"),
    "5-D": (lambda m, b: m(x(1, 1, 3, 32, 32)), ValueError, "model input must be 4-D (N, 3, H, W), got shape (1, 1"),
    "grey": (lambda m, b: m(x(1, 1, 32, 32)), ValueError,
             "model input must have 3 channels in dimension 1, got shape (1, 1, 32, 32); a grey image: repeat it "
             "with x.expand(-1, 3, -1, -1)"),
    "RGBA": (lambda m, b: m(x(1, 4, 32, 32)), ValueError, "model input must have 3 channels in dimension 1, got "
             "shape (1, 4, 32, 32); drop the alpha channel with x[:, :3]"),
    "channels last": (lambda m, b: m(x(1, 32, 32, 3)), ValueError, "model input must have 3 channels in dimension "
                      "1, got shape (1, 32, 32, 3); it looks channels-last (N, H, W, C): use x.permute(0, 3, 1, 2)"),
    "numpy": (lambda m, b: m(np.zeros((1, 3, 32, 32), np.float32)), TypeError,
              "model input must be a torch.Tensor of shape (N, 3, H, W), got ndarray"),
    "list": (lambda m, b: m([[0.0]]), TypeError, "model input must be a torch.Tensor of shape (N, 3, H, W), got list"),
    "forward_features uint8": (lambda m, b: m.forward_features(x(1, 3, 32, 32, dtype=torch.uint8)), TypeError,
                               FLOATING.format("torch.uint8")),
    "forward_inspect no batch": (lambda m, b: m.forward_inspect(x(3, 32, 32)), ValueError,
                                 "model input must be 4-D"),
    "forward_intermediates no batch": (lambda m, b: m.forward_intermediates(x(3, 32, 32)), ValueError,
                                       "model input must be 4-D"),
    "forward_head on pooled": (lambda m, b: m.forward_head(x(5, 192)), ValueError,
                               "forward_head takes the tokens forward_features returns, (N, T, 192), got (5, 192)"),
    "BiT uint8": (lambda m, b: b(x(1, 3, 32, 32, dtype=torch.uint8)), TypeError, FLOATING.format("torch.uint8")),
    "BiT float64": (lambda m, b: b(x(1, 3, 32, 32, dtype=torch.float64)), TypeError,
                    "model input is torch.float64 but the model's weights are torch.float32"),
    "BiT no batch": (lambda m, b: b(x(3, 32, 32)), ValueError, "model input must be 4-D (N, 3, H, W)"),
    "BiT grey": (lambda m, b: b(x(1, 1, 32, 32)), ValueError, "model input must have 3 channels in dimension 1"),
    "BiT intermediates uint8": (lambda m, b: b.forward_intermediates(x(1, 3, 32, 32, dtype=torch.uint8)),
                                TypeError, FLOATING.format("torch.uint8")),
}


def raised(call, kind) -> str:
    with pytest.raises(Exception) as caught:
        call()
    assert type(caught.value) is kind, f"{type(caught.value).__name__}: {caught.value}"
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("case", list(FORWARD))
def test_a_wrong_input_to_forward_is_one_line(vit, bit, case):
    call, kind, starts = FORWARD[case]
    with torch.no_grad():
        assert raised(lambda: call(vit, bit), kind).startswith(starts)


def model_at(path: Path) -> Path:
    if not path.exists():
        vitlab.save(vitlab.create_model("ViT-Ti/16", num_classes=3, image_size=32, depth=1), path)
    return path


# case -> (call taking a folder holding weights, exception type, the start of its message)
ARGUMENTS = {
    "create_model num_classes=True": (lambda d: vitlab.create_model("ViT-Ti/16", num_classes=True), ValueError,
                                      "num_classes must be an integer, got True"),
    "BiT num_classes=True": (lambda d: vitlab.create_model("BiT-R50x1", num_classes=True), ValueError,
                             "num_classes must be an integer, got True"),
    "create_model name 16": (lambda d: vitlab.create_model(16), TypeError,
                             "create_model takes a model name (a str such as 'ViT-B/16'"),
    "create_model name None": (lambda d: vitlab.create_model(None), TypeError, "create_model takes a model name"),
    "pretrained=1.5": (lambda d: vitlab.create_model("ViT-Ti/16", pretrained=1.5), TypeError,
                       "pretrained must be True, False or a tag name (str), got 1.5"),
    "out_indices='a'": (lambda d: vitlab.create_model("ViT-Ti/16", features_only=True, out_indices="a"), TypeError,
                        "indices must be an integer (the last n) or a list of integers, got 'a'"),
    "mlp_ratio='4'": (lambda d: vitlab.create_model("ViT-Ti/16", embed_dim=192, mlp_ratio="4"), ValueError,
                      "mlp_ratio must be a positive number (e.g. 4.0), got '4'"),
    "mean='abc'": (lambda d: vitlab.create_model("ViT-Ti/16", mean="abc"), ValueError,
                   "mean must be 3 numbers (R, G, B), got 'abc'"),
    "std=None": (lambda d: vitlab.create_model("ViT-Ti/16", std=None), ValueError,
                 "std must be 3 numbers (R, G, B), got None"),
    "load(5)": (lambda d: vitlab.load(5), TypeError, "vitlab.load takes a path (str or pathlib.Path) or a published "
                "name"),
    "load(None)": (lambda d: vitlab.load(None), TypeError, "vitlab.load takes a path"),
    "load image_size='64'": (lambda d: vitlab.load(model_at(d / "m.safetensors"), image_size="64"), TypeError,
                             "image_size must be an integer or two integers (height, width), got '64'"),
    "load num_classes=True": (lambda d: vitlab.load(model_at(d / "m.safetensors"), num_classes=True), TypeError,
                              "num_classes must be an integer (0: no classifier), got True"),
    "load num_classes=3.0": (lambda d: vitlab.load(model_at(d / "m.safetensors"), num_classes=3.0), TypeError,
                             "num_classes must be an integer (0: no classifier), got 3.0"),
    "save a str": (lambda d: vitlab.save("model", d / "x.safetensors"), TypeError,
                   "vitlab.save takes a vitlab model (from vitlab.create_model or vitlab.load), got str"),
    "save a state dict": (lambda d: vitlab.save({"w": torch.zeros(1)}, d / "x.safetensors"), TypeError,
                          "vitlab.save takes a vitlab model (from vitlab.create_model or vitlab.load), got dict"),
    "save an nn.Linear": (lambda d: vitlab.save(torch.nn.Linear(2, 2), d / "x.safetensors"), TypeError,
                          "vitlab.save takes a vitlab model, and this Linear has no vitlab config"),
    "save to 5": (lambda d: vitlab.save(vitlab.create_model("ViT-Ti/16", depth=1, image_size=32), 5), TypeError,
                  "vitlab.save takes a file path (str or pathlib.Path), got int"),
    "transforms(5)": (lambda d: vitlab.transforms(5), TypeError, "vitlab.transforms takes a path"),
    "transforms(None)": (lambda d: vitlab.transforms(None), TypeError, "vitlab.transforms takes a path"),
    "crop_scale=(2, 1)": (lambda d: vitlab.transforms(model_at(d / "m.safetensors"), train=True, crop_scale=(2, 1)),
                          ValueError, "crop_scale must be two numbers (low, high) with 0 < low <= high <= 1"),
    "crop_ratio=(0, 1)": (lambda d: vitlab.transforms(model_at(d / "m.safetensors"), train=True, crop_ratio=(0, 1)),
                          ValueError, "crop_ratio must be two numbers (low, high) with 0 < low <= high"),
    "reset_classifier(-1)": (lambda d: vitlab.create_model("ViT-Ti/16", depth=1).reset_classifier(-1), ValueError,
                             "num_classes must be an integer from 0 (no classifier) to 1,000,000, got -1"),
    "reset_classifier(True)": (lambda d: vitlab.create_model("BiT-R50x1", layers=(1,)).reset_classifier(True),
                               ValueError, "num_classes must be an integer from 0 (no classifier) to 1,000,000, "
                               "got True"),
}


@pytest.mark.parametrize("case", list(ARGUMENTS))
def test_a_wrong_argument_is_one_line_naming_it(tmp_path_factory, case):
    call, kind, starts = ARGUMENTS[case]
    folder = tmp_path_factory.getbasetemp() / "api-args"
    folder.mkdir(exist_ok=True)
    assert raised(lambda: call(folder), kind).startswith(starts)


# Sizes whose allocation would ask for terabytes (or overflow): case -> (Python expression, the message's start)
UNBOUNDED = {
    "create_model image_size": ("vitlab.create_model('ViT-Ti/16', image_size=10**7)",
                                "image_size 10000000x10000000 is beyond vitlab's limit of 16,384 pixels per side"),
    "timm img_size": ("vitlab.create_model('ViT-Ti/16', img_size=10**7)", "image_size 10000000x10000000 is beyond"),
    "BiT image_size": ("vitlab.create_model('BiT-R50x1', image_size=10**7)", "image_size 10000000x10000000 is beyond"),
    "num_classes": ("vitlab.create_model('ViT-Ti/16', num_classes=10**12)",
                    "num_classes 1,000,000,000,000 is beyond vitlab's limit of 1,000,000"),
    "width": ("vitlab.create_model('ViT-Ti/16', width=10**9, num_heads=1)",
              "width 1,000,000,000 is beyond vitlab's limit of 16,384"),
    "depth": ("vitlab.create_model('ViT-Ti/16', depth=10**6)", "depth 1,000,000 is beyond vitlab's limit of 1,024"),
    "mlp_dim": ("vitlab.create_model('ViT-Ti/16', mlp_dim=10**9)", "mlp_dim 1,000,000,000 is beyond"),
    "tokens": ("vitlab.create_model('ViT-Ti/16', image_size=16384, patch_size=8)",
               "image_size 16384x16384 with patch size 8 makes 4,194,304 patches, beyond vitlab's limit of 262,144"),
    "set_input_size": ("vitlab.create_model('ViT-Ti/16', depth=1).set_input_size(10**7)",
                       "image_size 10000000x10000000 is beyond"),
    "load image_size": ("vitlab.load(PATH, image_size=10**7)",
                        "image_size must be from 1 to 16,384 pixels per side, got 10000000"),
}


def test_unbounded_sizes_are_refused_before_any_allocation(tmp_path):
    """All UNBOUNDED cases in one interpreter capped at its imports plus 2 GiB: each a ValueError, none a
    MemoryError or torch's allocation error."""
    path = model_at(tmp_path / "m.safetensors")
    code = ("import json, re, resource, vitlab\n"
            "vm = int(re.search(r'VmSize:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) * 1024\n"
            "resource.setrlimit(resource.RLIMIT_AS, (vm + 2 * 2**30, vm + 2 * 2**30))\n"
            f"PATH = {str(path)!r}\nout = {{}}\n"
            f"for case, expr in {json.dumps({k: v[0] for k, v in UNBOUNDED.items()})}.items():\n"
            "    try:\n        eval(expr)\n        out[case] = ['returned', '']\n"
            "    except Exception as e:\n        out[case] = [type(e).__name__, str(e)]\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for case, (_, starts) in UNBOUNDED.items():
        assert got[case][0] == "ValueError" and got[case][1].startswith(starts), (case, got[case])


def test_the_checks_leave_torch_export_and_autocast_working(vit):
    """The input checks read attributes only: torch.export traces with a dynamic batch and the exported program
    computes what eager does; under autocast a float32 input to a float32 model computes in bf16."""
    sample = torch.randn(2, 3, 32, 32)
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(vit, (sample,), dynamic_shapes={"x": {0: batch}})
    other = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(program.module()(other), vit(other), atol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert vit(sample).dtype == torch.bfloat16


# --- images, saved models, model cards ------------------------------------------------------------------------------------------------------
def test_a_16_bit_png_is_scaled_to_8_bits_not_saturated(tmp_path):
    grey = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)  # 0 … 65520
    Image.fromarray(grey).save(tmp_path / "g16.png")
    expected = ((grey.astype(np.int64) * 255 + 32767) // 65535).astype(np.uint8)
    decoded = np.asarray(decode_rgb(tmp_path / "g16.png"))
    assert decoded.shape == (64, 64, 3) and all(np.array_equal(decoded[..., c], expected) for c in range(3))
    assert len(np.unique(decoded)) == 256  # the whole range, not 0 … 255 then white
    with Image.open(tmp_path / "g16.png") as img:  # a PIL image handed to vitlab.transforms goes the same way
        model = vitlab.create_model("ViT-Ti/16", num_classes=2, image_size=64, depth=1)
        got = vitlab.transforms(model)(img)
    want = (torch.from_numpy(expected).float() / 255 - 0.5) / 0.5
    assert torch.allclose(got[0], want, atol=1e-6)


def test_a_float_tiff_in_0_1_is_scaled_and_one_outside_is_refused(tmp_path):
    ramp = np.linspace(0, 1, 32 * 32, dtype=np.float32).reshape(32, 32)
    Image.fromarray(ramp).save(tmp_path / "f.tif")
    decoded = np.asarray(decode_rgb(tmp_path / "f.tif"))
    assert np.array_equal(decoded[..., 1], np.round(ramp.astype(np.float64) * 255).astype(np.uint8))
    assert decoded.max() == 255  # was black: values 0 and 1 of 255
    Image.fromarray(np.full((8, 8), 3.5, np.float32)).save(tmp_path / "hot.tif")
    with pytest.raises(ValueError) as refused:
        decode_rgb(tmp_path / "hot.tif")
    assert str(refused.value) == ("a floating-point image with values from 3.5 to 3.5: vitlab reads float images in "
                                  "[0, 1]; scale it to [0, 1] or save it as 8-bit")


def test_hub_entry_refuses_weights_of_another_model(tmp_path):
    vitlab.save(vitlab.create_model("ViT-Ti/16", num_classes=2, image_size=32), tmp_path / "ti.safetensors")
    weights = str(tmp_path / "ti.safetensors")
    with pytest.raises(ValueError) as refused:
        torch.hub.load(str(REPO), "vit_b16", source="local", weights=weights)
    assert str(refused.value) == (
        f"vit_b16: {weights} holds ViT/16 (depth 12, width 192, 3 heads, MLP 768) (width 192, not 768; mlp_dim 768, "
        "not 3072; num_heads 3, not 12), not ViT-B/16; use that architecture's entry point, or vitlab.load")
    assert torch.hub.load(str(REPO), "vit_ti16", source="local", weights=weights).config.width == 192


def test_pruned_model_round_trips_through_save_and_load(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", num_classes=3, image_size=32, depth=4, drop_path_rate=0.1).eval()
    model.prune_intermediate_layers(indices=[1])
    vitlab.save(model, tmp_path / "pruned.safetensors")
    loaded = vitlab.load(tmp_path / "pruned.safetensors")
    sample = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.forward_features(sample), model.forward_features(sample))
        assert torch.equal(loaded(sample), model(sample))
    assert loaded.config.depth == 2 and loaded.config.num_classes == 0
    # the kept blocks keep their stochastic-depth rates: 0.1·i/3 for i = 0, 1
    assert [getattr(b.drop_path, "p", 0.0) for b in loaded.blocks] == pytest.approx([0.0, 0.1 / 3])


def test_a_model_without_its_final_norm_is_refused_at_save(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", num_classes=3, image_size=32, depth=2)
    model.prune_intermediate_layers(indices=1, prune_norm=True)
    message = raised(lambda: vitlab.save(model, tmp_path / "p.safetensors"), ValueError)
    assert message.startswith("vitlab.save: the model lacks parameters its config describes (norm.bias, "
                              "norm.weight), so vitlab.load could not rebuild it")
    assert list(tmp_path.iterdir()) == []


def test_class_names_are_escaped_in_the_model_card(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", num_classes=4, image_size=32, depth=1)
    model.class_names = ["<script>alert(1)</script>", "[x](javascript:alert(1))", "a | b", "cat\n# Heading"]
    card = model_card(model, "hf", tmp_path / "export")
    line = next(ln for ln in card.splitlines() if ln.startswith("Classes in label order:"))
    assert line == ("Classes in label order: &lt;script&gt;alert\\(1\\)&lt;/script&gt;, "
                    "\\[x\\]\\(javascript:alert\\(1\\)\\), a \\| b, cat \\# Heading.")
    assert "<script>" not in card and "\n# Heading" not in card
