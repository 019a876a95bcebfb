"""One resolution step decides a run's settings, each with its source: initial weights before the recipe,
presets and flags after, warm-up rule, resume refusals, banner, --print-config and exact replay of a config."""

import json

import pytest

import vitlab
from tests.conftest import TINY_VIT_FLAGS
from vitlab.cli import main
from vitlab.train import resolve

TINY = [*TINY_VIT_FLAGS, "--image-size",
        "8", "--batch-size", "32", "--warmup", "1", "--workers", "0", "--log-every", "1", "--eval-every", "2"]


def demo_like_weights(tmp_path):
    """A run of the demo recipe's kind (16 px, sub-pixel crops of at least half the area, no flip)."""
    out = tmp_path / "demo"
    assert main(["train", "--out", str(out), "--steps", "2", "--model", "ViT-Ti/4", "--depth", "1", "--width", "32",
                 "--heads", "2", "--mlp-dim", "64", "--workers", "0", "--warmup", "1"]) == 0
    return out


def test_finetuning_follows_the_initial_weights(tmp_path, capsys):
    """`finetune --init runs/demo --data digits` used the paper's ViT-B/16 settings (384 px, 5% crops): the
    weights' resolution, pre-processing and architecture name come first, and say so."""
    demo = demo_like_weights(tmp_path)
    capsys.readouterr()
    resolved = resolve("finetune", {"init": str(demo), "data": "digits"}, verb="finetune")
    cfg, sources = resolved.config, resolved.sources
    assert (cfg.image_size, cfg.train_crop, cfg.crop_scale, cfg.flip) == (16, "inception-subpixel", (0.5, 1.0), False)
    assert sources["image_size"] == f"weights {demo}" and sources["crop_scale"] == f"weights {demo}"
    assert cfg.model == "ViT/4 (depth 1, width 32, 2 heads, MLP 64)"  # what it is, not "ViT-B/16" or "ViT-Ti/4"
    assert cfg.optimizer == "sgd" and sources["optimizer"] == "recipe finetune"
    # a preset or a flag wins over the weights, and the resolution change is a note
    tuned = resolve("finetune", {"init": str(demo), "data": "digits", "image_size": 32}, verb="finetune")
    assert tuned.config.image_size == 32 and tuned.sources["image_size"] == "flag"
    assert any("fine-tuning at 32×32 px (flag); the weights were trained at 16×16" in n for n in tuned.notes)


def test_resume_refuses_contradicting_flags_and_accepts_safe_ones(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "4", *TINY]) == 0
    stored = (out / "config.json").read_text()
    for argv, message in [
        (["--lr", "0.5"], r"--lr 0.5 contradicts the run in .*run \(stored: 0.002\); resume without it"),
        (["--width", "64"], r"--width 64 contradicts the run in .*run \(stored: 32\)"),
        (["--batch-size", "8"], r"--batch-size 8 contradicts the run .*stored: 32"),
        (["--recipe", "pretrain"], r"--recipe pretrain contradicts the run in .* \(recipe demo\)"),
        (["--steps", "2"], r"--steps 2 is below the run's 4"),
    ]:
        with pytest.raises(ValueError, match=message):
            main_raising(["train", "--out", str(out), "--resume", *argv])
        assert (out / "config.json").read_text() == stored  # never rewritten with values it did not use
    assert main(["train", "--out", str(out), "--resume", "--steps", "6", "--log-every", "2"]) == 0
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["steps"] == 6 and recorded["sources"]["steps"] == "flag (on resume)"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    resume = [r for r in records if r["split"] == "resume"]
    assert resume == [{"step": 4, "split": "resume", "changed": {"steps": [4, 6], "log_every": [1, 2]}}]


def main_raising(argv):
    """The CLI's resolution step without main()'s error printing, to read the message."""
    from vitlab.cli import build_parser
    from vitlab.cli.train import build_config

    return build_config(build_parser().parse_args(argv))


def test_banner_lists_model_data_settings_and_sources(tmp_path, capsys, caplog):
    caplog.set_level("INFO", logger="vitlab")
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "2", *TINY]) == 0
    text = caplog.text
    params = sum(p.numel() for p in vitlab.load(out / "model.safetensors").parameters())
    assert f"model   ViT/4 (depth 1, width 32, 2 heads, MLP 64): {params:,} parameters" in text
    assert "multiply-adds per 8×8 image" in text
    assert "data    digits: 10 classes, 1,438 train / 359 val images at 8 px; train inception-subpixel crop" in text
    assert "devices cpu × 1 process" in text
    assert "steps 2" in text and "from flag: " in text and "from recipe demo: " in text and "lr 0.002" in text
    log = (out / "console.log").read_text()
    assert "model   ViT/4 (depth 1" in log and "step 2: val loss" in log


