"""Run directories wherever weights are read, timm exports of any size with vitlab's
pre-processing in timm's terms, `vitlab.transforms` (the eval pipeline as a Python callable) and model cards.

References are independent of the code under test: timm's own model factory and transform factory, the data
loader `vitlab eval` runs, PIL + closed-form normalisation, the tensors written into a checkpoint."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab import create_model
from vitlab.cli import main
from vitlab.data import EvalTransform, ShardSampler, TransformedSplit, make_loader, normalize
from vitlab.data.sources import ImageSplit
from vitlab.errors import WeightsError
from vitlab.eval.prediction import predict
from vitlab.files.rundir import step_dir
from vitlab.train.checkpoint import save_weights, write_checkpoint
from vitlab.weights.convert import convert
from vitlab.weights.load import preprocessing
from vitlab.weights.locate import locate as resolve_weights
from vitlab.weights.locate import weights_path

try:  # the references for timm exports and model cards; the run-directory and transform tests need neither
    import timm
    import timm.data
except ImportError:
    timm = None
needs_timm = pytest.mark.skipif(timm is None, reason="timm is the reference")

TOL = 1e-5
REPO = Path(__file__).resolve().parents[2]


def tiny(seed: int, **kw) -> torch.nn.Module:
    """A small ViT with random weights everywhere (zero-initialised heads would hide mixed-up files)."""
    kw = {"image_size": 16, "patch_size": 4, "width": 32, "depth": 1, "mlp_dim": 64, "num_heads": 2,
          "num_classes": 3, **kw}  # fmt: skip
    model = create_model("ViT-Ti/16", **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def same_weights(model: torch.nn.Module, reference: torch.nn.Module) -> bool:
    ref = reference.state_dict()
    return all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())


def write_image(path: Path, size: tuple[int, int] = (40, 30), seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


# --- a run directory wherever weights are read -------------------------------------------------------------------
@pytest.fixture
def run(tmp_path):
    """A run directory as training leaves it mid-way: config.json (a run config, not a timm/HF one), metrics,
    two checkpoints (steps 10 and 20), no final weights yet."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": "ViT-Ti/16", "steps": 30}))
    (run / "metrics.jsonl").write_text('{"step": 10}\n')
    models = {step: tiny(step) for step in (10, 20)}
    for step, m in models.items():
        write_checkpoint(run, step, m.state_dict(), m.config, ["a", "b", "c"], {"step": step},
                         meta={"eval_resize": "big_vision"})  # fmt: skip
    return run, models


def test_run_directory_means_newest_intact_checkpoint_then_final_weights(run):
    run, models = run
    assert weights_path(run) == step_dir(run, 20) / "model.safetensors"
    loaded = vitlab.load(run)
    assert same_weights(loaded, models[20]) and loaded.class_names == ["a", "b", "c"]
    assert loaded.eval_resize == "big_vision"  # recorded with the weights: vitlab.transforms repeats it
    assert same_weights(vitlab.load(step_dir(run, 10)), models[10])  # one checkpoint directory
    with open(step_dir(run, 20) / "model.safetensors", "r+b") as f:  # damage the newest: a bit flipped
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    assert same_weights(vitlab.load(run), models[10])  # falls back, as resuming does
    with pytest.raises(WeightsError, match=r"damaged checkpoint .*checksum.*; pass the run directory"):
        vitlab.load(step_dir(run, 20))
    final = tiny(30)
    vitlab.save(final, run / "model.safetensors")  # the run completed
    assert same_weights(vitlab.load(run), final) and resolve_weights(run) == run / "model.safetensors"


