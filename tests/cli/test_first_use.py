"""What a user reads after a run and meets first: console.log under a progress bar, TensorBoard only with --tb,
the rerun of a finished run, offline failures in one attempt, defaults that follow the data, papercuts."""

from __future__ import annotations

import sys

import pytest

from vitlab.cli import main

TINY_FLAGS = ["--model", "ViT-Ti/4", "--depth", "1", "--width", "32", "--heads", "2", "--mlp-dim", "64",
              "--image-size", "8", "--batch-size", "16", "--warmup", "1", "--workers", "0"]


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


# --- offline is fast ---------------------------------------------------------------------------------------------


def test_a_host_that_does_not_resolve_fails_at_once_with_the_offline_line(tmp_path, monkeypatch):
    import socket

    from vitlab.errors import WeightsError
    from vitlab.hub import download as hub_download
    from vitlab.hub.catalogue import Entry
    from vitlab.hub.fetch import fetch

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VITLAB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    lookups, sleeps = [], []

    def no_dns(host, *args, **kwargs):  # what a machine without network answers
        lookups.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(hub_download.time, "sleep", sleeps.append)
    entry = Entry(name="augreg:test", tag="augreg", model="ViT-Ti/16", format="jax-npz",
                  url="https://storage.googleapis.com/vit_models/augreg/test.npz")
    with pytest.raises(WeightsError) as online:
        fetch(entry, progress=False)
    assert lookups == ["storage.googleapis.com"] and sleeps == []  # one attempt, no retries
    monkeypatch.setenv("VITLAB_OFFLINE", "1")
    with pytest.raises(WeightsError) as offline:
        fetch(entry, progress=False)
    assert len(lookups) == 1  # offline mode does not even look the host up
    online_line, offline_line = str(online.value), str(offline.value)
    assert online_line == offline_line.replace("VITLAB_OFFLINE=1 forbids downloading",
                                               "storage.googleapis.com does not resolve (offline?)")
    assert online_line.endswith("; run `vitlab download augreg:test` where the network is reachable")
    assert "\n" not in online_line
    assert not any(p.name.endswith(".part") for p in (tmp_path / "cache").rglob("*"))  # nothing half-written


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
    from vitlab.train.resolve import resolve
    from vitlab.train.runlog import settings_lines

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
    from vitlab.train.resolve import resolve

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


# --- papercuts ---------------------------------------------------------------------------------------------------


@pytest.fixture
def three_class_weights(tmp_path):
    import vitlab

    model = vitlab.create_model("ViT-Ti/4", num_classes=3, image_size=8, depth=1, width=32, num_heads=2, mlp_dim=64)
    path = tmp_path / "three.safetensors"
    vitlab.save(model, path)  # no class names: a model built in Python, never trained on named data
    return path


def test_weights_without_class_names_name_classes_by_index(three_class_weights):
    import numpy as np

    import vitlab

    model = vitlab.load(three_class_weights)
    assert model.class_names == ["0", "1", "2"]
    x = vitlab.transforms(model)(np.zeros((8, 8, 3), dtype=np.uint8))  # the README quick start, line by line
    probs = model(x[None]).softmax(-1)[0]
    assert model.class_names[probs.argmax()] in ("0", "1", "2")