def test_print_config_shows_every_value_with_its_source(capsys):
    assert main(["finetune", "--init", "nowhere", "--print-config", "--data", "digits"]) == 2  # weights are read
    capsys.readouterr()
    assert main(["train", "--recipe", "pretrain-jft", "--model", "ViT-H/14", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert "from recipe pretrain-jft, paper Table 3 row ViT-H/14: lr 0.0003, steps 1,035,644" in text.replace(
        "steps 1035644", "steps 1,035,644")
    assert "from recipe pretrain-jft: as wide as the model: representation_size 1280" in text


def test_config_replay_is_bit_identical(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "--out", str(a), "--steps", "3", "--seed", "4", *TINY]) == 0
    assert main(["train", "--config", str(a / "config.json"), "--out", str(b)]) == 0
    recorded_a, recorded_b = (json.loads((d / "config.json").read_text()) for d in (a, b))
    assert {k: v for k, v in recorded_a.items() if k not in ("out", "sources")} == {
        k: v for k, v in recorded_b.items() if k not in ("out", "sources")}
    assert set(recorded_b["sources"].values()) == {f"config {a / 'config.json'}", "flag", "default"}
    assert recorded_b["sources"]["lr"] == f"config {a / 'config.json'}" and recorded_b["sources"]["out"] == "flag"
    wa = vitlab.load(a / "model.safetensors").state_dict()
    wb = vitlab.load(b / "model.safetensors").state_dict()
    assert all((wa[k] == wb[k]).all() for k in wa)


def test_config_file_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "c.json"
    bad.write_text('{"lr": 0.1, "lerning_rate": 3}')
    assert main(["train", "--config", str(bad), "--print-config"]) == 2
    assert "unknown settings in --config" in capsys.readouterr().err and "lerning_rate" in bad.read_text()
    yaml = tmp_path / "c.yaml"
    yaml.write_text("lr: 0.1\nsteps: 7\nrecipe: demo\n")
    assert main(["train", "--config", str(yaml), "--print-config"]) == 0
    assert f"from config {yaml}: " in capsys.readouterr().out


def test_recipe_model_arguments_are_dropped_for_another_model():
    """The demo recipe's model arguments (depth 4, width 128, …) describe its own ViT: `--model BiT-R50x1`
    with the demo recipe builds the BiT, not a traceback about ViT-only arguments."""
    resolved = resolve("demo", {"model": "BiT-R50x1"})
    assert resolved.config.model_args == {}
    assert any("recipe demo's model arguments (depth, mlp_dim, num_heads, width) not applied" in n
               for n in resolved.notes)


def test_every_flag_of_every_verb_has_help():
    import argparse

    from vitlab.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"models", "bench", "info", "convert", "train", "finetune", "eval", "predict",
                                "recipes", "fewshot", "analyze", "download", "shards", "experiment", "export"}
    for verb, parser in sub.choices.items():
        missing = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
        assert missing == [], (verb, missing)


def test_models_built_from_one_read_of_the_weights_do_not_share_them(tmp_path):
    """The resolution step reads --init once and the sweep builds every learning rate's model from that read:
    training one must not change the weights the next one starts from."""
    import torch

    from vitlab.train.trainer import build_run_model

    source = vitlab.create_model("ViT-Ti/16", image_size=32, depth=1, num_classes=3)
    vitlab.save(source, tmp_path / "init.safetensors")
    resolved = resolve("finetune", {"init": str(tmp_path / "init.safetensors"), "data": "digits", "steps": 5})
    first = build_run_model(resolved.config, ["a", "b"], init=resolved.init)
    with torch.no_grad():
        for p in first.parameters():
            p.add_(1.0)  # what training does to it, in place
    second = build_run_model(resolved.config, ["a", "b"], init=resolved.init)
    kept = source.state_dict()
    assert all(torch.equal(v, kept[k]) for k, v in second.state_dict().items() if not k.startswith("head."))


def test_finetuning_weights_of_a_timm_name_evaluates_with_timms_pipeline(tmp_path):
    """Weights of a timm-named model carry timm's pipeline as their evaluation resize: a fine-tune from them
    evaluates so (a value the --eval-resize flag does not offer, taken from the weights), unless a flag says
    otherwise."""
    weights = tmp_path / "deit.safetensors"
    vitlab.save(vitlab.create_model("deit_tiny_patch16_224", img_size=16, depth=1), weights)
    resolved = resolve("finetune", {"init": str(weights), "data": "digits"}, verb="finetune")
    assert resolved.config.eval_resize == "timm:bicubic:0.9"
    assert resolved.sources["eval_resize"] == f"weights {weights}"
    flagged = resolve("finetune", {"init": str(weights), "data": "digits", "eval_resize": "official"}, verb="finetune")
    assert flagged.config.eval_resize == "official"
