"""Model cards (vitlab.weights.card): written beside every folder export and for file exports only when asked,
their code runs and computes the model's logits in each library, and what the user named (class names) is
escaped."""

from __future__ import annotations

import os
import re

import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.weights.card import model_card

try:  # the reference for the timm snippet of the cards
    import timm
except ImportError:
    timm = None
needs_timm = pytest.mark.skipif(timm is None, reason="timm is the reference")

TOL = 1e-5


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_class_names_are_escaped_in_the_model_card(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", num_classes=4, image_size=32, depth=1)
    model.class_names = ["<script>alert(1)</script>", "[x](javascript:alert(1))", "a | b", "cat\n# Heading"]
    card = model_card(model, "hf", tmp_path / "export")
    line = next(ln for ln in card.splitlines() if ln.startswith("Classes in label order:"))
    assert line == ("Classes in label order: &lt;script&gt;alert\\(1\\)&lt;/script&gt;, "
                    "\\[x\\]\\(javascript:alert\\(1\\)\\), a \\| b, cat \\# Heading.")
    assert "<script>" not in card and "\n# Heading" not in card


def code_blocks(card: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card, flags=re.S)


@needs_timm
def test_cards_beside_every_folder_export_and_their_code_runs(tmp_path, monkeypatch, random_tiny_vit, noise_image):
    pytest.importorskip("transformers")
    model = random_tiny_vit(2, image_size=32, patch_size=8)
    model.class_names = ["a", "b", "c"]
    vitlab.save(model, tmp_path / "src.safetensors")
    monkeypatch.chdir(tmp_path)
    noise_image(tmp_path / "image.jpg", (50, 40))
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


def test_file_exports_get_a_card_only_when_asked(tmp_path, random_tiny_vit):
    model = random_tiny_vit(2)
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
