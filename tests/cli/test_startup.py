"""The command line starts without torch: building the parser, every verb's --help and `vitlab models` import no
torch (each checked in a fresh interpreter, since this test process has torch loaded already), and `vitlab models`
counts parameters from the config exactly as the built model holds them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitlab.cli import main
from vitlab.models import BiTConfig, ResNetConfig, ViTConfig, build_model, count_parameters, model_config

SRC = str(Path(__file__).resolve().parents[2] / "src")
VERBS = ["models", "bench", "info", "convert", "train", "finetune", "eval", "predict", "recipes", "fewshot", "analyze",
         "download", "shards", "experiment", "export"]


def fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "COLUMNS": "120"})


def test_every_verb_is_registered():
    from vitlab.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "verb")
    assert sorted(sub.choices) == sorted(VERBS)


def test_building_the_parser_and_every_help_import_no_torch(tmp_path):
    """Every verb's help, `experiment`'s included (run outside a checkout: the plug-in's launcher has nothing to
    launch and shows its own)."""
    code = f"""
import contextlib, io, os, sys
os.chdir({str(tmp_path)!r})
from vitlab.cli import build_parser
parser = build_parser()
assert "torch" not in sys.modules, "build_parser"
for argv in [["--help"], *[[verb, "--help"] for verb in {VERBS!r}], ["train", "--recipe", "pretrain", "--help"],
             ["finetune", "--recipe", "deit", "--help"]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            parser.parse_args(argv)
        except SystemExit as stop:
            assert stop.code == 0, (argv, stop.code)
    assert out.getvalue().startswith("usage: vitlab"), argv
    assert "torch" not in sys.modules, argv
print("ok")
"""
    done = fresh(code)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_no_help_shows_a_doubled_percent_sign():
    """argparse formats `%` in an option's help but not in a description: '%%' there is printed as it is."""
    from vitlab.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "verb")
    for verb in VERBS:
        assert "%%" not in sub.choices[verb].format_help(), verb


def test_vitlab_models_imports_no_torch():
    done = fresh("import sys\nfrom vitlab.cli import main\nmain(['models'])\nassert 'torch' not in sys.modules")
    assert done.returncode == 0, done.stderr
    assert "ViT-B/16" in done.stdout


@pytest.mark.parametrize("name", ["ViT-Ti/16", "ViT-B/32-gap", "R50+ViT-B/16", "R+ViT-Ti/16", "BiT-R50x1"])
def test_models_listing_counts_the_parameters_of_the_built_model(name, capsys):
    assert main(["models", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == name)
    torch.manual_seed(0)
    built = build_model(model_config(name, num_classes=1000))
    assert row["params"] == sum(p.numel() for p in built.parameters())


@pytest.mark.parametrize("config", [
    ViTConfig(image_size=(32, 48), patch_size=8, width=64, depth=2, mlp_dim=96, num_heads=4, num_classes=7,
              pos_embed="relative", qkv_bias=False),
    ViTConfig(image_size=(32, 32), patch_size=8, width=64, depth=1, mlp_dim=96, num_heads=4, num_classes=0,
              pos_embed="2d", reg_tokens=3, layer_scale=1e-5, representation_size=40),
    ViTConfig(image_size=(32, 32), patch_size=4, width=48, depth=1, mlp_dim=64, num_heads=2, num_classes=5,
              classifier="gap", fc_norm=True, pos_embed="none", in_chans=1),
    ViTConfig(image_size=(32, 32), patch_size=8, width=64, depth=1, mlp_dim=64, num_heads=2, num_classes=5,
              classifier="gap", class_token=True, pos_embed_prefix=False),
    ViTConfig(image_size=(64, 64), patch_size=1, width=32, depth=1, mlp_dim=64, num_heads=2, num_classes=3,
              resnet=ResNetConfig(layers=(1, 2), width_factor=1)),
    BiTConfig(layers=(1, 1, 2, 1), width_factor=1, num_classes=4, in_chans=1),
    BiTConfig(layers=(1, 1), width_factor=2, num_classes=0),
])
def test_parameter_count_from_the_config_matches_the_model(config):
    with torch.device("meta"):
        model = build_model(config)
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())