def test_run_directory_without_weights_is_one_line(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text("")
    with pytest.raises(WeightsError, match=r"r: run directory has no final model.safetensors and no intact "
                                           r"checkpoint; wait for its first checkpoint"):  # fmt: skip
        vitlab.load(tmp_path / "r")


def test_run_directory_in_info_convert_and_hubconf(run, tmp_path, capsys):
    run, models = run
    assert main(["info", str(run), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["file"] == str(step_dir(run, 20) / "model.safetensors") and info["format"] == "vitlab"
    assert info["eval_resize"] == "big_vision" and info["params"] == sum(p.numel() for p in models[20].parameters())
    assert main(["convert", str(run), str(tmp_path / "c.safetensors")]) == 0
    converted = vitlab.load(tmp_path / "c.safetensors")
    assert same_weights(converted, models[20]) and converted.eval_resize == "big_vision"  # kept through convert
    # torch.hub's entry names an architecture: a run of another one is refused in one line
    with pytest.raises(ValueError, match=r"holds ViT/4 .* not ViT-Ti/16; use that architecture's entry point"):
        torch.hub.load(str(REPO), "vit_ti16", source="local", weights=str(run))
    (tmp_path / "empty").mkdir()
    assert main(["info", str(tmp_path / "empty")]) == 2
    assert "or a vitlab run directory" in capsys.readouterr().err


@needs_timm
def test_timm_and_hf_folders_still_load_as_folders(tmp_path):
    """timm and HF folders also hold model.safetensors beside config.json: they must not be taken for runs."""
    model = tiny(1)
    convert_to = {"timm": tmp_path / "t", "hf": tmp_path / "h"}
    vitlab.save(model, tmp_path / "m.safetensors")
    for fmt, folder in convert_to.items():
        convert(tmp_path / "m.safetensors", folder, to=fmt)
        assert weights_path(folder) == folder
        assert same_weights(vitlab.load(folder), model)


# --- timm exports of any size, vitlab's pre-processing in timm's terms --------------------------------------------
NONSTANDARD = [
    ("ViT-S/16", {"image_size": 96, "depth": 2}),  # timm's name at another size and depth
    ("ViT-Ti/16", {"image_size": 16, "patch_size": 4, "width": 128, "depth": 2, "num_heads": 4, "mlp_dim": 256}),
    ("ViT-Ti/16-gap", {"image_size": 48, "width": 96, "depth": 1, "num_heads": 3, "mlp_dim": 200}),
]


@needs_timm
@pytest.mark.parametrize(("name", "kw"), NONSTANDARD, ids=["S16-96px-depth2", "demo-width128-patch4", "gap-w96"])
def test_timm_export_of_nonstandard_size_loads_in_timm(name, kw, tmp_path):
    model = create_model(name, num_classes=5, **kw)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    vitlab.save(model.eval(), tmp_path / "m.safetensors")
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "hub"), "--to", "timm"]) == 0
    ref = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    size = kw["image_size"]
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel_err(model(x), ref(x)) <= TOL


def test_refuses_mlp_width_timm_cannot_build(tmp_path):
    model = tiny(0, width=56, num_heads=2, mlp_dim=61)  # int(56 * (61 / 56)) == 60 in floating point
    vitlab.save(model, tmp_path / "m.safetensors")
    with pytest.raises(WeightsError, match="MLP width 61"):
        convert(tmp_path / "m.safetensors", tmp_path / "hub", to="timm")


def timm_pipeline(folder: Path):
    """timm's own eval transform for an exported folder, built the way timm's scripts build it."""
    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    data_cfg = timm.data.resolve_data_config(pretrained_cfg=cfg)
    return timm.data.create_transform(**data_cfg), cfg


@needs_timm
@pytest.mark.parametrize(("resize", "size", "crop"), [("official", 32, (1.0, "squash")),
                                                      ("resize-short-crop", 32, (1.0, "center")),
                                                      ("big_vision", 224, (0.875, "center"))])  # fmt: skip
def test_timm_export_preprocessing_is_vitlabs(resize, size, crop, tmp_path):
    """interpolation/crop_pct/crop_mode of the export make timm's transform factory compute vitlab's eval
    input. A 400x300 image keeps timm's integer rounding (int, round-half-even) and vitlab's in step."""
    model = tiny(0, image_size=size, patch_size=16 if size == 224 else 4)
    model.eval_resize = resize
    convert_src = tmp_path / "m.safetensors"
    vitlab.save(model, convert_src)
    convert(convert_src, tmp_path / "hub", to="timm")
    pipeline, cfg = timm_pipeline(tmp_path / "hub")
    assert (cfg["interpolation"], cfg["crop_pct"], cfg["crop_mode"]) == ("bilinear", *crop)
    # resize-short-crop resamples the central box in one step (timm: resize, then crop): equal on square images
    shape = (300, 300) if resize == "resize-short-crop" else (400, 300)
    img = Image.open(write_image(tmp_path / "x.png", shape))
    assert (vitlab.transforms(convert_src)(img) - pipeline(img)).abs().max().item() <= TOL


