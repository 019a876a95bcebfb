"""The training command line and the settings it resolves stay what they were: `vitlab train`/`finetune` offer
the same flags (spelling, arity, choices, metavar, help, group, as --help shows them) and `--print-config json`
prints the same config.json for a scratch run, a recipe, a preset fine-tuning, a fine-tuning from saved weights with
its tools and a replayed config file. The expected values are recorded in fixtures/training_settings.json (run this
file as a script to record them from the code on the path)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "training_settings.json"
TMP = "<TMP>"


def flag_table(verb: str) -> list[dict]:
    """Every option of the verb's parser, as data: what a user can type and what argparse does with it."""
    from vitlab.cli import build_parser

    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = verbs.choices[verb]
    group_of = {id(a): g.title for g in sub._action_groups for a in g._group_actions}
    shown = sub._get_formatter()
    rows = []
    for a in sub._actions:  # the destination is argparse's business; what --help shows for the flag is compared
        rows.append({"flags": list(a.option_strings), "shown": shown._format_action_invocation(a),
                     "nargs": a.nargs, "const": _plain(a.const),
                     "default": _plain(a.default), "choices": _plain(list(a.choices) if a.choices else None),
                     "help": a.help, "group": group_of.get(id(a)),
                     "action": type(a).__name__, "type": getattr(a.type, "__name__", None) if a.type else None})
    return sorted(rows, key=lambda r: r["flags"])


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def run(argv: list[str]) -> tuple[int, str]:
    from vitlab.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue()


def invocations(tmp: Path) -> dict[str, list[str]]:
    """Representative resolutions: each layer (recipe, weights, preset, config file, flags) in play."""
    import vitlab

    weights = tmp / "tiny.safetensors"
    if not weights.exists():
        model = vitlab.create_model("ViT-Ti/4", num_classes=10, image_size=8, depth=1, width=32, num_heads=2,
                                    mlp_dim=64)
        vitlab.save(model, weights)
    config = tmp / "settings.json"
    config.write_text(json.dumps({"recipe": "demo", "lr": 0.002, "steps": 9, "mixup": 0.1, "seed": 3,
                                  "model_args": {"depth": 2}, "flip": True}))
    return {
        "scratch": ["train", "--out", f"{tmp}/a", "--steps", "7", "--lr", "0.01", "--wd", "0.01", "--clip", "0.5",
                    "--betas", "0.8", "0.99", "--depth", "2", "--no-flip", "--ema", "0.99", "--seed", "4"],
        "scratch_recipe": ["train", "--out", f"{tmp}/b", "--recipe", "pretrain", "--data", "digits",
                           "--steps", "10", "--batch-size", "16", "--image-size", "8", "--model", "ViT-Ti/4"],
        "finetune_init": ["finetune", "--init", str(weights), "--data", "digits", "--out", f"{tmp}/c",
                          "--steps", "5", "--lora", "2", "--lora-targets", "qkv,fc1", "--layer-decay", "0.8"],
        "finetune_preset": ["finetune", "--init", str(weights), "--data", "digits", "--out", f"{tmp}/d",
                            "--preset", "cifar10", "--steps", "6", "--batch-size", "8", "--compile", "--lr", "0.01",
                            "--eval-every", "2"],
        "finetune_deit_tools": ["finetune", "--init", str(weights), "--data", "digits", "--out", f"{tmp}/f",
                                "--recipe", "deit", "--steps", "4", "--freeze", "backbone", "--ema-decay", "0.9",
                                "--ema-warmup", "--mixup", "0.2", "--cutmix", "1", "--crop-scale", "0.3", "1"],
        "config_file": ["train", "--config", str(config), "--out", f"{tmp}/e", "--lr", "0.003", "--mixup", "0"],
    }


def print_configs(tmp: Path) -> dict[str, dict]:
    out = {}
    for name, argv in invocations(tmp).items():
        code, text = run([*argv, "--print-config", "json"])
        config = json.loads(text.replace(str(tmp), TMP)) if code == 0 else text
        for decided in ("precision", "attention"):  # an auto choice's reason names this machine's CPU
            if code == 0 and config["sources"].get(decided, "").startswith("auto:"):
                config["sources"][decided] = "auto"
        out[name] = {"code": code, "config": config}
    return out


def snapshot(tmp: Path) -> dict:
    return {"flags": {verb: flag_table(verb) for verb in ("train", "finetune")}, "print_config": print_configs(tmp)}


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("verb", ["train", "finetune"])
def test_flags_unchanged(verb, expected):
    assert json.loads(json.dumps(flag_table(verb))) == expected["flags"][verb]


def test_print_config_unchanged(tmp_path, expected):
    got = json.loads(json.dumps(print_configs(tmp_path)))
    for name in expected["print_config"]:
        assert got[name] == expected["print_config"][name], name


if __name__ == "__main__":  # records the fixture from the code on the path
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        data = snapshot(Path(tmp))
    Path(sys.argv[1] if len(sys.argv) > 1 else FIXTURE).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
