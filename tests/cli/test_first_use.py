"""`vitlab train` and `vitlab finetune` as a user meets them: console.log keeps every line under a progress bar,
TensorBoard only with --tb, the rerun of a finished run says what it did, and on a folder the resolution, model
and schedule follow the data."""

from __future__ import annotations

import sys

from tests.conftest import TINY_VIT_FLAGS
from vitlab.cli import main

TINY_FLAGS = [*TINY_VIT_FLAGS, "--image-size", "8", "--batch-size", "16", "--warmup", "1", "--workers", "0"]


def _train(out, *extra: str) -> int:
    return main(["train", "--out", str(out), *TINY_FLAGS, *extra])


# --- logs a user can read afterwards ---------------------------------------------------------------------------


def test_console_log_keeps_every_line_under_a_progress_bar(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the tqdm bar replaces the step lines
    assert _train(tmp_path / "run", "--steps", "4", "--log-every", "2", "--eval-every", "2") == 0
    terminal = capsys.readouterr()
    assert "step 2/4  loss" not in terminal.err  # the bar shows progress on screen
    text = (tmp_path / "run" / "console.log").read_text()
    assert "step 2/4  loss" in text and "step 4/4  loss" in text
    assert "step 2: val loss" in text and "step 4: val loss" in text
    assert "done: step 4, val top-1" in text.splitlines()[-1]


def test_console_log_without_a_bar_has_the_done_line_once(tmp_path, capsys):
    assert _train(tmp_path / "run", "--steps", "2", "--log-every", "1") == 0
    text = (tmp_path / "run" / "console.log").read_text()
    assert "step 1/2  loss" in text and text.count("done: step 2") == 1


def test_rerun_of_a_finished_run_says_what_it_did(tmp_path, capsys):
    assert _train(tmp_path / "run", "--steps", "2") == 0
    capsys.readouterr()
    assert main(["train", "--out", str(tmp_path / "run"), "--resume"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"done: {tmp_path / 'run'} had already finished its 2 steps; nothing trained, its final "
                           "weights evaluated again in")
    assert "img/s" not in line and "val top-1" in line
    assert (tmp_path / "run" / "console.log").read_text().rstrip().endswith(line)


def test_tensorboard_only_with_tb(tmp_path, monkeypatch, capsys):
    import types

    made = []

    class Writer:  # stands in for torch.utils.tensorboard.SummaryWriter (installed or not on this machine)
        def __init__(self, log_dir):
            made.append(log_dir)

        def add_scalar(self, tag, value, step):
            pass

        def close(self):
            pass

    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    assert _train(tmp_path / "plain", "--steps", "1") == 0
    assert made == []  # installed, but not asked for
    assert _train(tmp_path / "tb", "--steps", "1", "--tb") == 0
    assert made == [str(tmp_path / "tb" / "tensorboard")]
    assert _train(tmp_path / "after", "--steps", "1") == 0  # an earlier --tb in the process does not stay on
    assert len(made) == 1
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # not installed: --tb is one line, exit 2
    assert _train(tmp_path / "missing", "--steps", "1", "--tb") == 2
    assert "--tb needs the tensorboard package: pip install 'vitlab[tb]'" in capsys.readouterr().err


# --- defaults that follow the user's data ------------------------------------------------------------------------


def _folder(root, size_hw, per_class):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("val", 2)):
        for name in ("cat", "dog"):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                pixels = rng.integers(0, 255, (*size_hw, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return str(root)


def test_train_on_a_folder_takes_resolution_model_and_schedule_from_it(tmp_path):
    from vitlab.train.banner import settings_lines
    from vitlab.train.resolution import resolve

    photos = _folder(tmp_path / "photos", (150, 200), per_class=20)
    r = resolve(None, {"data": photos, "out": str(tmp_path / "r")}, verb="train")
    c = r.config
    # 40 images of 150×200 (>= 96×96): 224 px, the demo trunk on 16×16 patches, the official crop and flip;
    # ~89 epochs (the demo's 1000 steps of 128 on 1,438 images) at batch 4 (a power of two <= 40/8)
    assert (c.model, c.model_args, c.image_size) == ("ViT-Ti/16", {"depth": 4, "width": 128, "num_heads": 4,
                                                                    "mlp_dim": 256}, 224)
    assert (c.batch_size, c.steps, c.warmup, c.eval_every) == (4, round(1000 * 128 / 1438 * 40 / 4), 89, 222)
    assert (c.train_crop, c.crop_scale, c.flip) == ("inception", (0.05, 1.0), True)
    assert r.sources["image_size"].startswith("data rule on 40 training images")
    text = " ".join(" ".join(settings_lines(r)).split())  # the banner's lines, unwrapped
    assert "note: demo on" in text and "224 px (images 150×200 >= 96×96" in text
    small = resolve(None, {"data": _folder(tmp_path / "icons", (20, 20), 10), "out": str(tmp_path / "s")},
                    verb="train").config
    assert (small.model, small.image_size, small.flip, small.train_crop) == ("ViT-Ti/4", 24, False,
                                                                              "inception-subpixel")
    # flags win, and what depends on them follows: 32 px takes 4×4 patches; 100 steps keep the demo's 10% warm-up
    given = resolve(None, {"data": photos, "image_size": 32, "steps": 100, "out": str(tmp_path / "g")},
                    verb="train").config
    assert (given.model, given.image_size, given.steps, given.warmup) == ("ViT-Ti/4", 32, 100, 10)
    mine = resolve(None, {"data": photos, "model": "ViT-S/16", "out": str(tmp_path / "m")}, verb="train").config
    assert (mine.model, mine.model_args) == ("ViT-S/16", {})
    # the demo itself is untouched
    demo = resolve(None, {"out": str(tmp_path / "d")}, verb="train").config
    assert (demo.image_size, demo.steps, demo.batch_size) == (16, 1000, 128)


def test_finetune_schedule_follows_the_size_of_the_data(tmp_path):
    from vitlab.train.resolution import resolve

    photos = _folder(tmp_path / "photos", (40, 40), per_class=150)  # 300 training images
    c = resolve("finetune", {"data": photos, "out": str(tmp_path / "f")}, verb="finetune").config
    # < 20k images: Table 4's 500-step rows, capped at the Flowers row's 251 epochs; batch 256 (<= 300)
    assert (c.batch_size, c.steps, c.warmup) == (256, 295, 59) and c.steps * c.batch_size < 10_000 * 512
    preset = resolve("finetune", {"data": photos, "preset": "pets", "out": str(tmp_path / "p")},
                     verb="finetune").config
    assert (preset.steps, preset.batch_size) == (500, 512)  # a preset is a choice: kept
    from vitlab.train.rules import finetune_defaults

    assert finetune_defaults(50_000)[0] == {"batch_size": 512, "steps": 10_000, "warmup": 500}  # CIFAR's row
    assert finetune_defaults(1_281_167)[0]["steps"] == 20_000  # ImageNet's row