def test_big_vision_crop_pct_reaches_the_resize_side():
    """timm resizes to floor(S / crop_pct): the written crop_pct must land on vitlab's side exactly."""
    from vitlab.data.transforms import resize_before_crop
    from vitlab.weights.timm_arch import timm_eval_crop

    for side in (16, 32, 37, 96, 224, 256, 384, 448, 512):
        pct = timm_eval_crop((side, side), "big_vision")["crop_pct"]
        assert int(side / pct) == resize_before_crop(side), side
    assert timm_eval_crop((384, 384), "big_vision")["crop_pct"] == 0.857  # 448: big_vision's transfer resize


# --- vitlab.transforms -------------------------------------------------------------------------------------------
def test_transforms_equal_what_eval_feeds_the_model(tmp_path):
    """The eval loader (`vitlab eval`: ImageSplit -> TransformedSplit -> make_loader -> normalize) on JPEGs large
    enough for draft decoding, with the eval resize recorded in the weights."""
    model = tiny(0, image_size=32, patch_size=8)
    save_weights(tmp_path / "w.safetensors", model.state_dict(), model.config, ["a", "b", "c"],
                 meta={"eval_resize": "big_vision"})  # what a run writes (train.checkpoint.weights_meta)
    files = [tmp_path / f"{i}.jpg" for i in range(3)]
    for i, f in enumerate(files):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (150 + 10 * i, 200, 3), dtype=np.uint8)).save(f)
    resize = preprocessing(tmp_path / "w.safetensors")[1]
    assert resize == "big_vision"
    split = ImageSplit("val", np.zeros(3, dtype=np.int64), ["a", "b", "c"], paths=[str(f) for f in files])
    loader = make_loader(TransformedSplit(split, EvalTransform((32, 32), resize)), ShardSampler(3, 3), 0,
                         torch.device("cpu"))  # fmt: skip
    batch = next(iter(loader))
    fed = normalize(batch["images"], model.config.mean, model.config.std)
    for source in (tmp_path / "w.safetensors", vitlab.load(tmp_path / "w.safetensors")):
        t = vitlab.transforms(source)
        assert t.base == EvalTransform((32, 32), "big_vision")
        assert torch.equal(torch.stack([t(str(f)) for f in files]), fed)


