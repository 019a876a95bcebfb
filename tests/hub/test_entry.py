"""Published checkpoints by name end to end, against the local server of test_hub_download: vitlab.load(model,
pretrained=TAG), `--init`/`--weights` names, the AugReg index, `vitlab download` and `vitlab models --pretrained`."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import vitlab
from tests.hub.test_download import FileServer
from vitlab.cli import main
from vitlab.hub import augreg, catalogue
from vitlab.hub.catalogue import Entry
from vitlab.models import ViTConfig
from vitlab.models.registry import build_model
from vitlab.weights.jax_npz import write_jax_npz

# A real ViT-Ti/16 (at 32 px): the catalogue entries below promise one, and loading checks what the file holds.
TINY = ViTConfig(image_size=32, patch_size=16, width=192, depth=12, mlp_dim=768, num_heads=3, num_classes=1000,
                 gelu="tanh")


@pytest.fixture
def server():
    s = FileServer()
    yield s
    s.close()


@pytest.fixture
def source(tmp_path):
    """A tiny ViT and its official .npz bytes: what the publisher would have uploaded."""
    torch.manual_seed(0)
    model = build_model(TINY).eval()
    with torch.no_grad():
        model.head.weight.normal_(0, 0.1)  # a non-zero head, so the logits tell the weights apart
    write_jax_npz(model, tmp_path / "tiny.npz")
    return model, (tmp_path / "tiny.npz").read_bytes()


@pytest.fixture
def published(server, source, tmp_path, monkeypatch):
    """The catalogue plus one entry, test-ft:ViT-Ti/16, served by the local server; an empty cache."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    for var in ("VITLAB_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    server.files["/vit_models/tiny.npz"] = source[1]
    entry = Entry(name="test-ft:ViT-Ti/16", tag="test-ft", model="ViT-Ti/16", format="jax-npz",
                  url=server.url("/vit_models/tiny.npz"), pretrain="i21k", finetune="i1k", resolution=32,
                  num_classes=1000, classes="imagenet1k", eval_resize="official", licence="Apache-2.0")
    real_entries, real_tags = catalogue.entries(), catalogue.tags()
    monkeypatch.setattr(catalogue, "entries", lambda: (*real_entries, entry))
    monkeypatch.setattr(catalogue, "tags", lambda: {**real_tags, "test-ft": "a tiny test checkpoint"})
    return entry


def logits(model, seed=1):
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x)


def test_load_by_model_and_tag_downloads_once_and_matches_the_source(published, source, server):
    model = vitlab.load("ViT-Ti/16", pretrained="test-ft")
    torch.testing.assert_close(logits(model), logits(source[0]), rtol=1e-5, atol=1e-6)
    assert model.class_names[:2] == ["tench, Tinca tinca", "goldfish, Carassius auratus"]
    assert model.hub_entry["name"] == "test-ft:ViT-Ti/16" and model.hub_entry["eval_resize"] == "official"
    again = vitlab.load("test-ft:ViT-Ti/16", image_size=64, num_classes=10)  # the one-string name, cached
    assert again.config.image_size == (64, 64) and again.config.num_classes == 10
    assert again.class_names == [str(i) for i in range(10)]  # a new head has no names: the indices
    assert len(server.log) == 1


def test_names_work_where_weights_paths_do(published, source, server, monkeypatch):
    from vitlab.runtime.session import open_session
    from vitlab.weights.locate import locate as resolve_weights

    path = resolve_weights("test-ft:ViT-Ti/16")  # what --init and --weights go through
    assert path.read_bytes() == source[1]
    monkeypatch.setenv("VITLAB_OFFLINE", "1")  # cached: offline runs load it without the network
    names = open_session("test-ft:ViT-Ti/16", device="cpu", precision="fp32").class_names
    assert names[0] == "tench, Tinca tinca" and len(names) == 1000  # predict prints names, not indices
    assert resolve_weights(path) == path  # a path stays a path
    assert len(server.log) == 1


def test_augreg_run_by_filename_through_the_index(published, source, server, tmp_path, monkeypatch):
    from tests.hub.test_catalogue import write_index

    name = "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384"
    write_index(tmp_path / "index.csv", [{"name": "Ti/16", "ds": "i21k", "filename": name.split("--")[0],
                                          "adapt_ds": "imagenet2012", "adapt_resolution": "384",
                                          "adapt_final_test": "0.7822", "adapt_filename": name}])
    server.files["/augreg/index.csv"] = (tmp_path / "index.csv").read_bytes()
    server.files[f"/augreg/{name}.npz"] = source[1]
    index = dataclasses.replace(augreg.index_entry(), url=server.url("/augreg/index.csv"))
    monkeypatch.setattr(augreg, "index_entry", lambda: index)
    monkeypatch.setattr(augreg, "AUGREG_URL", server.url("/augreg/"))
    model = vitlab.load(f"augreg:{name}")
    torch.testing.assert_close(logits(model), logits(source[0]), rtol=1e-5, atol=1e-6)
    assert model.hub_entry["name"] == f"augreg:{name}" and model.class_names[0] == "tench, Tinca tinca"
    assert [p for p, _ in server.log] == ["/augreg/index.csv", f"/augreg/{name}.npz"]


