"""Fine-tuning tools, each against its definition: layer-wise lr decay against timm's
`param_groups_layer_decay`, EMA against timm's `ModelEmaV3`, LoRA against peft's own merge, a frozen backbone
against the weights it started from; and each resumed bit for bit after a preemption."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

import vitlab
from vitlab.cli import main
from vitlab.train import resolve, resolve_config, run
from vitlab.train.finetune import Ema
from vitlab.train.optim import build_optimizer, layer_scales

timm = pytest.importorskip("timm")
peft = pytest.importorskip("peft")

TINY = dict(width=32, depth=3, num_heads=2, mlp_dim=64)


def _init(tmp_path, **config) -> str:
    """A small random ViT saved as vitlab weights (once per test): what the fine-tunes start from."""
    path = tmp_path / "init.safetensors"
    if not path.exists():
        torch.manual_seed(0)
        vitlab.save(vitlab.create_model("ViT-Ti/4", image_size=8, num_classes=5, **{**TINY, **config}), path)
    return str(path)


def _finetune(tmp_path, out, **overrides):
    """The settings of a 6-step fine-tune on digits, resolved as the command line resolves them (with sources)."""
    base = dict(init=_init(tmp_path), data="digits", out=str(out), batch_size=32, steps=6, warmup=1, lr=0.03,
                eval_every=0, save_every=2, keep_last=3, log_every=1, workers=0, eval_batch_size=512)
    return resolve("finetune", {**base, **overrides})


def _same_files(a, b) -> bool:
    wa, wb = load_file(str(a)), load_file(str(b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# --- layer-wise learning-rate decay ---------------------------------------------------------------------------
@pytest.mark.parametrize("ours, theirs", [
    ({}, {}),
    ({"reg_tokens": 4}, {"reg_tokens": 4}),
    ({"classifier": "gap"}, {"class_token": False, "global_pool": "avg", "fc_norm": False}),
    ({"class_token": False, "classifier": "gap", "fc_norm": True}, {"class_token": False, "global_pool": "avg"}),
], ids=["token", "registers", "gap", "fc-norm"])
@pytest.mark.parity
def test_layer_scales_equal_timms_param_groups_layer_decay(ours, theirs):
    """The same architecture in both libraries has the same parameter names; every one gets timm's lr scale."""
    from timm.optim import param_groups_layer_decay

    model = vitlab.create_model("ViT-Ti/16", image_size=32, num_classes=5, **TINY, **ours)
    reference = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=5, embed_dim=32, depth=3,
                                  num_heads=2, mlp_ratio=2.0, **theirs)
    names = {id(p): n for n, p in reference.named_parameters()}
    expected = {names[id(p)]: group["lr_scale"]
                for group in param_groups_layer_decay(reference, weight_decay=0.05, layer_decay=0.75)
                for p in group["params"]}
    scales = layer_scales(model, 0.75)
    assert scales.keys() == expected.keys()
    assert {n: s for n, s in scales.items() if s != pytest.approx(expected[n], rel=1e-12)} == {}


@pytest.mark.parametrize("name, kwargs", [
    ("vit_small_r26_s32_224", {"num_classes": 5}),  # hybrid: its ResNet stem is the embeddings' layer
    ("vit_tiny_patch16_224", {"num_classes": 0}),  # no head: the last block is the top layer
    ("vit_small_patch14_reg4_dinov2", {"num_classes": 5}),  # registers, layer scale
], ids=["hybrid", "headless", "registers"])
@pytest.mark.parity
def test_layer_scales_equal_timms_on_timm_names(name, kwargs):
    """The layers are the model's group_matcher numbered as timm numbers it: on a model of a timm name, every
    parameter (timm's name for it) gets the lr scale timm's param_groups_layer_decay gives timm's model."""
    from timm.optim import param_groups_layer_decay

    from vitlab.models.timm_keys import timm_key

    small = {"depth": 3, "img_size": 56 if "patch14" in name else 64, "embed_dim": 64, "num_heads": 2,
             "mlp_ratio": 2.0, **kwargs}  # fmt: skip
    model = vitlab.create_model(name, **small)
    reference = timm.create_model(name, pretrained=False, **small)
    names = {id(p): n for n, p in reference.named_parameters()}
    expected = {names[id(p)]: group["lr_scale"]
                for group in param_groups_layer_decay(reference, weight_decay=0.05, layer_decay=0.75)
                for p in group["params"]}  # fmt: skip
    scales = {timm_key(n, model.config): s for n, s in layer_scales(model, 0.75).items()}
    assert scales.keys() == expected.keys()
    assert {n: s for n, s in scales.items() if s != pytest.approx(expected[n], rel=1e-12)} == {}
    assert len(set(scales.values())) == 5 - (kwargs["num_classes"] == 0)