def test_transforms_closed_form_and_input_kinds(tmp_path):
    """official resize: PIL bilinear to S x S, then (x / 255 - mean) / std, written out by hand."""
    model = tiny(0, image_size=16, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    t = vitlab.transforms(model)
    rgb = np.random.default_rng(0).integers(0, 256, (30, 20, 3), dtype=np.uint8)
    resized = np.asarray(Image.fromarray(rgb).resize((16, 16), Image.Resampling.BILINEAR), dtype=np.float64)
    expected = (resized / 255 - np.array(model.config.mean)) / np.array(model.config.std)
    out = t(rgb)
    assert out.dtype == torch.float32 and out.shape == (3, 16, 16)
    assert np.abs(out.permute(1, 2, 0).numpy() - expected).max() <= TOL
    Image.fromarray(rgb).save(tmp_path / "x.png")
    Image.fromarray(rgb).convert("RGBA").save(tmp_path / "x4.png")
    for same in (Image.fromarray(rgb), tmp_path / "x.png", str(tmp_path / "x4.png"), Image.open(tmp_path / "x4.png")):
        assert torch.equal(t(same), out)
    grey = rgb[:, :, 0]
    assert torch.equal(t(grey), t(np.repeat(grey[:, :, None], 3, axis=2)))  # grey: the same value in R, G, B
    with pytest.raises(ValueError, match=r"uint8 \(H, W, 3\).*float64"):
        t(rgb / 255.0)
    with pytest.raises(ValueError, match="got Tensor"):
        t(torch.zeros(3, 16, 16))
    with pytest.raises(ValueError, match="not a vitlab model"):
        vitlab.transforms(torch.nn.Linear(2, 2))


def test_train_transform_is_seeded_and_degenerates_to_eval():
    model = tiny(0, image_size=16)
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (24, 24, 3), dtype=np.uint8))
    a, b, c = (vitlab.transforms(model, train=True, seed=s) for s in (3, 3, 4))
    first = [a(img) for _ in range(4)]
    assert all(torch.equal(x, y) for x, y in zip(first, [b(img) for _ in range(4)], strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(first, [c(img) for _ in range(4)], strict=True))
    assert not all(torch.equal(first[0], x) for x in first[1:])  # draws advance
    # a crop of the whole square image, never flipped, is the eval resize (closed form: nothing random left)
    whole = vitlab.transforms(model, train=True, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip=False)
    assert torch.equal(whole(img), vitlab.transforms(model)(img))
    with pytest.raises(ValueError, match="unknown training option"):
        vitlab.transforms(model, train=True, crop_size=3)
    with pytest.raises(ValueError, match="only with train=True"):
        vitlab.transforms(model, flip=False)
    assert isinstance(vitlab.transforms(model, train=True).rng, random.Random)


README_QUICK_START = """\
import vitlab

model = vitlab.load(WEIGHTS)
x = vitlab.transforms(model)(IMAGE)
probs = model(x[None]).softmax(-1)[0]
print(model.class_names[probs.argmax()])
"""


def test_readme_quick_start(tmp_path, capsys):
    """The README's image -> class name example, run as written; `vitlab predict` (its own code path) agrees."""
    model = tiny(5, image_size=32, patch_size=8, num_classes=4)
    model.class_names = ["cat", "dog", "fox", "owl"]
    vitlab.save(model, tmp_path / "w.safetensors")
    image = write_image(tmp_path / "photo.jpg", (64, 48))
    with torch.no_grad():
        exec(README_QUICK_START, {"WEIGHTS": str(tmp_path / "w.safetensors"), "IMAGE": str(image)})
    printed = capsys.readouterr().out.strip()
    assert printed == predict(tmp_path / "w.safetensors", [str(image)], device="cpu")[0]["top"][0]["class"]


# --- model cards -------------------------------------------------------------------------------------------------
def code_blocks(card: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card, flags=re.S)


@needs_timm
def test_cards_beside_every_folder_export_and_their_code_runs(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    model = tiny(2, image_size=32, patch_size=8)
    model.class_names = ["a", "b", "c"]
    vitlab.save(model, tmp_path / "src.safetensors")
    monkeypatch.chdir(tmp_path)
    write_image(tmp_path / "image.jpg", (50, 40))
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    params = f"{sum(p.numel() for p in model.parameters()):,}"
    for fmt in ("timm", "hf"):
        assert main(["convert", "src.safetensors", f"out-{fmt}", "--to", fmt]) == 0
        card = (tmp_path / f"out-{fmt}" / "README.md").read_text()
        for needed in (f"library_name: {'timm' if fmt == 'timm' else 'transformers'}", f"| parameters | {params} |",
                       "Converted from `src.safetensors`", "mean [0.5, 0.5, 0.5]", "resized to 32×32", "bilinear",
                       "Classes in label order: a, b, c.", "ICLR 2021", "custom ViT (patch 8, width 32, depth 1"):
            assert needed in card, (fmt, needed)
        blocks = code_blocks(card)
        assert len(blocks) == (3 if fmt == "timm" else 2)  # vitlab, then timm (also by name) / transformers
        for other in blocks[1:]:
            scope: dict = {}
            with torch.no_grad():
                exec(blocks[0], scope)  # vitlab.load + vitlab.transforms on ./image.jpg
                exec(other, scope)  # the other library's loader: the same logits
                logits = scope["model"](x)
            assert rel_err(getattr(logits, "logits", logits), model(x)) <= TOL
        assert oct((tmp_path / f"out-{fmt}" / "README.md").stat().st_mode & 0o777) == oct(0o666 & ~_umask())
        assert main(["convert", "src.safetensors", f"out-{fmt}", "--to", fmt]) == 0  # re-export replaces it


def test_file_exports_get_a_card_only_when_asked(tmp_path):
    model = tiny(2)
    model.eval_resize = "big_vision"
    vitlab.save(model, tmp_path / "src.safetensors")
    assert main(["convert", str(tmp_path / "src.safetensors"), str(tmp_path / "a.npz")]) == 0
    assert not (tmp_path / "a.md").exists()
    assert main(["convert", str(tmp_path / "src.safetensors"), str(tmp_path / "b.npz"), "--card"]) == 0
    card = (tmp_path / "b.md").read_text()
    assert "official JAX .npz" in card and "shorter side resized to 18, then the central 16×16 crop" in card
    assert "vit_jax `checkpoint.load`" in card


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
