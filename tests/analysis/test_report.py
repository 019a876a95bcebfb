"""`vitlab analyze` end to end on tiny saved models: files written, summary numbers, image loading, hybrids,
non-square inputs and one-line user errors."""

import html
import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
import vitlab.cli
from vitlab.analysis import analyze, embedded_images, load_images
from vitlab.models import BiT, BiTConfig, VisionTransformer, ViTConfig

FIGURES = ["embedding_filters.png", "position_similarity.png", "attention_distance.png",
           "attention_rollout.png", "last_layer_heads.png"]


@pytest.fixture(autouse=True)
def only_analyze(monkeypatch):
    # The verb under test alone: other verbs' modules are not needed to parse `analyze`.
    monkeypatch.setattr(vitlab.cli, "VERB_MODULES", ["analyze"])


def tiny_vit(**kw) -> VisionTransformer:
    base = dict(image_size=32, patch_size=4, width=32, depth=2, mlp_dim=64, num_heads=2, num_classes=10,
                name="tiny")
    return VisionTransformer(ViTConfig(**{**base, **kw}))


def saved(model, tmp_path, name="model.safetensors") -> str:
    path = tmp_path / name
    vitlab.save(model, path)
    return str(path)


def run_cli(argv, capsys):
    try:
        rc = vitlab.cli.main(argv)
    except SystemExit as stop:  # argparse refuses a flag's value while parsing: one line, exit code 2
        rc = stop.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_analyze_on_embedded_digits(tmp_path, capsys):
    weights = saved(tiny_vit(in_chans=1, mean=(0.5,) * 3, std=(0.5,) * 3), tmp_path)
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(["analyze", "--weights", weights, "--out", str(out), "--num-images", "3"], capsys)
    assert rc == 0, stderr
    for name in [*FIGURES, "summary.json", "index.html"]:
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["input"]["num_images"] == 3 and summary["input"]["grid"] == [8, 8]
    assert np.array(summary["mean_attention_distance_px"]).shape == (2, 2)
    assert np.array(summary["rollout"]["maps"]).shape == (3, 8, 8)
    assert len(summary["embedding_filters"]["explained_variance_ratio"]) == 16  # 1×4×4 pixels: rank 16
    assert summary["embedding_filters"]["diagnostics"]["looks_untrained"]  # a fresh model: random filters
    assert len(summary["notes"]) == 1 and "look untrained" in summary["notes"][0]
    assert [im["true_class"] for im in summary["input"]["images"]] == ["0", "1", "2"]  # one per class in turn
    page = (out / "index.html").read_text()
    assert all(f"src='{name}'" in page for name in FIGURES)
    assert page.count(html.escape(summary["notes"][0])) == 1  # in the filters' caption, not repeated under Notes


def test_analyze_compile_traces_the_inspection_path_frozen_with_the_eager_numbers(tmp_path, capsys, compiles):
    weights = saved(tiny_vit(), tmp_path)
    summaries = []
    for extra in ([], ["--compile"]):
        out = tmp_path / f"out{len(extra)}"
        rc, _, stderr = run_cli(["analyze", "--weights", weights, "--out", str(out), "--num-images", "2",
                                 "--precision", "fp32", *extra], capsys)
        assert rc == 0, stderr
        summaries.append(json.loads((out / "summary.json").read_text()))
    assert [c["options"] for c in compiles] == [{"freezing": True}]
    eager, compiled = summaries
    np.testing.assert_allclose(compiled["mean_attention_distance_px"], eager["mean_attention_distance_px"], rtol=1e-5)
    np.testing.assert_allclose(compiled["rollout"]["maps"], eager["rollout"]["maps"], rtol=1e-5, atol=1e-7)


def test_analyze_image_files_rgb_non_square(tmp_path, capsys):
    weights = saved(tiny_vit(patch_size=16), tmp_path)
    paths = []
    for i, mode in enumerate(["L", "RGBA", "RGB"]):  # any mode is converted to what the model takes
        path = tmp_path / f"img{i}.png"
        Image.new(mode, (50 + 10 * i, 40), color=200 if mode == "L" else (200, 100, 50, 255)[: len(mode)]).save(path)
        paths.append(str(path))
    out = tmp_path / "out"
    argv = ["analyze", "--weights", weights, "--images", *paths, "--out", str(out), "--image-size", "48", "80"]
    rc, _, stderr = run_cli(argv, capsys)
    assert rc == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["input"]["image_size"] == [48, 80] and summary["input"]["grid"] == [3, 5]
    assert summary["position_embedding_similarity"]["grid"] == [3, 5]


def test_analyze_hybrid_skips_embedding_filters(tmp_path, capsys):
    model = vitlab.create_model("R+ViT-Ti/16", image_size=64, num_classes=10, depth=1)
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(["analyze", "--weights", saved(model, tmp_path), "--out", str(out),
                                  "--num-images", "2"], capsys)
    assert rc == 0, stderr
    assert "note: embedding filters skipped" in stdout
    assert not (out / "embedding_filters.png").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["embedding_filters"] is None and summary["model"]["effective_patch_px"] == 32
    assert "Notes" in (out / "index.html").read_text()


def test_relative_position_model_skips_similarity(tmp_path):
    model = tiny_vit(pos_embed="relative", classifier="gap")
    summary = analyze(model, torch.randn(2, 3, 32, 32), tmp_path, source="noise images")
    assert summary["position_embedding_similarity"] is None
    assert any("position-embedding similarity skipped" in n for n in summary["notes"])
    assert (tmp_path / "attention_rollout.png").exists()


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--image-size", "30"], "not a multiple of the effective patch size 4"),
        (["--images", "missing.png"], "image not found"),
        (["--discard-ratio", "1.5"], "--discard-ratio"),
    ],
)
def test_user_errors_are_one_line(tmp_path, capsys, extra, message):
    weights = saved(tiny_vit(), tmp_path)
    rc, _, stderr = run_cli(["analyze", "--weights", weights, "--out", str(tmp_path / "o"), *extra], capsys)
    assert rc == 2
    assert message in stderr and stderr.count("\n") == 1


def test_bit_weights_are_refused(tmp_path, capsys):
    bit = BiT(BiTConfig(layers=(1,), image_size=32, num_classes=2))
    rc, _, stderr = run_cli(["analyze", "--weights", saved(bit, tmp_path), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "needs a ViT or hybrid" in stderr


def test_images_are_normalised_as_the_weights_expect(tmp_path):
    cfg = ViTConfig(image_size=(8, 12), patch_size=4, in_chans=1, mean=(0.25, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    path = tmp_path / "grey.png"
    Image.new("RGB", (30, 20), color=(51, 51, 51)).save(path)  # grey 0.2
    x = load_images([path], cfg, (8, 12))
    assert x.shape == (1, 1, 8, 12)
    assert torch.allclose(x, torch.full_like(x, (0.2 - 0.25) / 0.5), atol=1e-6)
    rgb = ViTConfig(image_size=32, patch_size=4)
    digits = embedded_images(rgb, (32, 32), 12)
    assert digits.shape == (12, 3, 32, 32) and float(digits.min()) >= -1 and float(digits.max()) <= 1
    assert float(digits.max()) > 0.9 and float(digits.min()) < -0.9  # ink and background both present