def test_layer_scales_follow_the_models_group_matcher(monkeypatch):
    """One definition of the layers: a model whose group_matcher puts the final norm in a layer of its own (as
    BEiT's and MAE's code do) gets that layer, above the last block."""
    model = vitlab.create_model("ViT-Ti/16", image_size=32, num_classes=5, **TINY)
    matcher = model.group_matcher()
    own_norm = {"stem": matcher["stem"], "blocks": [matcher["blocks"][0]], "norm": r"^norm\."}
    monkeypatch.setattr(type(model), "group_matcher", lambda self, coarse=False: own_norm)
    scales = layer_scales(model, 0.5)
    assert scales["head.weight"] == 1.0 and scales["norm.weight"] == 0.5 and scales["blocks.2.mlp.fc2.weight"] == 0.25
    assert scales["pos_embed"] == 0.5**5


def test_layer_scales_by_definition():
    """decay^(num_layers − layer id): the head 1, block i of 3 at 0.5^(3 − i), the final norm with the last block,
    the embeddings at 0.5^4."""
    scales = layer_scales(vitlab.create_model("ViT-Ti/16", image_size=32, num_classes=5, **TINY), 0.5)
    assert scales["head.weight"] == scales["head.bias"] == 1.0
    assert scales["norm.weight"] == scales["blocks.2.mlp.fc2.weight"] == 0.5
    assert scales["blocks.0.norm1.bias"] == 0.125
    assert scales["pos_embed"] == scales["cls_token"] == scales["patch_embed.proj.weight"] == 0.0625


def test_optimizer_groups_have_scaled_lr_and_vitlab_weight_decay():
    model = vitlab.create_model("ViT-Ti/16", image_size=32, num_classes=5, **TINY)
    cfg = resolve_config("demo", model="ViT-Ti/16", model_args=TINY, image_size=32, lr=0.01, weight_decay=0.05,
                         layer_decay=0.75, optimizer="adam")
    optimizer = build_optimizer(model, cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    scales = layer_scales(model, 0.75)
    kernels = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear | torch.nn.Conv2d)}
    seen = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names[id(p)]
            seen.add(name)
            assert group["lr"] == pytest.approx(0.01 * scales[name], rel=1e-12)
            assert group["weight_decay"] == (0.05 if name in kernels else 0.0)
    assert seen == set(names.values())
    assert optimizer.param_groups[0]["lr"] == 0.01  # the logged lr is the head's, the base lr


def test_layer_decay_refuses_a_model_without_blocks():
    with pytest.raises(ValueError, match="--layer-decay groups a ViT's blocks, and Sequential has none"):
        layer_scales(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4, 2)), 0.75)



def test_layer_decay_refuses_bit_although_it_has_timms_groups():
    """BiT's group_matcher serves timm's optimizer factory; vitlab's --layer-decay still refuses BiT in one line (the
    BiT-HyperRule fine-tunes every layer at one lr)."""
    model = vitlab.create_model("BiT-R50x1", num_classes=5)
    assert model.group_matcher()["stem"]
    with pytest.raises(ValueError) as refused:
        layer_scales(model, 0.75)
    assert str(refused.value) == ("--layer-decay groups a ViT's blocks, and BiT-R50x1 is a BiT ResNet, which the "
                                  "BiT-HyperRule fine-tunes at one lr in every layer; leave it unset")

# --- EMA ------------------------------------------------------------------------------------------------------
@pytest.mark.parity
@pytest.mark.parametrize("warmup", [False, True])
def test_ema_equals_timm_model_ema_v3(warmup):
    """The same sequence of weights fed to both, update k with step=k as timm's train.py passes it; decay 0.6 so that
    the warm-up's own value (below 0.6 for the first 3 updates) and its cap both occur."""
    from timm.utils import ModelEmaV3

    torch.manual_seed(0)
    model = vitlab.create_model("ViT-Ti/16", image_size=32, num_classes=5, **TINY)
    ours = Ema(model, 0.6, warmup=warmup)
    reference = ModelEmaV3(model, decay=0.6, use_warmup=warmup)
    for k in range(1, 9):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ours.update(model, k)
        reference.update(model, step=k if warmup else None)  # vitlab's --ema without warm-up: constant decay
        theirs = [p for p in reference.module.parameters()]
        assert all(torch.equal(a, b) for a, b in zip(ours.params, theirs, strict=True)), k
    assert [ours.decay_at(k) for k in (1, 2, 4)] == ([0.0, 1 - 2 ** (-2 / 3), 0.6] if warmup else [0.6] * 3)


