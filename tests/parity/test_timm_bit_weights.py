"""timm's BiT (resnetv2_*_bit) <-> vitlab: weights copied either way give timm's logits (relative L2 <= 1e-5,
float32, random weights, non-square input in [-1, 1]); every bad file is a one-line WeightsError naming the file
and the tensor or option. timm models are built with pretrained=False: nothing is downloaded."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import vitlab
from vitlab.cli import main
from vitlab.errors import WeightsError
from vitlab.models import BiTConfig, build_model
from vitlab.weights.timm import read_timm, write_timm
from vitlab.weights.timm_bit import to_timm_bit_state_dict

timm = pytest.importorskip("timm")
from timm.layers import StdConv2d  # noqa: E402
from timm.models import load_checkpoint, save_for_hf  # noqa: E402
from timm.models.resnetv2 import ResNetV2  # noqa: E402

TOL = 1e-5
X = torch.rand(2, 3, 64, 48, generator=torch.Generator().manual_seed(1)) * 2 - 1


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def randomize(model: nn.Module, conv_std: float, seed: int = 0) -> nn.Module:
    """Random weights everywhere (fresh GroupNorms are the identity and heads are zero, which would hide a
    mis-mapped tensor): GN scales 1 ± 0.1, offsets and head ± 0.1, convs of std `conv_std`."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            is_norm_scale = p.ndim == 1 and "norm" in name and name.endswith("weight")
            std = conv_std if p.ndim == 4 and "head" not in name else 0.1
            p.copy_(1 + 0.1 * noise if is_norm_scale else std * noise)
    return model.eval()


@pytest.fixture(scope="module")
def timm_ref():
    """timm's R50x1 with convs of std 1e-4: their variance (1e-8) is timm's standardisation eps, so the logits
    depend on the eps and on where it is added; 1e-10 instead changes them by far more than the tolerance."""
    ref = randomize(timm.create_model("resnetv2_50x1_bit", pretrained=False, num_classes=10), conv_std=1e-4)
    with torch.no_grad():
        return ref, ref(X)


def vitlab_logits(path, **kwargs) -> tuple[nn.Module, torch.Tensor]:
    model = vitlab.load(path, **kwargs)
    with torch.no_grad():
        return model, model(X)


def test_timm_hub_folder_to_vitlab(timm_ref, tmp_path):
    ref, ref_logits = timm_ref
    save_for_hf(ref, tmp_path / "hub", safe_serialization=True)  # timm's own hub export
    model, logits = vitlab_logits(tmp_path / "hub")
    assert model.config == BiTConfig(num_classes=10, ws_eps=1e-8, name="BiT-R50x1")
    assert rel_err(logits, ref_logits) <= TOL
    with torch.no_grad():
        with torch.device("meta"):  # no initialisation: the weights are replaced at once
            other_eps = build_model(model.config.replace(ws_eps=1e-10)).eval()
        other_eps.load_state_dict(model.state_dict(), assign=True)
        assert rel_err(other_eps(X), ref_logits) > 100 * TOL  # the eps this test pins matters
        # float64: the same function up to float64 rounding
        assert rel_err(model.double()(X.double()), ref.double()(X.double())) <= 1e-12
    ref.float()


