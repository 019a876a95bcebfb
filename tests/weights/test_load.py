"""vitlab's own format, the load dispatcher and its errors, and the `info` / `convert` verbs."""

import json
import subprocess
import sys
import zipfile

import pytest
import torch
from safetensors.torch import load_file, save_file

import vitlab
from vitlab.cli import main
from vitlab.errors import WeightsError
from vitlab.models import ViTConfig, build_model
from vitlab.weights.load import detect_format

TINY = dict(image_size=32, patch_size=8, width=48, depth=2, mlp_dim=96, num_heads=4, num_classes=5)


def randomized(cfg):
    model = build_model(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


@pytest.mark.parametrize(
    "cfg",
    [
        ViTConfig(**TINY),
        ViTConfig(**TINY, classifier="gap", pos_embed="relative", gelu="tanh"),
        ViTConfig(**TINY, pos_embed="2d", representation_size=16),
        vitlab.models.model_config("R+ViT-Ti/16", image_size=64, num_classes=3, depth=1),
        vitlab.models.model_config("BiT-R26x1", image_size=32, num_classes=4),
    ],
    ids=["vit", "gap-relative-tanh", "2d-rep", "hybrid", "bit"],
)
def test_save_load_round_trip_is_bit_exact(tmp_path, cfg):
    model = randomized(cfg)
    path = tmp_path / "m.safetensors"
    vitlab.save(model, path)
    back = vitlab.load(path)
    assert back.config == model.config
    for (k, a), (k2, b) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b), k
    x = torch.randn(2, 3, *cfg.image_size)
    with torch.no_grad():
        assert torch.equal(model(x), back(x))


def test_class_names_travel_and_head_reset_drops_them(tmp_path):
    model = randomized(ViTConfig(**TINY))
    model.class_names = ["a", "b", "c", "d", "e"]
    vitlab.save(model, tmp_path / "m.safetensors")
    assert vitlab.load(tmp_path / "m.safetensors").class_names == model.class_names
    other = vitlab.load(tmp_path / "m.safetensors", num_classes=2)
    assert other.class_names == ["0", "1"] and other.head.weight.abs().sum() == 0  # a new head: the indices


