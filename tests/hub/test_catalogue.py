"""The catalogue of published checkpoints: every entry names a vitlab architecture whose parameter count fits the
size recorded for it; names, filters, the AugReg index (a small generated one) and the ImageNet class list."""

from __future__ import annotations

import csv

import pytest
import torch

from vitlab.hub import catalogue, imagenet_classes
from vitlab.hub.augreg import augreg_entry, vitlab_model
from vitlab.models import variant_names
from vitlab.models.registry import build_model, model_config


def parameters(entry) -> int:
    """Parameters of the entry's architecture with its head, representation layer and input size (meta device)."""
    width = model_config(entry.model).__dict__.get("width")
    overrides = {"num_classes": entry.num_classes, "image_size": entry.resolution or 224}
    if entry.representation:
        overrides["representation_size"] = width
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(model_config(entry.model, **overrides)).parameters())


MODELS = [e for e in catalogue.entries() if e.format != "csv"]


@pytest.mark.parametrize("entry", MODELS, ids=[e.name for e in MODELS])
def test_entry_resolves_to_an_architecture_of_its_recorded_size(entry):
    assert entry.model in variant_names()
    assert entry.size and entry.num_classes is not None and entry.licence
    # float32 files: 4 bytes a parameter, within 1% of the file size plus the rounding of a stated "391 MiB"
    deviation = abs(4 * parameters(entry) - entry.size)
    assert deviation <= 0.01 * entry.size + entry.size_slack, f"{entry.name}: {deviation / entry.size:.2%} off"


def test_published_sizes_are_there_and_tight():
    """The sizes a reference states (AugReg README table, timm's BiT model index, HF file listings), not derived."""
    published = [e for e in MODELS if e.size_source == "published"]
    assert len(published) >= 19
    worst = max(abs(4 * parameters(e) - e.size) / e.size for e in published)
    assert worst < 0.013  # 40 MiB R+Ti/16: 1.2% from rounding to whole MiB; the BiT byte counts within 0.06%


def test_every_tag_has_its_description_and_names_are_unique():
    names = [e.name for e in catalogue.entries()]
    assert len(names) == len(set(names))
    tags = catalogue.tags()
    assert {e.tag for e in MODELS} <= set(tags) and all(tags.values())
    assert {"i21k", "i21k-ft-i1k", "augreg-i21k", "augreg-i21k-ft-i1k", "bit-s", "bit-m", "hf-hub"} <= set(tags)


def test_the_issue_lists_are_covered():
    have = {(e.tag, e.model) for e in MODELS}
    for m in ("ViT-B/16", "ViT-B/32", "ViT-L/16", "ViT-L/32", "ViT-H/14", "R50+ViT-B/16"):
        assert ("i21k", m) in have
    for m in ("ViT-Ti/16", "ViT-S/16", "ViT-S/32", "ViT-B/16", "ViT-B/32", "ViT-L/16", "R+ViT-Ti/16", "R26+ViT-S/32",
              "R50+ViT-L/32"):
        assert ("augreg-i21k", m) in have and ("augreg-i21k-ft-i1k", m) in have
    hub = {e.repo for e in MODELS if e.repo}
    assert {"google/vit-base-patch16-224", "google/vit-base-patch16-224-in21k", "google/bit-50",
            "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"} <= hub


def test_lookup_by_model_and_tag_or_by_name():
    e = catalogue.find("ViT-B/16", "augreg-i21k")
    assert e is catalogue.find("augreg-i21k:ViT-B/16")
    assert e.url == ("https://storage.googleapis.com/vit_models/augreg/"
                     "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz")
    assert e.size == 391 * 2**20 and e.size_slack == 2**19
    assert catalogue.find("ViT-B/16", True).name == "augreg-i21k-ft-i1k:ViT-B/16"  # the first default tag
    assert catalogue.find("ViT-L/32", True).name == "i21k-ft-i1k:ViT-L/32"  # no AugReg L/32: the next one
    hf = catalogue.find("hf-hub:someone/some-vit")  # any repository by id
    assert hf.repo == "someone/some-vit" and hf.format == "hf"
    with pytest.raises(ValueError, match=r"ViT-S/16 has: augreg-i21k, augreg-i21k-ft-i1k"):
        catalogue.find("ViT-S/16", "i21k")
    with pytest.raises(ValueError, match="not hf-hub:owner/name"):
        catalogue.find("hf-hub:no-slash")