def test_ema_averages_only_what_trains():
    model = vitlab.create_model("ViT-Ti/16", image_size=32, num_classes=5, **TINY)
    model.requires_grad_(False)
    model.head.requires_grad_(True)
    assert [p.shape for p in Ema(model, 0.9).params] == [model.head.weight.shape, model.head.bias.shape]


# --- frozen backbone ------------------------------------------------------------------------------------------
def test_frozen_backbone_leaves_the_backbone_bit_identical(tmp_path):
    result = run(_finetune(tmp_path, tmp_path / "run", freeze="backbone"))
    start, end = load_file(_init(tmp_path)), load_file(str(result.weights))
    assert end.keys() == start.keys()
    backbone = [k for k in end if not k.startswith("head.")]
    assert len(backbone) == len(end) - 2 and all(torch.equal(start[k], end[k]) for k in backbone)
    assert end["head.weight"].abs().sum() > 0  # the zero head trained
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_00000006" / "state.pt", weights_only=True)
    assert len(state["optimizer"]["state"]) == 2  # momentum for head.weight and head.bias only
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["freeze"] == "backbone" and record["sources"]["freeze"] == "flag"
    assert record["drop_path_rate"] == 0.0 and record["sources"]["drop_path_rate"].startswith("--freeze backbone")
    console = (tmp_path / "run" / "console.log").read_text()
    assert "train   330 of " in console and "the classifier only (head.weight, head.bias; --freeze backbone" in console


# --- LoRA -----------------------------------------------------------------------------------------------------
def _peft_reference(init: str, adapters: dict, head: dict, rank: int, targets: str) -> torch.nn.Module:
    """The fine-tuned model rebuilt with peft alone: the initial weights, a new head, peft's LoRA wrapper with the
    trained adapters loaded, then peft's merge_and_unload."""
    model = vitlab.load(init)
    model.reset_classifier(10)
    model.load_state_dict(head, strict=False)
    config = peft.LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, lora_dropout=0.0)
    wrapped = peft.get_peft_model(model, config)
    missing = wrapped.get_base_model().load_state_dict(adapters, strict=False)
    assert not missing.unexpected_keys
    return wrapped.merge_and_unload().eval()


@pytest.mark.parity
def test_lora_export_is_peft_merged_model(tmp_path):
    result = run(_finetune(tmp_path, tmp_path / "run", lora_rank=4, lora_targets=("qkv", "fc2")))
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_00000006" / "state.pt", weights_only=True)
    adapters = state["tuning"]
    assert sorted({k.split(".", 3)[3].split(".default")[0] for k in adapters}) == [
        "fc2.base_layer.bias", "fc2.base_layer.weight", "fc2.lora_A", "fc2.lora_B",
        "qkv.base_layer.bias", "qkv.base_layer.weight", "qkv.lora_A", "qkv.lora_B"]
    exported = load_file(str(result.weights))
    start = load_file(_init(tmp_path))
    assert all(torch.equal(start[k], exported[k]) for k in start
               if not k.startswith("head.") and not k.endswith(("qkv.weight", "fc2.weight")))
    assert not torch.equal(start["blocks.0.attn.qkv.weight"], exported["blocks.0.attn.qkv.weight"])  # merged
    head = {k: v for k, v in exported.items() if k.startswith("head.")}
    reference = _peft_reference(_init(tmp_path), adapters, head, 4, r"blocks\.\d+\.(attn\.qkv|mlp\.fc2)")
    loaded = vitlab.load(tmp_path / "run").eval()
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(x), reference(x))
    assert set(loaded.state_dict()) == set(start)  # an ordinary vitlab model


def test_lora_trains_only_adapters_and_head(tmp_path):
    cfg = _finetune(tmp_path, tmp_path / "run", lora_rank=2).config
    from vitlab.train.finetune import Tuning

    model = vitlab.load(cfg.init)
    model.reset_classifier(10)
    tuning = Tuning(model, cfg)
    assert sorted({n.split(".", 2)[2] for n in tuning.trained if n.startswith("blocks.")}) == [
        "attn.qkv.lora_A.default.weight", "attn.qkv.lora_B.default.weight"]
    assert [n for n in tuning.trained if not n.startswith("blocks.")] == ["head.weight", "head.bias"]
    assert tuning.counts[0] == 3 * 2 * (32 + 96) + 10 * 33  # A: rank × 32, B: 96 × rank, per block; the head