def test_timm_bare_state_dicts_to_vitlab(timm_ref, tmp_path):
    """Architecture from the shapes (safetensors), or named by arch= (a .pth training checkpoint)."""
    ref, ref_logits = timm_ref
    save_file(ref.state_dict(), tmp_path / "w.safetensors")
    model, logits = vitlab_logits(tmp_path / "w.safetensors")
    assert model.config.name == "BiT-R50x1" and model.config.ws_eps == 1e-8
    assert rel_err(logits, ref_logits) <= TOL
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in ref.state_dict().items()}}, tmp_path / "c.pth")
    named = read_timm(tmp_path / "c.pth", arch="resnetv2_50x1_bit.goog_in21k")
    assert named.config == model.config
    assert all(torch.equal(named.state_dict[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", ["resnetv2_50x1_bit", "resnetv2_101x1_bit"])
def test_timm_state_dict_loads_with_timms_load_checkpoint_and_by_arch(name, tmp_path):
    """timm's state dict, saved as timm saves it, loads into vitlab.create_model(NAME) through timm's own
    load_checkpoint (strict: vitlab's BiT takes timm's names and 1×1-convolution head) and through
    vitlab.load(file, arch=NAME), both with timm's logits: a model made by a timm name has timm's
    standardisation eps (the std-1e-4 convs make the logits depend on it)."""
    ref = randomize(timm.create_model(name, pretrained=False, num_classes=7), conv_std=1e-4)
    path = tmp_path / f"{name}.pth"
    torch.save(ref.state_dict(), path)
    created = vitlab.create_model(name, num_classes=7).eval()
    load_checkpoint(created, str(path))
    loaded = vitlab.load(path, arch=name)
    with torch.no_grad():
        expected = ref(X)
        assert rel_err(created(X), expected) <= TOL
        assert rel_err(loaded(X), expected) <= TOL
    assert created.config == loaded.config
    # and timm's model object itself: load_state_dict of its state dict
    again = vitlab.create_model(name, num_classes=7).eval()
    again.load_state_dict(ref.state_dict())
    assert all(torch.equal(v, created.state_dict()[k]) for k, v in again.state_dict().items())


def test_vitlab_to_timm(tmp_path):
    """A vitlab BiT written as a timm hub folder loads in timm with the same logits; the bare state dict too.
    It has timm's standardisation eps: a big_transfer model (1e-10) is computed by timm with 1e-8, and that
    float32 rounding difference alone, amplified by 50 random layers, is a few 1e-6 of the logits."""
    cfg = BiTConfig(num_classes=10, image_size=(96, 80), ws_eps=1e-8, name="BiT-R50x1")
    model = randomize(build_model(cfg), conv_std=1.0)
    model.class_names = [f"c{i}" for i in range(10)]
    write_timm(model, tmp_path / "hub")
    ref = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    with torch.no_grad():
        logits = model(X)
        assert rel_err(ref(X), logits) <= TOL
    hub = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert hub["architecture"] == "resnetv2_50x1_bit" and hub["num_classes"] == 10
    assert hub["label_names"] == model.class_names
    pcfg = hub["pretrained_cfg"]
    assert pcfg["input_size"] == [3, 96, 80] and pcfg["interpolation"] == "bilinear"
    assert pcfg["mean"] == [0.5] * 3 and pcfg["std"] == [0.5] * 3
    back = read_timm(tmp_path / "hub")  # and back: the same tensors, bit for bit
    assert back.config == model.config and back.meta["class_names"] == model.class_names
    assert all(torch.equal(back.state_dict[k], v) for k, v in model.state_dict().items())

    write_timm(model, tmp_path / "bare.safetensors")
    bare = timm.create_model("resnetv2_50x1_bit", pretrained=False, num_classes=10).eval()
    bare.load_state_dict(load_file(tmp_path / "bare.safetensors"))
    with torch.no_grad():
        assert rel_err(bare(X), logits) <= TOL


def test_cli_convert_and_info(tmp_path, capsys):
    model = randomize(build_model(BiTConfig(layers=(1, 1, 1, 1), num_classes=3, ws_eps=1e-8)), conv_std=1.0)
    vitlab.save(model, tmp_path / "m.safetensors")
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "t.pth"), "--to", "timm"]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "t.pth")]) == 0
    out = capsys.readouterr().out
    assert "format: timm" in out and "layers: [1, 1, 1, 1]" in out and "width_factor: 1" in out
    assert "ws_eps: 1e-08" in out and "num_classes: 3" in out
    assert main(["info", "--json", str(tmp_path / "m.safetensors")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "vitlab" and info["config"]["arch"] == "bit-v2"
    assert info["params"] == sum(p.numel() for p in model.parameters())
    # timm's BiT with this topology (timm registers only six depths/widths) computes the same
    ref = ResNetV2(layers=[1, 1, 1, 1], num_classes=3, stem_type="fixed", conv_layer=partial(StdConv2d, eps=1e-8))
    ref.eval().load_state_dict(torch.load(tmp_path / "t.pth", weights_only=True))
    with torch.no_grad():
        assert rel_err(vitlab.load(tmp_path / "t.pth")(X), ref(X)) <= TOL


def test_new_head_from_timm_file(timm_ref, tmp_path):
    ref, _ = timm_ref
    save_file(ref.state_dict(), tmp_path / "w.safetensors")
    model = vitlab.load(tmp_path / "w.safetensors", num_classes=4, image_size=384)
    assert model.config.num_classes == 4 and model.config.image_size == (384, 384)
    assert not model.head.weight.any() and not model.head.bias.any()
    assert torch.equal(model.stages[3][2].conv3.weight, ref.stages[3].blocks[2].conv3.weight)


# --- bad input -------------------------------------------------------------------------------------------------
def tiny(layers=(1, 2), num_classes=4) -> dict[str, torch.Tensor]:
    """A small BiT's tensors under timm's names."""
    return {k: v.contiguous() for k, v in to_timm_bit_state_dict(build_model(
        BiTConfig(layers=layers, num_classes=num_classes))).items()}  # fmt: skip


def bare(tmp_path, tensors, name="w.safetensors"):
    save_file(tensors, tmp_path / name)
    return tmp_path / name


def raises(path, *needles, **kwargs) -> str:
    with pytest.raises(WeightsError) as info:
        vitlab.load(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)), message
    for needle in needles:
        assert needle in message, message
    return message


def test_tiny_file_reads(tmp_path):
    """The fixture the bad cases start from is good: a custom depth inferred from the units per stage."""
    model = vitlab.load(bare(tmp_path, tiny()))
    assert model.config.layers == (1, 2) and model.config.name == "" and model.config.num_classes == 4


def test_missing_extra_and_misshapen_tensors(tmp_path):
    t = tiny()
    raises(bare(tmp_path, {k: v for k, v in t.items() if k != "stages.1.blocks.1.conv2.weight"}, "a.safetensors"),
           "missing tensors stages.1.blocks.1.conv2.weight")  # fmt: skip
    raises(bare(tmp_path, {**t, "stages.0.blocks.0.extra": torch.zeros(3)}, "b.safetensors"),
           "unexpected tensors stages.0.blocks.0.extra")  # fmt: skip
    raises(bare(tmp_path, {**t, "head.fc.bias": torch.zeros(7)}, "c.safetensors"), "head.fc.bias", "(7,)", "(4,)")
    raises(bare(tmp_path, {**t, "norm.weight": torch.zeros(100)}, "d.safetensors"), "norm.weight", "(100,)")
    # read as R50x1 by name: the message names the architecture it was checked against
    raises(bare(tmp_path, t, "e.safetensors"), "resnetv2_50x1_bit", "missing tensors", arch="resnetv2_50x1_bit")


def test_unknown_architectures(tmp_path):
    t = tiny()
    raises(bare(tmp_path, t), "unknown timm architecture 'resnetv2_77x1_bit'", arch="resnetv2_77x1_bit")
    raises(bare(tmp_path, t), "unknown timm architecture 'resnetv2_50'", "not BiT", arch="resnetv2_50")
    gap = {k.replace("stages.1.", "stages.2."): v for k, v in t.items()}
    raises(bare(tmp_path, gap, "g.safetensors"), "stages [0, 2] are not numbered 0..n-1")
    odd = {**t, "stem.conv.weight": torch.zeros(100, 3, 7, 7)}
    raises(bare(tmp_path, odd, "o.safetensors"), "'stem.conv.weight' has 100 filters, not a multiple of 64")
    no_units = {k: v for k, v in t.items() if not k.startswith("stages.")}
    raises(bare(tmp_path, no_units, "n.safetensors"), "no ResNetV2 units")


@pytest.mark.parametrize("args, needle", [
    ({"stem_type": "deep"}, "stem_type='deep' makes another ResNetV2 than BiT's"),
    ({"preact": False}, "preact=False"),
    ({"made_up": 1}, "unknown timm option made_up=1"),
], ids=["stem", "preact", "unknown"])  # fmt: skip
def test_unsupported_options(tmp_path, args, needle):
    hub = tmp_path / "hub"
    hub.mkdir()
    bare(hub, tiny(layers=(3, 4, 6, 3)), "model.safetensors")
    cfg = {"architecture": "resnetv2_50x1_bit", "num_classes": 4, "model_args": args, "pretrained_cfg": {}}
    (hub / "config.json").write_text(json.dumps(cfg))
    raises(hub, str(hub / "config.json"), needle)


def test_model_args_not_an_object_names_the_config_even_with_arch(tmp_path):
    hub = tmp_path / "hub"
    hub.mkdir()
    bare(hub, tiny(layers=(3, 4, 6, 3)), "model.safetensors")
    cfg = {"architecture": "resnetv2_50x1_bit", "num_classes": 4, "model_args": [1, 2], "pretrained_cfg": {}}
    (hub / "config.json").write_text(json.dumps(cfg))
    for arch in (None, "resnetv2_50x1_bit"):  # the config is named, also when arch= names the model
        raises(hub, str(hub / "config.json"), "'model_args' is a JSON list, not an object", arch=arch)


def test_corrupt_files(tmp_path):
    good = bare(tmp_path, tiny())
    (tmp_path / "cut.safetensors").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    raises(tmp_path / "cut.safetensors", "truncated")
    torch.save(tiny(), tmp_path / "w.pth")
    (tmp_path / "cut.pth").write_bytes((tmp_path / "w.pth").read_bytes()[:1000])
    raises(tmp_path / "cut.pth", "corrupt or truncated")
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "config.json").write_text("{not json")
    raises(tmp_path / "hub", "config.json", "not valid JSON")


def test_write_refuses_what_timm_cannot_build(tmp_path):
    """timm registers six BiTs: a hub folder of another depth/width would not load there; a bare state dict
    (which timm's ResNetV2 class takes) is fine."""
    model = build_model(BiTConfig(layers=(1, 2), num_classes=4))
    with pytest.raises(WeightsError, match="timm registers no BiT with layers"):
        write_timm(model, tmp_path / "hub")
    assert not (tmp_path / "hub").exists()
    write_timm(model, tmp_path / "ok.safetensors")
    assert set(load_file(tmp_path / "ok.safetensors")) == set(tiny())