def test_cli_download_and_pretrained_listing(published, server, capsys):
    assert main(["download", "--quiet", "test-ft:ViT-Ti/16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("test-ft:ViT-Ti/16 -> ") and "tiny.npz" in out
    assert main(["download", "--verify", "test-ft:ViT-Ti/16"]) == 0
    assert "test-ft:ViT-Ti/16: ok" in capsys.readouterr().out
    assert main(["models", "--pretrained", "--model", "ViT-Ti/16", "--resolution", "32"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("test-ft:")]
    assert rows and rows[0].split()[1:3] == ["i21k>i1k", "32"] and rows[0].endswith("yes")
    assert main(["models", "--pretrained", "--model", "ViT-B/16", "--dataset", "i1k", "--resolution", "384"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines() if ":" in line.split()[0]}
    assert {"augreg-i21k-ft-i1k:ViT-B/16", "i21k-ft-i1k:ViT-B/16", "hf-hub:google/vit-base-patch16-384"} <= listed
    assert "augreg-i21k:ViT-B/16" not in listed  # 224, not fine-tuned


def test_cli_unknown_name_is_one_line(published, capsys):
    assert main(["download", "augreg-i21k:ViT-Q/7"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no published checkpoint 'augreg-i21k:ViT-Q/7'" in err


def test_a_path_named_like_a_tag_is_still_a_path(tmp_path, source, monkeypatch):
    folder = tmp_path / "i21k:exp"  # a run folder whose name starts with a tag
    folder.mkdir()
    (folder / "w.npz").write_bytes(source[1])
    monkeypatch.chdir(tmp_path)
    torch.testing.assert_close(logits(vitlab.load("i21k:exp/w.npz")), logits(source[0]), rtol=1e-5, atol=1e-6)


def test_finetune_and_predict_take_a_catalogue_name(published, server, tmp_path, capsys):
    import json

    import numpy as np
    from PIL import Image

    from vitlab.hub import imagenet_classes

    for c in ("a", "b", "c"):
        for split in ("train", "val"):
            (tmp_path / "data" / split / c).mkdir(parents=True)
            for i in range(3):
                colour = (80 * "abc".index(c), 40 * i, 0)
                Image.new("RGB", (20, 20), colour).save(tmp_path / "data" / split / c / f"{i}.png")
    out = tmp_path / "ft"
    assert main(["finetune", "--init", "test-ft:ViT-Ti/16", "--data", str(tmp_path / "data"), "--out", str(out),
                 "--image-size", "16", "--steps", "1", "--batch-size", "9", "--warmup", "1", "--workers", "0"]) == 0
    tuned = vitlab.load(out / "model.safetensors")
    assert tuned.config.image_size == (16, 16) and tuned.class_names == ["a", "b", "c"]
    image = tmp_path / "x.png"
    Image.fromarray((np.random.RandomState(0).rand(32, 32, 3) * 255).astype(np.uint8)).save(image)
    capsys.readouterr()
    assert main(["predict", "--weights", "test-ft:ViT-Ti/16", "--json", str(image)]) == 0
    top = json.loads(capsys.readouterr().out)[0]["top"]
    names = [name for _, name in imagenet_classes()]
    assert all(t["class"] == names[t["index"]] for t in top)  # names, not indices
    assert len(server.log) == 1


def test_published_eval_resize_is_what_eval_and_transforms_use(tmp_path):
    """A catalogue checkpoint evaluates with its publisher's resize (the catalogue's), a vitlab run's with its
    own, anything else with the official whole-image resize."""
    from vitlab.models.timm_compat import eval_resize_of as model_eval_resize

    model = vitlab.create_model("ViT-Ti/16", image_size=32, depth=1)
    assert model_eval_resize(model) == "official"
    model.hub_entry = {"eval_resize": "big_vision"}
    assert model_eval_resize(model) == "big_vision"
    model.eval_resize = "resize-short-crop"  # recorded by a vitlab run: it wins
    assert model_eval_resize(model) == "resize-short-crop"