def test_lora_without_peft_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ValueError, match=r"--lora needs the peft package: pip install 'vitlab\[lora\]'"):
        run(_finetune(tmp_path, tmp_path / "run", lora_rank=2))


# --- resume ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tools", [
    dict(ema=0.9, ema_warmup=True),
    pytest.param(dict(lora_rank=4, ema=0.8, layer_decay=0.75), marks=pytest.mark.slow),
    pytest.param(dict(freeze="backbone", ema=0.9), marks=pytest.mark.slow),
], ids=["ema-warmup", "lora-ema-layer-decay", "freeze-ema"])
def test_preempted_run_resumes_bit_exactly(tmp_path, sigterm_during_step, tools):
    reference = run(_finetune(tmp_path, tmp_path / "ref", dropout=0.1, **tools))
    with sigterm_during_step(3):
        first = run(_finetune(tmp_path, tmp_path / "run", dropout=0.1, **tools))
    assert (first.status, first.step) == ("preempted", 3)
    resumed = run(_finetune(tmp_path, tmp_path / "run", dropout=0.1, resume=True, **tools))
    assert resumed.status == "completed"
    assert _same_files(reference.weights, resumed.weights)  # the EMA weights
    assert _same_files(tmp_path / "ref" / "best.safetensors", tmp_path / "run" / "best.safetensors")
    ref_state = torch.load(tmp_path / "ref" / "checkpoints" / "step_00000006" / "state.pt", weights_only=True)
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_00000006" / "state.pt", weights_only=True)
    assert all(torch.equal(ref_state["ema"][k], state["ema"][k]) for k in ref_state["ema"])


def test_ema_weights_are_what_the_run_exports(tmp_path):
    """model.safetensors holds the EMA, not the last step's weights (which the final checkpoint keeps)."""
    result = run(_finetune(tmp_path, tmp_path / "run", ema=0.9, ema_warmup=True))
    exported = load_file(str(result.weights))
    last = load_file(str(tmp_path / "run" / "checkpoints" / "step_00000006" / "model.safetensors"))
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_00000006" / "state.pt", weights_only=True)
    assert all(torch.equal(exported[k], state["ema"][k]) for k in exported)
    assert not torch.equal(exported["head.weight"], last["head.weight"])
    console = (tmp_path / "run" / "console.log").read_text()
    assert "decay min(0.9, 1 − k^−2/3) at update k" in console and "model.safetensors hold the EMA weights" in console


# --- the command line -----------------------------------------------------------------------------------------
def _cli(*args: str) -> int:
    """`vitlab ARGS` in this process: its exit status (argparse's own errors included)."""
    try:
        return main(list(args))
    except SystemExit as stop:
        return stop.code


def test_cli_flags_reach_the_config_with_their_source(tmp_path, capsys):
    assert _cli("finetune", "--init", _init(tmp_path), "--data", "digits", "--print-config", "--lora", "8",
                "--lora-alpha", "16", "--lora-targets", "qkv,proj", "--layer-decay", "0.75", "--ema-decay", "0.9998",
                "--ema-warmup", "--out", str(tmp_path / "r")) == 0
    out = capsys.readouterr().out
    flags = " ".join(line for line in out.replace("\n      ", " ").splitlines() if "from flag:" in line)
    for item in ("lora_rank 8", "lora_alpha 16", "lora_targets (qkv, proj)", "layer_decay 0.75", "ema 0.9998",
                 "ema_warmup True"):
        assert item in flags, (item, out)


@pytest.mark.parametrize("args, message", [
    (("--freeze", "backbone", "--lora", "4"), "--lora already freezes the backbone"),
    (("--lora", "4", "--lora-targets", "qkv,head"),
     "--lora-targets qkv,head: name each once, from qkv, proj, fc1, fc2"),
    (("--lora-alpha", "8",), "--lora-alpha and --lora-targets shape LoRA adapters: add --lora RANK"),
    (("--ema-warmup",), "--ema-warmup warms up the EMA's decay: add --ema-decay D"),
    (("--layer-decay", "1.5"), "--layer-decay: "),
])
def test_cli_refuses_contradictions_in_one_line(tmp_path, capsys, args, message):
    assert _cli("finetune", "--init", _init(tmp_path), "--data", "digits", "--print-config", *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
