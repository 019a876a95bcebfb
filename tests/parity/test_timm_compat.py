"""A vitlab model in a timm user's hands: timm's data config rebuilds vitlab's pre-processing pixel for pixel, timm's
names and tags resolve to the architectures timm builds (same parameter counts), timm's keywords are accepted, and
pretrained=True takes timm's default tag. timm is the reference; nothing is downloaded (models are built on the
meta device, pretrained weights come from a monkeypatched hub fetch)."""

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.hub import catalogue
from vitlab.weights.timm_bit import TIMM_WS_EPS

pytest.importorskip("timm")
import timm  # noqa: E402
import timm.data  # noqa: E402
from timm.models import get_pretrained_cfg  # noqa: E402


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def meta_model(name: str, **kwargs) -> torch.nn.Module:
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        return vitlab.create_model(name, **kwargs)


def meta_timm(name: str, **kwargs) -> torch.nn.Module:
    with torch.device("meta"):
        return timm.create_model(name, pretrained=False, **kwargs)


# --- 1. pre-processing through timm's own resolve_data_config + create_transform -------------------------------
IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8))  # 500×375


def as_uint8(x: torch.Tensor, mean, std) -> torch.Tensor:
    """The 0..255 pixel values a normalised tensor was made from."""
    m, s = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
    return ((x * s + m) * 255).round().to(torch.uint8)


