"""Settings read from untrusted places never silently say something the run does not do: --config values of the
wrong type and model flags the model lacks are one line at resolution, --model contradicting --init or
--dev-fraction without a sweep are refused, a damaged checkpoint manifest is one line, and training onto a full or
read-only disk stops in one line naming the fix. Every CLI case: exit code 2, one `vitlab <verb>: error:` line,
the user's files unchanged."""

from __future__ import annotations

import pytest

import vitlab
from tests.weights.test_untrusted import SMALL_RUN, TINY, _fake_run, one_line_error, sha256, tree
from vitlab.cli import main
from vitlab.models import build_model


@pytest.mark.parametrize("text, says", [
    ('steps: "4"', "steps must be an integer, got '4' (a string); write it unquoted"),
    ("steps: [1, 2]", "steps must be an integer, got [1, 2] (a list)"),
    ("steps: 4.5", "steps must be an integer, got 4.5"),
    ("lr: 1e-3", "lr must be a number, got '1e-3' (a string); write it unquoted, with a decimal point (1.0e-3)"),
    ('eval_batch_size: "4"', "eval_batch_size must be an integer"),
    ('flip: "yes"', "flip must be true or false"),
    ("crop_scale: [0.5]", "crop_scale must be a list of 2 numbers"),
    ("betas: 0.9", "betas must be a list of 2 numbers"),
    ("lr_sweep: [0.1, fast]", "lr_sweep must be a list of numbers"),
    ("model_args: [1]", "model_args must be a mapping"),
    ("model_args: {bogus: 1}", "bogus does not apply to ViT-Ti/4"),
    ("model_args: {depth: '2'}", "depth must be a positive integer, got '2'"),
    ("model_args: {image_size: 32}", "set by the run itself"),
    ("model: BiT-R50x1\nmodel_args: {depth: 1}", "--depth does not apply to BiT-R50x1"),
])
def test_config_values_are_type_checked_at_resolution(tmp_path, capsys, text, says):
    config = tmp_path / "settings.yaml"
    config.write_text(text + "\n")
    before = sha256(config)
    one_line_error(capsys, ["train", "--config", str(config), "--print-config"], says)  # --print-config refuses too
    assert sha256(config) == before


@pytest.mark.parametrize("text, says", [
    ("precision: int8", "precision int8 is for the inference verbs only"),
    ("lr: -1", "lr must be a number (finite, >= 0 and <= 100), got -1"),
    ("device: tpu", "unknown device 'tpu'"),
])
def test_a_config_files_value_is_named_as_its_key_in_that_file(tmp_path, capsys, text, says):
    """A value a --config file set, refused by its range or choices, is the file's key after the file's name, not a
    flag nobody passed."""
    config = tmp_path / "settings.yaml"
    config.write_text(text + "\n")
    err = one_line_error(capsys, ["train", "--config", str(config), "--print-config"], f"{config}: {says}")
    assert "--" not in err


@pytest.mark.parametrize("argv, says", [
    (["--model", "BiT-R50x1", "--depth", "1"], "--depth does not apply to BiT-R50x1"),
    (["--model", "BiT-R50x1", "--heads", "2"], "--heads does not apply to BiT-R50x1"),
    (["--depth", "2", "--width", "30", "--heads", "4"], "width 30 is not divisible by num_heads 4"),
])
def test_model_flags_the_model_lacks_are_refused_at_resolution(capsys, argv, says):
    one_line_error(capsys, ["train", *argv, "--print-config"], says)


def test_a_config_model_builds_what_the_same_flag_builds(tmp_path):
    from vitlab.train.resolution import resolve

    config = tmp_path / "settings.yaml"
    config.write_text("model: ViT-Ti/16\n")
    by_file = resolve(None, {}, config_file=str(config)).config
    by_flag = resolve(None, {"model": "ViT-Ti/16"}).config
    assert by_file.model == by_flag.model == "ViT-Ti/16"
    assert by_file.model_args == by_flag.model_args == {}  # the real ViT-Ti/16, not the demo's width and depth
    kept = tmp_path / "kept.yaml"  # a file naming both keeps its own model arguments
    kept.write_text("model: ViT-Ti/16\nmodel_args: {depth: 2}\n")
    assert resolve(None, {}, config_file=str(kept)).config.model_args == {"depth": 2}


