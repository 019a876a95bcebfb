"""The documentation's "Coming from timm" and "Coming from transformers" pages: every `# vitlab` snippet runs (the hub
fetch is monkeypatched to serve local exports of a small random ViT: nothing downloads), the timm-names table is the
catalogue's, and what the transformers section says of hidden states, attentions and pre-processing holds against
transformers itself."""

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.hub import catalogue

pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = {"Coming from timm": DOCS / "coming-from-timm.md",
         "Coming from transformers": DOCS / "coming-from-transformers.md"}
IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8))


def section(title: str) -> str:
    return PAGES[title].read_text(encoding="utf-8")


def vitlab_snippets(title: str) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", section(title), flags=re.S)
    return [b for b in blocks if b.startswith("# vitlab\n")]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A random 3-block ViT-Ti/16 at 224 written as a timm hub folder and as an HF transformers folder."""
    from vitlab.weights.hf import write_hf
    from vitlab.weights.timm import write_timm

    root = tmp_path_factory.mktemp("hub")
    model = vitlab.create_model("ViT-Ti/16", depth=3, num_classes=1000)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    write_timm(model.eval(), root / "timm")
    write_hf(model, root / "hf")
    return model, root


@pytest.fixture
def fake_hub(exports, monkeypatch):
    from vitlab.hub import hf

    _, root = exports
    asked = []

    def fetch_repo(entry, force=False):
        asked.append(entry.repo)
        return root / ("timm" if entry.repo.startswith("timm/") else "hf")

    monkeypatch.setattr(hf, "fetch_repo", fetch_repo)
    # the stand-in is smaller than the architecture the names promise, which the hub would rightly refuse
    monkeypatch.setattr("vitlab.weights.load.check_published", lambda *args: None)
    return asked


def run(code: str) -> dict:
    namespace = {"image": IMAGE}
    exec(compile(code, "docs", "exec"), namespace)
    return namespace


def test_timm_section_runs(fake_hub):
    (code,) = vitlab_snippets("Coming from timm")
    ns = run(code)
    assert fake_hub == ["timm/vit_small_patch16_224.augreg_in21k_ft_in1k"]
    assert ns["channels"] == [384, 384, 384]  # the real vit_small_patch16_224 backbone
    assert len(ns["maps"]) == 3 and ns["maps"][0].shape[-2:] == (14, 14)
    assert ns["model"].num_classes == 10 and ns["model"].grad_checkpointing


def test_transformers_section_runs(fake_hub):
    (code,) = vitlab_snippets("Coming from transformers")
    ns = run(code)
    assert fake_hub == ["google/vit-base-patch16-224"] * 2
    assert len(ns["hidden"]) == 4 and len(ns["attentions"]) == 3  # embeddings + 3 blocks of the served model
    assert ns["model"].num_classes == 10 and not ns["model"].head.weight.any()


def test_timm_table_is_the_catalogues():
    """Each row's names (brace lists expanded) and default tag are the catalogue's, and every alias has a row."""
    table = section("Coming from timm").split("| vitlab | timm names | default tag |")[1].split("</details>")[0]
    seen = {}
    for row in re.findall(r"^\| .*? \| `(.+?)` \| (.+?) \|$", table, flags=re.M):
        pattern, default = row
        parts = re.split(r"\{([^}]*)\}", pattern)  # "vit_tiny_patch16_{224,384}" -> names
        choices = [p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]
        for combo in itertools.product(*choices):
            seen["".join(combo)] = None if default == "none published" else default.strip("`")
    assert seen == {arch: spec["default"] for arch, spec in catalogue.timm_models().items()}


def test_hidden_states_and_attentions_are_transformers(exports):
    _, root = exports
    ref = transformers.ViTForImageClassification.from_pretrained(root / "hf", attn_implementation="eager").eval()
    model = vitlab.load(root / "hf")
    x = vitlab.transforms(model)(IMAGE)[None]
    with torch.no_grad():
        theirs = ref(x, output_hidden_states=True, output_attentions=True)
        out = model.forward_inspect(x)
    hidden = [out["embeddings"], *out["tokens"]]
    assert len(hidden) == len(theirs.hidden_states)
    for ours, hf_state in zip([*hidden, *out["attention"]], [*theirs.hidden_states, *theirs.attentions], strict=True):
        assert (ours - hf_state).abs().max() <= 1e-5 * hf_state.abs().max()
    last = ref.vit(x).last_hidden_state
    assert (model.forward_features(x) - last).abs().max() <= 1e-5 * last.abs().max()


def test_vit_image_processor_within_one_grey_level():
    processor = transformers.ViTImageProcessor(size={"height": 224, "width": 224})  # google/vit-*'s settings
    theirs = processor(images=IMAGE, return_tensors="pt").pixel_values[0]
    with torch.device("meta"):
        model = vitlab.create_model("ViT-B/16")
    ours = vitlab.transforms(model)(IMAGE)
    diff = (ours - theirs).abs() * 127.5  # grey levels
    assert diff.max() <= 1 + 1e-4 and (diff > 1e-3).float().mean() < 0.005
    ref = np.asarray(IMAGE.resize((224, 224), Image.Resampling.BILINEAR), dtype=np.float32)
    assert np.array_equal(ours.permute(1, 2, 0).numpy() * 127.5 + 127.5, ref)  # vitlab: PIL's resize exactly