@pytest.mark.parametrize("size", [224, 384])
@pytest.mark.parametrize("name", ["ViT-B/16", "R50+ViT-B/16", "BiT-R50x1"])
@pytest.mark.parametrize("eval_resize", ["official", "big_vision"])
def test_timm_transform_gives_vitlab_pixels(name, size, eval_resize):
    model = meta_model(name, image_size=size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    if eval_resize != "official":
        model.eval_resize = eval_resize  # as a loaded run or published checkpoint carries it
    cfg = timm.data.resolve_data_config(model=model)
    assert cfg["input_size"] == (3, size, size) and cfg["interpolation"] == "bilinear"
    ours, theirs = vitlab.transforms(model)(IMAGE), timm.data.create_transform(**cfg)(IMAGE)
    assert ours.shape == theirs.shape == (3, size, size)
    assert torch.equal(as_uint8(ours, model.config.mean, model.config.std),
                       as_uint8(theirs, model.config.mean, model.config.std))  # the same pixels
    assert (ours - theirs).abs().max() <= 1e-6  # normalised in another order of operations: float rounding only


def test_resize_short_crop_is_marked_approximate():
    """One resampling of the central box (vitlab) is not timm's resize-then-crop: equal when the resize enlarges
    the image (375 -> 384), not when it shrinks it (375 -> 224); the cfg says so."""
    for size, same in ((384, True), (224, False)):
        model = meta_model("ViT-B/16", image_size=size)
        model.eval_resize = "resize-short-crop"
        cfg = model.pretrained_cfg
        assert cfg["vitlab_eval_resize"] == "resize-short-crop"
        assert cfg["vitlab_eval_resize_in_timm"].startswith("approximate")
        ours = vitlab.transforms(model)(IMAGE)
        theirs = timm.data.create_transform(**timm.data.resolve_data_config(model=model))(IMAGE)
        assert ((ours - theirs).abs().max() <= 1e-6) == same


@pytest.mark.parametrize("name", ["ViT-Ti/16", "R+ViT-Ti/16", "BiT-R50x1"])
def test_pretrained_cfg_names_the_model_modules(name):
    model = meta_model(name, num_classes=7, in_chans=1) if "BiT" not in name else meta_model(name, num_classes=7)
    cfg = model.pretrained_cfg
    assert cfg is not model.default_cfg and cfg == model.default_cfg
    conv = model.get_submodule(cfg["first_conv"])
    assert isinstance(conv, torch.nn.Conv2d) and conv.in_channels == cfg["input_size"][0]
    assert model.get_submodule(cfg["classifier"]) is model.get_classifier()
    assert cfg["num_classes"] == 7 and cfg["mean"] == (0.5, 0.5, 0.5)
    model.pretrained_cfg = {"crop_pct": 0.9}  # timm assigns it: an overlay on the derived values
    assert model.pretrained_cfg["crop_pct"] == 0.9 and model.pretrained_cfg["num_classes"] == 7


# --- 2. timm's names, tags and keywords -------------------------------------------------------------------------
TIMM_ENTRIES = [e for e in catalogue.entries() if (e.repo or "").startswith("timm/")]


def test_catalogue_has_timm_entries():
    assert len(TIMM_ENTRIES) >= 9


@pytest.mark.parametrize("entry", TIMM_ENTRIES, ids=[e.repo for e in TIMM_ENTRIES])
def test_every_timm_named_catalogue_entry_resolves(entry):
    full = entry.repo.split("/", 1)[1]
    arch = full.split(".", 1)[0]
    assert arch in timm.list_models() and full in timm.list_pretrained()
    assert catalogue.find(full) is entry  # the timm name is an alias of the catalogue entry
    model = meta_model(full)
    assert model.config.name == entry.model and model.config.num_classes == entry.num_classes
    assert n_params(model) == n_params(meta_timm(full))


@pytest.mark.parametrize("arch", sorted(catalogue.timm_models()))
def test_timm_table_matches_timm(arch):
    """Every aliased architecture: timm registers it, its default tag is timm's, its tags and class counts are
    timm's, and the model built has timm's parameter count (at the class count of the default tag, as timm)."""
    spec = catalogue.timm_models()[arch]
    assert arch in timm.list_models()
    tags = {p.split(".", 1)[1]: get_pretrained_cfg(p).num_classes for p in timm.list_pretrained(arch + ".*")}
    assert spec["tags"] == tags
    default = get_pretrained_cfg(arch)
    assert spec["default"] == (default.tag if tags else None)
    model, ref = meta_model(arch), meta_timm(arch)
    assert n_params(model) == n_params(ref) and model.config.num_classes == ref.num_classes
    if arch.startswith("vit_"):
        assert model.config.image_size == tuple(ref.patch_embed.img_size)


OTHER_ENTRIES = [e for e in catalogue.entries() if e.model and not (e.repo or "").startswith("timm/")]


@pytest.mark.parametrize("entry", OTHER_ENTRIES, ids=[e.name for e in OTHER_ENTRIES])
def test_catalogue_architectures_have_their_timm_alias(entry):
    """Every other catalogue entry (official .npz, BiT .npz, google/* repos): timm's name for its architecture at
    its resolution is an alias that builds the same vitlab model (a BiT's with timm's weight-standardisation eps,
    so that timm's weights give timm's outputs)."""
    from vitlab.weights.timm import timm_model_name
    from vitlab.weights.timm_bit import timm_bit_name

    config = meta_model(entry.model, image_size=entry.resolution or 224).config
    if entry.model.startswith("BiT-"):
        name = timm_bit_name(config)
    else:
        name = timm_model_name(config)
        assert name.endswith(f"_{entry.resolution}")  # timm registers the architecture at this resolution
    assert name in timm.list_models()
    alias = meta_model(name).config
    if entry.model.startswith("BiT-"):
        assert alias.ws_eps == TIMM_WS_EPS
        alias = alias.replace(ws_eps=config.ws_eps)
    assert alias.replace(num_classes=0, image_size=config.image_size) == config.replace(num_classes=0)


def test_unknown_tags_and_untrained_architectures_are_one_line_errors():
    with pytest.raises(ValueError, match="timm publishes no vit_base_patch16_224.nope; its tags: augreg2_in21k"):
        vitlab.create_model("vit_base_patch16_224.nope")
    with pytest.raises(ValueError, match="timm publishes no weights for vit_base_r26_s32_224"):
        vitlab.create_model("vit_base_r26_s32_224", pretrained=True)
    # a missing file named after an architecture is still a path, not a tag timm lacks
    assert catalogue.is_catalogue_name("resnetv2_50x1_bit.goog_in21k")
    assert not catalogue.is_catalogue_name("resnetv2_50x1_bit.pth")


def test_timm_keywords_build_what_timm_builds():
    kwargs = dict(img_size=64, num_classes=7, in_chans=1, global_pool="avg", class_token=False)
    model = meta_model("vit_tiny_patch16_224", drop_rate=0.1, attn_drop_rate=0.05, drop_path_rate=0.2, **kwargs)
    cfg = model.config
    assert (cfg.image_size, cfg.num_classes, cfg.in_chans, cfg.classifier) == ((64, 64), 7, 1, "gap")
    assert (cfg.dropout, cfg.attn_dropout, cfg.drop_path_rate) == (0.1, 0.05, 0.2)
    assert meta_model("vit_tiny_patch16_224", global_pool="avg").config.name == "ViT-Ti/16-gap"
    assert n_params(model) == n_params(meta_timm("vit_tiny_patch16_224", fc_norm=False, **kwargs))
    # vitlab names take timm's keywords too, and global_pool="token" keeps the class token
    same = meta_model("ViT-Ti/16", img_size=64, global_pool="token", drop_path_rate=0.2)
    assert same.config.image_size == (64, 64) and same.config.classifier == "token" and same.cls_token is not None
    assert meta_model("resnetv2_50x1_bit", global_pool="avg", drop_path_rate=0.0).config.name == "BiT-R50x1"


def shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    from vitlab.models.timm_keys import timm_key

    config = getattr(model, "config", None)
    return {timm_key(k, config) if config else k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name, embed_dim", [
    ("vit_little_patch16_reg4_gap_256", 40),  # mlp_ratio 5.6: 224, where vitlab kept the name's 1792
    ("vit_so150m_patch16_reg4_gap_256", 264),  # 2.572: int(679.008) = 679; mlp_dim / width (2304 / 896) gives 678
    ("vit_base_patch16_224", 40),
    ("vit_small_r26_s32_224", 40),  # hybrid
])  # fmt: skip
@pytest.mark.parametrize("mlp", [{}, {"mlp_ratio": 2.5}], ids=["name's-ratio", "ratio"])
def test_mlp_width_follows_embed_dim_and_mlp_ratio_as_in_timm(name, embed_dim, mlp):
    """timm's MLP width is int(embed_dim · mlp_ratio), each the name's unless given: the same tensor shapes as timm's
    model with embed_dim alone, mlp_ratio alone, or both."""
    for kwargs in ({"embed_dim": embed_dim, **mlp}, mlp or {"embed_dim": embed_dim}):
        kwargs = {"depth": 1, "num_heads": 2, "img_size": 64, **kwargs}
        assert shapes(meta_model(name, **kwargs)) == shapes(meta_timm(name, **kwargs)), kwargs