def test_training_onto_a_full_disk_is_one_line(tmp_path, capsys, small_mount):
    """The run's first weights do not fit: one line naming the file and the way on, no half-written file."""
    target = small_mount(size="32k")
    err = one_line_error(capsys, ["train", "--out", str(target / "run"), *SMALL_RUN, "--steps", "2"],
                         "No space left on device", "continue with --resume")
    assert "safetensors" in err
    assert not [p.name for p in (target / "run").rglob("*") if "tmp" in p.name]


def test_training_into_a_read_only_folder_is_one_line(tmp_path, capsys, small_mount):
    target = small_mount(read_only=True)
    one_line_error(capsys, ["train", "--out", str(target / "run"), *SMALL_RUN], "Read-only file system")


def test_finetune_model_contradicting_init_is_refused(tmp_path, capsys):
    run = _fake_run(tmp_path)
    before = tree(run)
    one_line_error(capsys, ["finetune", "--init", str(run), "--model", "ViT-B/16", "--data", "digits",
                            "--print-config"], "--model ViT-B/16 (flag) contradicts --init", "width 32, not 768")
    one_line_error(capsys, ["finetune", "--init", str(run), "--depth", "2", "--data", "digits", "--print-config"],
                   "--depth 2 (flag) contradicts --init", "(depth 1, not 2)")
    one_line_error(capsys, ["finetune", "--init", str(run), "--model", "ViT-Ti/8", "--width", "32", "--data",
                            "digits", "--print-config"], "--model ViT-Ti/8 (flag) and --width 32 (flag) contradict")
    own = "ViT/8 (depth 1, width 32, 2 heads, MLP 64)"  # the weights' own label, or flags that repeat them: the same
    for same in (["--model", own], ["--depth", "1"], ["--model", "ViT-Ti/8", "--depth", "1", "--width", "32",
                                                     "--heads", "2", "--mlp-dim", "64"]):
        assert main(["finetune", "--init", str(run), *same, "--data", "digits", "--print-config"]) == 0, same
    assert tree(run) == before


def test_finetune_model_naming_the_same_network_is_kept(tmp_path, capsys):
    from vitlab.train.resolution import resolve

    model = vitlab.create_model("ViT-Ti/16", image_size=16, num_classes=3)
    weights = tmp_path / "ti16.safetensors"
    vitlab.save(model, weights)
    resolved = resolve("finetune", {"init": str(weights), "model": "ViT-Ti/16", "data": "digits"})
    assert resolved.config.model == "ViT-Ti/16" and resolved.sources["model"] == "flag"
    with pytest.raises(ValueError, match="ViT-S/16 .* contradicts --init"):
        resolve("finetune", {"init": str(weights), "model": "ViT-S/16", "data": "digits"})


def test_dev_fraction_without_a_sweep_is_refused(tmp_path, capsys):
    run = _fake_run(tmp_path)
    one_line_error(capsys, ["finetune", "--init", str(run), "--data", "digits", "--dev-fraction", "0.1",
                            "--print-config"], "--dev-fraction holds out the dev split of a learning-rate sweep")
    from vitlab.train.resolution import resolve

    swept = resolve("finetune", {"lr_sweep": (0.01, 0.03), "dev_fraction": 0.1}).config
    assert swept.dev_fraction == 0.1 and swept.lr_sweep == (0.01, 0.03)
    one_lr = resolve("finetune", {"preset": "pets", "lr": 0.01}).config  # the preset's split, its sweep cleared
    assert one_lr.lr_sweep == ()


def test_a_checkpoint_manifest_that_is_a_list_is_one_line(tmp_path, capsys):
    from vitlab.train.checkpoint import write_checkpoint

    model = build_model(TINY)
    ckpt = write_checkpoint(tmp_path / "run", 1, model.state_dict(), TINY, ["a", "b", "c"], {"step": 1})
    (ckpt / "manifest.json").write_text("[1, 2]")
    before = tree(tmp_path)
    one_line_error(capsys, ["info", str(ckpt)], "damaged checkpoint")
    assert tree(tmp_path) == before


def test_the_first_checkpoint_on_a_full_disk_is_one_line(tmp_path, capsys, small_mount):
    target = small_mount(size="96k")  # config, metrics and best.safetensors fit; the checkpoint's state.pt does not
    one_line_error(capsys, ["train", "--out", str(target / "run"), *SMALL_RUN, "--steps", "2"],
                   "No space left on device", "continue with --resume")
    assert not (target / "run" / "checkpoints").exists() or not list((target / "run" / "checkpoints").iterdir())