def test_paths_are_not_names():
    assert catalogue.is_catalogue_name("augreg-i21k:ViT-B/16") and catalogue.is_catalogue_name("hf-hub:a/b")
    assert catalogue.is_catalogue_name("augreg-index")
    for path in ("runs/exp:1/model.safetensors", "C:/weights/x.npz", "model.npz"):
        assert not catalogue.is_catalogue_name(path)


def test_filters():
    rows = catalogue.select(model="ViT-B/16", dataset="imagenet21k", resolution=384)
    assert rows and all(e.model == "ViT-B/16" and e.resolution == 384 for e in rows)
    assert {e.tag for e in catalogue.select(dataset="ilsvrc2012", model="BiT-R50x1")} == {"bit-s", "bit-m-ft-i1k",
                                                                                         "hf-hub"}


@pytest.mark.parametrize("text, size, slack", [("391 MiB", 391 * 2**20, 2**19), ("102242668 B", 102242668, 0),
                                               ("2.64 GB", 2_640_000_000, 5_000_000), (412746060, 412746060, 0)])
def test_parse_size(text, size, slack):
    assert catalogue.parse_size(text) == (size, slack)


def write_index(path, rows):
    cols = ["name", "ds", "lr", "aug", "wd", "do", "sd", "best_val", "final_val", "final_test", "adapt_ds",
            "adapt_lr", "adapt_steps", "adapt_resolution", "adapt_final_val", "adapt_final_test", "params",
            "infer_samples_per_sec", "filename", "adapt_filename"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in cols})


PRE = "R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0"
ADAPT = PRE + "--imagenet2012-steps_20k-lr_0.01-res_384"


def test_augreg_index_rows_by_filename(tmp_path):
    index = tmp_path / "index.csv"
    write_index(index, [
        {"name": "R26+S/32", "ds": "i21k", "filename": PRE, "adapt_ds": "imagenet2012", "adapt_resolution": "384",
         "adapt_final_test": "0.8385", "adapt_filename": ADAPT, "params": "36431912"},
        {"name": "R26+S/32", "ds": "i21k", "filename": PRE, "adapt_ds": "cifar100", "adapt_resolution": "224",
         "adapt_final_test": "0.91", "adapt_filename": PRE + "--cifar100-steps_10k-lr_0.003-res_224"},
    ])
    pre = augreg_entry(PRE, index)
    assert pre.model == "R26+ViT-S/32" and pre.pretrain == "i21k" and pre.num_classes == 21843
    assert pre.url == f"https://storage.googleapis.com/vit_models/augreg/{PRE}.npz" and pre.finetune is None
    ft = augreg_entry(ADAPT + ".npz", index)
    assert (ft.finetune, ft.resolution, ft.num_classes, ft.top1, ft.classes) == ("i1k", 384, 1000, 83.85, "imagenet1k")
    assert ft.size == 4 * 36431912 and ft.name == f"augreg:{ADAPT}"
    cifar = augreg_entry(PRE + "--cifar100-steps_10k-lr_0.003-res_224", index)
    assert (cifar.finetune, cifar.num_classes, cifar.classes) == ("cifar100", 100, None)
    with pytest.raises(ValueError, match=f"did you mean augreg:{PRE}"):
        augreg_entry(PRE.replace("light1", "light2"), index)


@pytest.mark.parametrize("paper, ours", [("B/16", "ViT-B/16"), ("R+Ti/16", "R+ViT-Ti/16"),
                                         ("R26+S/32", "R26+ViT-S/32"), ("R50+L/32", "R50+ViT-L/32")])
def test_index_model_names(paper, ours):
    assert vitlab_model(paper) == ours and ours in variant_names()


def test_imagenet_class_names_are_in_label_order():
    from torchvision.models._meta import _IMAGENET_CATEGORIES  # an independent list of the 1000 names

    classes = imagenet_classes()
    wnids = [w for w, _ in classes]
    assert len(classes) == 1000 and wnids == sorted(wnids) and wnids[0] == "n01440764"
    same = sum(name.split(",")[0].lower() == tv.lower() for (_, name), tv in zip(classes, _IMAGENET_CATEGORIES,
                                                                                  strict=True))
    assert same >= 998  # torchvision renamed the two duplicate lemmas ("crane", "maillot")