def test_save_is_atomic_when_writing_fails(tmp_path, monkeypatch):
    import vitlab.weights.vitlab_format as io

    def broken(tensors, filename, metadata=None):
        open(filename, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(io, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        vitlab.save(randomized(ViTConfig(**TINY)), tmp_path / "m.safetensors")
    assert list(tmp_path.iterdir()) == []  # neither the target nor a temp file is left


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "m.safetensors"
    vitlab.save(randomized(ViTConfig(**TINY)), path)
    return path


def rewrite(path, edit):
    """Re-save a vitlab file with its tensors edited but its metadata (config) kept."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata=meta)


def test_missing_tensor_is_named(saved):
    rewrite(saved, lambda t: t.pop("blocks.1.mlp.fc2.bias"))
    with pytest.raises(WeightsError, match=r"m\.safetensors: .*missing.*blocks\.1\.mlp\.fc2\.bias"):
        vitlab.load(saved)


def test_extra_tensor_is_named(saved):
    rewrite(saved, lambda t: t.update({"blocks.9.attn.qkv.weight": torch.zeros(1)}))
    with pytest.raises(WeightsError, match=r"unexpected.*blocks\.9\.attn\.qkv\.weight"):
        vitlab.load(saved)


def test_shape_mismatch_is_named(saved):
    rewrite(saved, lambda t: t.update({"norm.weight": torch.zeros(47)}))
    with pytest.raises(WeightsError, match=r"norm\.weight has shape \(47,\), expected \(48,\)"):
        vitlab.load(saved)


def test_truncated_file_is_detected(saved):
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="truncated"):
        vitlab.load(saved)


def test_unknown_format_is_named(tmp_path):
    junk = tmp_path / "weights.safetensors"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(WeightsError, match="not a safetensors file"):
        vitlab.load(junk)
    with pytest.raises(WeightsError, match="no such file"):
        vitlab.load(tmp_path / "missing.npz")
    with pytest.raises(WeightsError, match="no config.json"):
        vitlab.load(tmp_path)
    archive = tmp_path / "other.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(WeightsError, match="neither .npy arrays nor a torch state dict"):
        detect_format(archive)


def test_image_size_not_divisible_by_patch(saved):
    with pytest.raises(WeightsError, match="not divisible by the effective patch size 8.*image size divisible"):
        vitlab.load(saved, image_size=30)


def test_cli_info_and_convert(saved, tmp_path, capsys):
    assert main(["info", str(saved), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "vitlab" and info["config"]["width"] == 48 and info["grid"] == [4, 4]
    out = tmp_path / "big.safetensors"
    assert main(["convert", str(saved), str(out), "--image-size", "64", "--num-classes", "3"]) == 0
    big = vitlab.load(out)
    assert big.config.image_size == (64, 64) and big.config.num_classes == 3


def test_cli_bad_file_exits_nonzero_with_one_line(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"garbage")
    proc = subprocess.run([sys.executable, "-m", "vitlab", "info", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.safetensors" in lines[0] and "Traceback" not in proc.stderr


def test_pruned_model_round_trips_through_save_and_load(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", num_classes=3, image_size=32, depth=4, drop_path_rate=0.1).eval()
    model.prune_intermediate_layers(indices=[1], prune_head=False)
    vitlab.save(model, tmp_path / "pruned.safetensors")
    loaded = vitlab.load(tmp_path / "pruned.safetensors")
    sample = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.forward_features(sample), model.forward_features(sample))
        assert torch.equal(loaded(sample), model(sample))
    assert loaded.config.depth == 2 and loaded.config.num_classes == 3
    # the kept blocks keep their stochastic-depth rates: 0.1·i/3 for i = 0, 1
    assert [getattr(b.drop_path, "p", 0.0) for b in loaded.blocks] == pytest.approx([0.0, 0.1 / 3])


@pytest.mark.parametrize("name", ["ViT-Ti/16", "vit_little_patch16_reg4_gap_256"])  # class token; fc_norm
def test_a_model_with_a_pruned_head_is_refused_at_save_in_one_line(tmp_path, name):
    """prune_head=True leaves a model that returns unpooled tokens (timm's global_pool ''), with or without the
    LayerNorm after pooling it had: no config describes that, and save says so the same way for both."""
    model = vitlab.create_model(name, num_classes=3, image_size=32, depth=2, **({} if "/" in name else
                                {"embed_dim": 32, "num_heads": 2}))  # fmt: skip
    model.prune_intermediate_layers(indices=1)
    with pytest.raises(ValueError) as refused:
        vitlab.save(model, tmp_path / "p.safetensors")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("vitlab.save: the model no longer pools (timm's global_pool '', set by "
                              "prune_intermediate_layers(prune_head=True)")
    assert message.endswith("save it before pruning its head, or prune with prune_head=False")
    assert list(tmp_path.iterdir()) == []


def test_a_model_without_its_final_norm_is_refused_at_save(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", num_classes=3, image_size=32, depth=2)
    model.prune_intermediate_layers(indices=1, prune_norm=True, prune_head=False)
    with pytest.raises(ValueError) as refused:
        vitlab.save(model, tmp_path / "p.safetensors")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("vitlab.save: the model lacks parameters its config describes (norm.bias, "
                              "norm.weight), so vitlab.load could not rebuild it")
    assert list(tmp_path.iterdir()) == []


def test_an_unmerged_peft_model_is_refused_at_save_naming_merge_and_unload(tmp_path):
    """A LoRA-wrapped model (the peft model, its LoraModel, or the vitlab model with adapters injected) is refused
    in one line that says merge_and_unload(), not pruning; merged, it saves and loads as the merged weights."""
    peft = pytest.importorskip("peft")
    model = vitlab.create_model("ViT-Ti/16", depth=1, num_classes=3, image_size=32)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["qkv"], init_lora_weights=False))
    for target in (wrapped, wrapped.base_model, model):
        with pytest.raises(ValueError) as refused:
            vitlab.save(target, tmp_path / "lora.safetensors")
        message = str(refused.value)
        assert "\n" not in message and "merge_and_unload()" in message and "prun" not in message
        assert "blocks.0.attn.qkv" in message
    assert list(tmp_path.iterdir()) == []
    x = torch.randn(2, 3, 32, 32)
    expected = wrapped.eval()(x)
    vitlab.save(wrapped.merge_and_unload(), tmp_path / "merged.safetensors")
    torch.testing.assert_close(vitlab.load(tmp_path / "merged.safetensors")(x), expected, rtol=1e-5, atol=1e-5)