@pytest.mark.parametrize("kwargs, needle", [
    (dict(foo=1), "takes no keyword 'foo'; use a config field"),
    (dict(global_pool="token", class_token=False), "global_pool='token' needs a class token"),
    (dict(global_pool="map"), "global_pool='map'"),
    (dict(img_size=64, image_size=64), "img_size and image_size name the same setting"),
    (dict(mlp_ratio=2.0, mlp_dim=64), "mlp_ratio and mlp_dim name the same setting"),
    (dict(out_indices=(1,)), "out_indices applies only with features_only=True"),
])  # fmt: skip
def test_bad_keywords_are_value_errors(kwargs, needle):
    with pytest.raises(ValueError) as err:
        vitlab.create_model("ViT-Ti/16", **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_bit_refuses_what_it_lacks():
    with pytest.raises(ValueError, match="BiT has no dropout or stochastic depth"):
        vitlab.create_model("resnetv2_50x1_bit", drop_path_rate=0.1)
    with pytest.raises(ValueError, match="BiT pools with 'avg'"):
        vitlab.create_model("BiT-R50x1", global_pool="token")


# --- pretrained=True: the default tag, through a fake hub ------------------------------------------------------
@pytest.fixture
def fake_timm_hub(tmp_path, monkeypatch):
    """hf-hub:timm/vit_tiny_patch16_224.* served from a local timm folder (written by vitlab from a random model);
    the fetch records what was asked for."""
    from vitlab.hub import hf
    from vitlab.weights.timm import write_timm

    source = vitlab.create_model("ViT-Ti/16", image_size=224, num_classes=1000)
    with torch.no_grad():
        for p in source.parameters():
            p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    write_timm(source.eval(), tmp_path / "hub")
    asked = []
    monkeypatch.setattr(hf, "fetch_repo", lambda entry, force=False: asked.append(entry.name) or tmp_path / "hub")
    return source, asked


def test_pretrained_true_takes_timms_default_tag(fake_timm_hub):
    source, asked = fake_timm_hub
    model = vitlab.create_model("vit_tiny_patch16_224", pretrained=True)
    assert asked == ["hf-hub:timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"]
    tagged = vitlab.create_model("vit_tiny_patch16_224.augreg_in21k", pretrained=True, drop_path_rate=0.1)
    assert asked[-1] == "hf-hub:timm/vit_tiny_patch16_224.augreg_in21k"
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = source(x)
        assert torch.equal(model(x), expected) and torch.equal(tagged.eval()(x), expected)
    assert tagged.config.drop_path_rate == 0.1 and model.hub_entry["name"].endswith("augreg_in21k_ft_in1k")
    with pytest.raises(ValueError, match="depth: would change the architecture of the published weights"):
        vitlab.create_model("vit_tiny_patch16_224", pretrained=True, depth=2)


def test_torch_hub_entries_take_timms_keywords():
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    net = torch.hub.load(repo, "vit_ti16", source="local", img_size=32, depth=2, drop_path_rate=0.1,
                         features_only=True, out_indices=(1,))
    assert net.feature_info.channels() == [192] and net.model.config.drop_path_rate == 0.1
    with torch.no_grad():
        assert net.eval()(torch.randn(1, 3, 32, 32))[0].shape == (1, 192, 2, 2)
