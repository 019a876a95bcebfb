"""Ordinary mistakes in the Python API (a uint8 or float64 tensor, no batch dimension, channels
not 3, a bool or negative class count, an unbounded size, wrong types) raise vitlab's one-line TypeError or
ValueError naming the argument and the fix, not torch's or numpy's messages; the checks leave torch.export and
autocast working. `vitlab.transforms` (the eval pipeline as a Python callable) feeds the model what `vitlab eval`
feeds it, by a closed form and against the eval loader, and its training form is seeded."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab.data import EvalTransform, ShardSampler, TransformedSplit, make_loader, normalize
from vitlab.data.sources import ImageSplit
from vitlab.models import ViTConfig, build_model
from vitlab.train.checkpoint import save_weights
from vitlab.weights.load import preprocessing

TOL = 1e-5


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
    "std=abc": (lambda d: vitlab.create_model("ViT-Ti/16", std="abc"), ValueError,
               "std must be 3 numbers (R, G, B), got 'abc'"),
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
    code = ("import json, re, resource, torch, vitlab, vitlab.api\n"  # the imports mapped before the cap
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


# --- vitlab.transforms ------------------------------------------------------------------------------------------
def test_transforms_equal_what_eval_feeds_the_model(tmp_path, random_tiny_vit):
    """The eval loader (`vitlab eval`: ImageSplit -> TransformedSplit -> make_loader -> normalize) on JPEGs large
    enough for draft decoding, with the eval resize recorded in the weights."""
    model = random_tiny_vit(0, image_size=32, patch_size=8)
    save_weights(tmp_path / "w.safetensors", model.state_dict(), model.config, ["a", "b", "c"],
                 meta={"eval_resize": "big_vision"})  # what a run writes (train.checkpoint.weights_meta)
    files = [tmp_path / f"{i}.jpg" for i in range(3)]
    for i, f in enumerate(files):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (150 + 10 * i, 200, 3), dtype=np.uint8)).save(f)
    resize = preprocessing(tmp_path / "w.safetensors")[1]
    assert resize == "big_vision"
    split = ImageSplit("val", np.zeros(3, dtype=np.int64), ["a", "b", "c"], paths=[str(f) for f in files])
    loader = make_loader(TransformedSplit(split, EvalTransform((32, 32), resize)), ShardSampler(3, 3), 0,
                         torch.device("cpu"))  # fmt: skip
    batch = next(iter(loader))
    fed = normalize(batch["images"], model.config.mean, model.config.std)
    for source in (tmp_path / "w.safetensors", vitlab.load(tmp_path / "w.safetensors")):
        t = vitlab.transforms(source)
        assert t.base == EvalTransform((32, 32), "big_vision")
        assert torch.equal(torch.stack([t(str(f)) for f in files]), fed)


def test_transforms_closed_form_and_input_kinds(tmp_path, random_tiny_vit):
    """official resize: PIL bilinear to S x S, then (x / 255 - mean) / std, written out by hand."""
    model = random_tiny_vit(0, image_size=16, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    t = vitlab.transforms(model)
    rgb = np.random.default_rng(0).integers(0, 256, (30, 20, 3), dtype=np.uint8)
    resized = np.asarray(Image.fromarray(rgb).resize((16, 16), Image.Resampling.BILINEAR), dtype=np.float64)
    expected = (resized / 255 - np.array(model.config.mean)) / np.array(model.config.std)
    out = t(rgb)
    assert out.dtype == torch.float32 and out.shape == (3, 16, 16)
    assert np.abs(out.permute(1, 2, 0).numpy() - expected).max() <= TOL
    Image.fromarray(rgb).save(tmp_path / "x.png")
    Image.fromarray(rgb).convert("RGBA").save(tmp_path / "x4.png")
    for same in (Image.fromarray(rgb), tmp_path / "x.png", str(tmp_path / "x4.png"), Image.open(tmp_path / "x4.png")):
        assert torch.equal(t(same), out)
    grey = rgb[:, :, 0]
    assert torch.equal(t(grey), t(np.repeat(grey[:, :, None], 3, axis=2)))  # grey: the same value in R, G, B
    with pytest.raises(ValueError, match=r"uint8 \(H, W, 3\).*float64"):
        t(rgb / 255.0)
    with pytest.raises(ValueError, match="got Tensor"):
        t(torch.zeros(3, 16, 16))
    with pytest.raises(ValueError, match="not a vitlab model"):
        vitlab.transforms(torch.nn.Linear(2, 2))


def test_train_transform_is_seeded_and_degenerates_to_eval(random_tiny_vit):
    model = random_tiny_vit(0, image_size=16)
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (24, 24, 3), dtype=np.uint8))
    a, b, c = (vitlab.transforms(model, train=True, seed=s) for s in (3, 3, 4))
    first = [a(img) for _ in range(4)]
    assert all(torch.equal(x, y) for x, y in zip(first, [b(img) for _ in range(4)], strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(first, [c(img) for _ in range(4)], strict=True))
    assert not all(torch.equal(first[0], x) for x in first[1:])  # draws advance
    # a crop of the whole square image, never flipped, is the eval resize (closed form: nothing random left)
    whole = vitlab.transforms(model, train=True, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip=False)
    assert torch.equal(whole(img), vitlab.transforms(model)(img))
    with pytest.raises(ValueError, match="unknown training option"):
        vitlab.transforms(model, train=True, crop_size=3)
    with pytest.raises(ValueError, match="only with train=True"):
        vitlab.transforms(model, flip=False)
    assert isinstance(vitlab.transforms(model, train=True).rng, random.Random)


@pytest.mark.parametrize("value", ["224", "16", 16.0, True, [16], (16, 16, 16), {"h": 16}])
def test_create_model_refuses_an_image_size_that_is_not_integers(value):
    with pytest.raises(ValueError, match="image_size must be an integer or two integers"):
        vitlab.create_model("ViT-Ti/16", image_size=value)


def test_create_model_takes_integer_sizes():
    import numpy as np

    assert vitlab.create_model("ViT-Ti/16", image_size=np.int64(32), depth=1).config.image_size == (32, 32)
    assert vitlab.create_model("ViT-Ti/16", image_size=[32, 48], depth=1).config.grid_size() == (2, 3)


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".bin", ".ckpt"])
def test_save_refuses_a_name_load_reads_as_a_pickle(tmp_path, suffix):
    model = build_model(ViTConfig(image_size=16, patch_size=8, **TINY_VIT_ARGS, num_classes=3))
    with pytest.raises(ValueError, match=f"a {suffix} file is read as a PyTorch pickle; name it m.safetensors"):
        vitlab.save(model, tmp_path / f"m{suffix}")
    assert list(tmp_path.iterdir()) == []
    vitlab.save(model, tmp_path / "m.safetensors")  # what load reads back exactly
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in vitlab.load(tmp_path / "m.safetensors")
               .state_dict().items())


def test_create_model_drops_none_valued_keywords_as_timm():
    """timm's rule: a keyword set to None is left out (train.py passes bn_eps=None, drop_block_rate=None, …)."""
    model = vitlab.create_model("ViT-Ti/16", image_size=32, std=None, num_classes=None, bn_eps=None,
                                drop_block_rate=None, bn_momentum=None, scriptable=False, checkpoint_path="")
    plain = vitlab.create_model("ViT-Ti/16", image_size=32)
    assert model.config == plain.config
