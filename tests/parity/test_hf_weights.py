"""HF transformers <-> vitlab: `save_pretrained` folders read by read_hf and folders written by write_hf give the
same outputs as transformers (relative L2 error <= 1e-5 in float32, random weights and inputs), and every bad
folder is a WeightsError naming the file and the tensor or option. Models come from configs: nothing is downloaded."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vitlab import create_model
from vitlab.errors import WeightsError
from vitlab.models import ViTConfig, build_model
from vitlab.weights.hf import read_hf, write_hf

transformers = pytest.importorskip("transformers")
from transformers import ViTConfig as HFConfig  # noqa: E402
from transformers import ViTForImageClassification, ViTModel  # noqa: E402

TOL = 1e-5
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
             patch_size=8, num_labels=5)  # fmt: skip


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere: the initialisers zero biases and norm offsets, which would hide a mis-mapped
    tensor (LayerNorm weights stay near 1 so the signal keeps its scale)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.add_(noise * 0.1) if p.ndim == 1 else p.copy_(noise * 0.05)
    return model.eval()


def inputs(size: int = 32) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))


def vitlab_model(ck) -> nn.Module:
    model = build_model(ck.config).eval()
    model.load_state_dict(ck.state_dict)
    return model


@pytest.mark.parametrize(
    "options",
    [{}, {"hidden_act": "gelu_pytorch_tanh"}, {"qkv_bias": False}, {"hidden_act": "gelu_new", "layer_norm_eps": 1e-6}],
    ids=["defaults-eps1e-12", "gelu-tanh", "no-qkv-bias", "gelu-new-eps1e-6"],
)
def test_classifier_folder_to_vitlab(tmp_path, options):
    ref = randomize(ViTForImageClassification(HFConfig(**SMALL, **options)))
    ref.save_pretrained(tmp_path)
    ck = read_hf(tmp_path)
    cfg = ck.config
    assert ck.source == "hf" and (cfg.width, cfg.depth, cfg.num_heads, cfg.num_classes) == (64, 2, 4, 5)
    assert cfg.ln_eps == options.get("layer_norm_eps", 1e-12)
    assert cfg.gelu == ("exact" if "hidden_act" not in options else "tanh")
    assert cfg.qkv_bias == options.get("qkv_bias", True)
    x = inputs()
    with torch.no_grad():
        assert rel_err(vitlab_model(ck)(x), ref(pixel_values=x).logits) <= TOL


def test_class_names_preprocessor_and_pickle_weights(tmp_path):
    labels = {i: name for i, name in enumerate(["cat", "dog", "eel", "fox", "gnu"])}
    ref = randomize(ViTForImageClassification(HFConfig(**SMALL, id2label=labels)))
    ref.save_pretrained(tmp_path)
    # an older export: pytorch_model.bin (weights-only loadable) instead of safetensors
    torch.save(load_file(tmp_path / "model.safetensors"), tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    pre = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "do_normalize": True}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    ck = read_hf(tmp_path)
    assert ck.meta["class_names"] == ["cat", "dog", "eel", "fox", "gnu"]
    assert ck.config.mean == (0.485, 0.456, 0.406) and ck.config.std == (0.229, 0.224, 0.225)
    x = inputs()
    with torch.no_grad():
        assert rel_err(vitlab_model(ck)(x), ref(pixel_values=x).logits) <= TOL


def test_vit_model_pooler_is_pre_logits(tmp_path):
    ref = randomize(ViTModel(HFConfig(**SMALL, pooler_output_size=48)))
    ref.save_pretrained(tmp_path)
    ck = read_hf(tmp_path)
    assert ck.config.num_classes == 0 and ck.config.representation_size == 48
    model, x = vitlab_model(ck), inputs()
    with torch.no_grad():
        out = ref(pixel_values=x)
        assert rel_err(model(x), out.pooler_output) <= TOL
        assert rel_err(model.forward_features(x), out.last_hidden_state) <= TOL


def test_vit_model_without_pooler(tmp_path):
    ref = randomize(ViTModel(HFConfig(**SMALL), add_pooling_layer=False))
    ref.save_pretrained(tmp_path)
    ck = read_hf(tmp_path)
    assert ck.config.representation_size is None
    x = inputs()
    with torch.no_grad():
        assert rel_err(vitlab_model(ck)(x), ref(pixel_values=x).last_hidden_state[:, 0]) <= TOL


def test_classifier_pooler_and_mask_token_are_dropped(tmp_path):
    """HF's classifier reads the class token, never the pooler; the mask token is for masked image modelling."""
    ref = randomize(ViTForImageClassification(HFConfig(**SMALL)))
    ref.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    extra = {"vit.pooler.dense.weight": torch.randn(64, 64), "vit.pooler.dense.bias": torch.randn(64),
             "vit.embeddings.mask_token": torch.randn(1, 1, 64)}  # fmt: skip
    save_file({**tensors, **extra}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ck = read_hf(tmp_path)
    assert ck.config.representation_size is None and len(ck.meta["notes"]) >= 3
    x = inputs()
    with torch.no_grad():
        assert rel_err(vitlab_model(ck)(x), ref(pixel_values=x).logits) <= TOL


def test_write_hf_round_trip(tmp_path):
    model = randomize(create_model("ViT-Ti/16", image_size=32, num_classes=3, depth=2, gelu="tanh"))
    model.class_names = ["a", "b", "c"]
    write_hf(model, tmp_path / "out")
    ref = ViTForImageClassification.from_pretrained(tmp_path / "out").eval()
    x = inputs()
    with torch.no_grad():
        assert rel_err(model(x), ref(pixel_values=x).logits) <= TOL
    back = read_hf(tmp_path / "out")
    assert back.config == model.config.replace(name="")  # depth=2 is no registry variant
    assert back.meta["class_names"] == ["a", "b", "c"] and ref.config.id2label[1] == "b"
    for key, value in model.state_dict().items():
        assert torch.equal(back.state_dict[key], value), key
    write_hf(model, tmp_path / "out")  # replacing an earlier export is fine


def test_write_hf_representation_layer_as_vit_model(tmp_path):
    model = randomize(build_model(ViTConfig(image_size=32, patch_size=8, width=64, depth=2, mlp_dim=128,
                                            num_heads=4, num_classes=0, representation_size=32)))  # fmt: skip
    write_hf(model, tmp_path / "out")
    ref = ViTModel.from_pretrained(tmp_path / "out").eval()
    x = inputs()
    with torch.no_grad():
        assert rel_err(model(x), ref(pixel_values=x).pooler_output) <= TOL


# --- bad input -------------------------------------------------------------------------------------------------
def saved(tmp_path, **options):
    randomize(ViTForImageClassification(HFConfig(**SMALL, **options))).save_pretrained(tmp_path)
    return tmp_path


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}))