def test_predict_takes_a_folder_and_warns_about_top_k_only_when_given(tmp_path, three_class_weights, capsys,
                                                                       caplog):
    import numpy as np
    from PIL import Image

    for name in ("b/2.png", "a/1.png", "a/notes.txt"):
        (tmp_path / "imgs" / name).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".png"):
            Image.fromarray(np.full((8, 8, 3), 9, dtype=np.uint8)).save(tmp_path / "imgs" / name)
        else:
            (tmp_path / "imgs" / name).write_text("not an image")
    with caplog.at_level("WARNING", logger="vitlab"):
        assert main(["predict", "--weights", str(three_class_weights), str(tmp_path / "imgs")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [str(tmp_path / "imgs" / "a" / "1.png"),
                                                       str(tmp_path / "imgs" / "b" / "2.png")]
    assert all(line.count("%") == 3 for line in lines)  # a 3-class model shows its 3 classes
    assert "top-k" not in caplog.text  # the default was not the user's choice: no warning
    with caplog.at_level("WARNING", logger="vitlab"):
        assert main(["predict", "--weights", str(three_class_weights), "--top-k", "5",
                     str(tmp_path / "imgs" / "a" / "1.png")]) == 0
    assert "top-k 5 is more than the model's 3 classes: showing all 3" in caplog.text
    capsys.readouterr()  # the calls above end with their summary line on stderr
    (tmp_path / "empty").mkdir()
    assert main(["predict", "--weights", str(three_class_weights), str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'empty'} is a folder without images" in err and err.count("\n") == 1


def test_long_confusion_titles_wrap_inside_the_figure(tmp_path):
    import torch
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from vitlab.eval.metrics import confusion_figure, plot_confusion_matrix

    title = "Confusion matrix of " + "/very/long/run/directory/name" * 6 + " on a dataset with a long name"
    names = ["a class whose name goes on and on and on", "b", "c"]
    fig = confusion_figure(torch.eye(3, dtype=torch.long), names, title)
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    box, frame = ax.title.get_window_extent(), fig.bbox
    assert "\n" in ax.title.get_text() and frame.x0 <= box.x0 and box.x1 <= frame.x1  # wrapped, not cut off
    assert "".join(ax.title.get_text().split()) == "".join(title.split())  # every character kept
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0] == "a class whose name goes…" and ticks[1:] == ["b", "c"]
    assert plot_confusion_matrix(torch.eye(3, dtype=torch.long), names, tmp_path / "c.png", title).stat().st_size


def test_timm_card_snippet_with_pretrained_cfg_overlay_runs_and_needs_num_classes(tmp_path, monkeypatch):
    import re

    import torch

    import vitlab
    from vitlab.weights.timm import write_timm

    timm = pytest.importorskip("timm")
    model = vitlab.create_model("ViT-Ti/16", num_classes=3, image_size=32).eval()
    folder = tmp_path / "export"
    write_timm(model, folder)
    card = (folder / "README.md").read_text()
    assert "`pretrained_cfg_overlay` needs `num_classes` (3 here)" in card
    snippet = re.findall(r"```python\n(.*?)```", card, re.S)[-1]
    assert "num_classes=3" in snippet
    monkeypatch.chdir(tmp_path)  # the card names the folder as it is, beside the reader
    scope: dict = {}
    exec(snippet, scope)  # the card's own code, as a user would paste it  # noqa: S102
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(scope["model"](x), model(x), rtol=1e-5, atol=1e-5)
    without, scope = snippet.replace(", num_classes=3", ""), {}
    exec(without, scope)  # what the card warns about: it loads, with the file's head left out  # noqa: S102
    with torch.no_grad():
        assert not torch.allclose(scope["model"].head.weight, model.head.weight)
        torch.testing.assert_close(scope["model"].forward_features(x), model.forward_features(x), rtol=1e-5,
                                   atol=1e-5)  # the trunk loaded, the classifier did not
    assert timm.__version__


def test_hugging_face_hub_without_dns_reads_the_cache_at_once(tmp_path, monkeypatch):
    """huggingface_hub retries an unresolvable host 5 times (~25 s) before its cache; one lookup decides it."""
    import socket

    import vitlab
    from vitlab.errors import WeightsError

    pytest.importorskip("transformers")
    pytest.importorskip("huggingface_hub")
    from tests.hub.test_hf import hf_cache as make_cache

    make_cache.__wrapped__(tmp_path, monkeypatch)  # the cached tiny-owner/tiny-vit repository
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # no proxy: the hub's own name must resolve
    lookups = []

    def no_dns(host, *args, **kwargs):
        lookups.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    assert vitlab.load("hf-hub:tiny-owner/tiny-vit").class_names == ["cat", "dog", "bird"]  # from the cache
    with pytest.raises(WeightsError) as err:
        vitlab.load("hf-hub:google/vit-base-patch16-224")
    assert str(err.value) == ("hf-hub:google/vit-base-patch16-224: config.json not in the Hugging Face cache and "
                              "huggingface.co does not resolve (offline?); run `vitlab download "
                              "hf-hub:google/vit-base-patch16-224` where the network is reachable")
    assert set(lookups) == {"huggingface.co"} and len(lookups) <= 4  # no retries: one lookup per load