def edit_tensors(folder, change):
    tensors = load_file(folder / "model.safetensors")
    save_file(change(tensors), folder / "model.safetensors", metadata={"format": "pt"})


def raises(folder, *needles) -> None:
    with pytest.raises(WeightsError) as info:
        read_hf(folder)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_unsupported_config(tmp_path):
    folder = saved(tmp_path)
    edit_config(folder, hidden_act="relu")
    raises(folder, "config.json", "hidden_act='relu'")
    edit_config(folder, hidden_act="gelu", model_type="deit")
    raises(folder, "config.json", "model_type 'deit'")
    edit_config(folder, model_type="vit", architectures=["ViTForMaskedImageModeling"])
    raises(folder, "config.json", "ViTForMaskedImageModeling")


def test_missing_extra_and_misshapen_tensors(tmp_path):
    folder = saved(tmp_path)
    key = "vit.encoder.layer.1.attention.attention.value.bias"
    edit_tensors(folder, lambda t: {k: v for k, v in t.items() if k != key})
    raises(folder, "model.safetensors", f"missing tensors {key}")
    edit_tensors(folder, lambda t: {**t, key: torch.zeros(64), "vit.encoder.layer.0.adapter.weight": torch.zeros(2)})
    raises(folder, "model.safetensors", "unexpected tensors vit.encoder.layer.0.adapter.weight")
    edit_tensors(folder, lambda t: {k: v for k, v in t.items() if "adapter" not in k})
    edit_config(folder, intermediate_size=96)
    raises(folder, "model.safetensors", "vit.encoder.layer.0.intermediate.dense.weight", "(128, 64)", "(96, 64)")


def test_corrupt_and_unsafe_files(tmp_path):
    folder = saved(tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 100])
    raises(folder, "model.safetensors", "truncated")
    (folder / "model.safetensors").unlink()
    raises(folder, str(folder), "model.safetensors")  # no weights at all
    torch.save({"weights": load_file_from(data), "trainer": Opaque()}, folder / "pytorch_model.bin")
    raises(folder, "pytorch_model.bin", "weights_only=True", "Opaque")
    (folder / "config.json").write_text('{"model_type": "vit", ')
    raises(folder, "config.json", "not valid JSON")


def load_file_from(data: bytes) -> dict:
    from safetensors.torch import load

    return load(data)


class Opaque:
    """An object torch.load(weights_only=True) refuses to rebuild."""


def test_write_hf_refuses_what_hf_cannot_build(tmp_path):
    with pytest.raises(WeightsError, match="ResNet stem"):
        write_hf(create_model("R+ViT-Ti/16", image_size=64, depth=1), tmp_path / "a")
    with pytest.raises(WeightsError, match="GAP"):
        write_hf(create_model("ViT-Ti/16-gap", image_size=32, depth=1), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "data.csv").write_text("keep me")
    with pytest.raises(WeightsError, match="data.csv"):
        write_hf(create_model("ViT-Ti/16", image_size=32, depth=1), tmp_path / "c")
    assert (tmp_path / "c" / "data.csv").read_text() == "keep me"
