"""vitlab.fit trains on objects as on paths: a torchvision ImageFolder, an in-memory Hugging Face dataset or any
map-style dataset of (image, label) as `data` (or a (train, val) pair), a vitlab model or a timm ViT as `init`. The
run records each by a description with a fingerprint, resumes only with the same objects, never changes the model
it was given, and refuses an object it cannot use in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.data import build_datasets
from vitlab.errors import DataError

TINY = {"steps": 2, "batch_size": 4, "workers": 0, "image_size": 8, "log_every": 1, "warmup": 1, "progress": False}
CLASSES = ("cat", "dog")


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """photos/{train,val}/{cat,dog}/*.png: 6 and 2 noise images per class, of two sizes."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 2)):
        for c in CLASSES:
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (12 + 4 * (i % 2), 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i}.png")
    return root


def _folders(photos: Path):
    from torchvision.datasets import ImageFolder

    return ImageFolder(str(photos / "train")), ImageFolder(str(photos / "val"))


def _vitlab_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return vitlab.create_model("ViT-Ti/4", image_size=8, depth=1, width=32, num_heads=2, mlp_dim=64, num_classes=5)


def _hf_dataset(n: int = 10):
    import datasets

    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)) for _ in range(n)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["ant", "bee"])})
    return datasets.Dataset.from_dict({"image": images, "label": [i % 2 for i in range(n)]}, features=features)


class Pairs(torch.utils.data.Dataset):
    """A plain map-style dataset of (tensor image, int label), as a user writes one."""

    def __init__(self, images: torch.Tensor, labels: list[int]):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]


def test_an_image_folder_and_a_vitlab_model_train_record_and_resume(photos, tmp_path):
    train, val = _folders(photos)
    init = _vitlab_model(0)
    before = {k: v.clone() for k, v in init.state_dict().items()}
    out = tmp_path / "run"
    result = vitlab.fit("finetune", init=init, data=(train, val), out=out, **TINY)
    assert result.status == "completed" and result.model.class_names == list(CLASSES)
    assert all(torch.equal(before[k], v) for k, v in init.state_dict().items())  # the object is not trained
    record = json.loads((out / "config.json").read_text())
    assert record["data"].startswith("object:torchvision.ImageFolder(12 items, 2 classes, sha256 ")
    assert "+ torchvision.ImageFolder(4 items, 2 classes, sha256 " in record["data"]
    assert record["init"].startswith("object:VisionTransformer(ViT/4 (depth 1, width 32, 2 heads, MLP 64), tensors "
                                     "sha256 ")
    assert (record["train_images"], record["val_images"]) == (12, 4)

    resumed = vitlab.fit("finetune", init=init, data=(train, val), out=out, resume=True,
                         **{**TINY, "steps": 4})
    assert resumed.step == 4
    with pytest.raises(ValueError, match="^data object:.* is not what the run in .* was started with") as err:
        vitlab.fit("finetune", init=init, data=(val, train), out=out, resume=True, **{**TINY, "steps": 6})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="^init object:.* is not what the run in .*; pass the same model"):
        vitlab.fit("finetune", init=_vitlab_model(1), data=(train, val), out=out, resume=True, **{**TINY, "steps": 6})


def test_an_in_memory_hugging_face_dataset_gives_its_class_names(tmp_path):
    result = vitlab.fit("finetune", init=_vitlab_model(0), data=_hf_dataset(), val_fraction=0.2,
                        out=tmp_path / "run", **TINY)
    assert result.model.class_names == ["ant", "bee"] and result.metrics["count"] == 2
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["data"].startswith("object:datasets.Dataset(10 items, 2 classes, sha256 ")


def test_a_timm_vit_is_read_as_its_own_architecture_and_fine_tuned(tmp_path):
    timm = pytest.importorskip("timm")
    from vitlab.weights.load import model_from_checkpoint, read_module

    torch.manual_seed(0)
    source = timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2,
                               mlp_ratio=2, num_classes=3).eval()
    model = model_from_checkpoint(read_module(source), "timm object")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), atol=1e-5, rtol=1e-5)  # the same network, timm's output
    train = Pairs(torch.randint(0, 256, (8, 3, 10, 10), dtype=torch.uint8), [0, 1] * 4)
    result = vitlab.fit("finetune", init=source, data=(train, train), out=tmp_path / "run", **TINY)
    assert (result.model.config.depth, result.model.config.num_heads) == (2, 2)
    assert result.model.class_names == ["0", "1"]  # a dataset without class names: the label indices


def test_objects_vitlab_cannot_use_are_refused_in_one_line(photos, tmp_path):
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import ToTensor

    train, val = _folders(photos)
    cases = [
        (dict(init=torch.nn.Linear(2, 2), data=(train, val)), TypeError,
         "init must be a path or weights name (str or os.PathLike), or a model (vitlab's, or a timm ViT), got Linear"),
        (dict(data=object()), TypeError, "data must be a path or dataset name (str or os.PathLike), or a map-style"),
        (dict(data=(ImageFolder(str(photos / "train"), transform=ToTensor()), val)), DataError,
         "data (train): torchvision.ImageFolder has a transform of its own (ToTensor); vitlab applies its own"),
        (dict(data=train), DataError, "missing split: data is one dataset, with no validation split; pass data=("),
        (dict(data=[1, 2, 3], val_fraction=0.5), DataError, "data[0] is a int; each item must be an (image, label)"),
        (dict(data=Pairs(torch.randn(4, 3, 8, 8), [0, 1, 0, 1]), val_fraction=0.5), DataError,
         "train[0]: a float image with values from"),
    ]
    for settings, kind, start in cases:
        with pytest.raises(kind) as err:
            vitlab.fit("finetune", **{"init": _vitlab_model(0), **settings}, out=tmp_path / "run", **TINY)
        assert str(err.value).startswith(start) and "\n" not in str(err.value), err.value
    assert not (tmp_path / "run").exists()


def test_a_recorded_object_description_is_not_read_as_a_path():
    with pytest.raises(DataError, match="names a dataset object a vitlab.fit run was given; .* pass the same object"):
        build_datasets("object:torchvision.ImageFolder(24 items, 2 classes, sha256 0123456789abcdef)")


def test_a_dataset_object_is_split_by_the_config_files_val_fraction(tmp_path):
    """The split comes before the run is resolved, so the held-out share is read from the keyword, the resumed run
    or the --config file alike; a keyword still wins over the file."""
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"val_fraction": 0.2}))
    out = tmp_path / "run"
    vitlab.fit("finetune", config_file=config, init=_vitlab_model(0), data=_hf_dataset(), out=out, **TINY)
    record = json.loads((out / "config.json").read_text())
    assert (record["val_fraction"], record["train_images"], record["val_images"]) == (0.2, 8, 2)
    again = tmp_path / "keyword"
    vitlab.fit("finetune", config_file=config, init=_vitlab_model(0), data=_hf_dataset(), out=again,
               val_fraction=0.4, **TINY)
    record = json.loads((again / "config.json").read_text())
    assert (record["val_fraction"], record["train_images"], record["val_images"]) == (0.4, 6, 4)


def test_an_int8_quantized_model_as_init_is_one_line(tmp_path):
    """A model quantized for inference (packed int8 layers, a dtype among its state) cannot be trained from: one
    line saying so and what to pass, not an AttributeError from reading its state."""
    from vitlab.runtime.quantize import quantize_int8

    model = quantize_int8(_vitlab_model(0).eval())
    with pytest.raises(ValueError) as err:
        vitlab.fit(init=model, data="digits", out=str(tmp_path / "r"), **TINY)
    assert str(err.value).startswith("the VisionTransformer object: int8-quantized (") and "\n" not in str(err.value)
    assert str(err.value).endswith("pass the float model it was quantized from, and quantize after training "
                                   "(--precision int8)")
    assert not (tmp_path / "r").exists()


def test_a_datasetdict_trains_on_its_train_and_validation_splits_never_its_test(tmp_path):
    import datasets

    splits = datasets.DatasetDict({"train": _hf_dataset(10), "validation": _hf_dataset(4), "test": _hf_dataset(6)})
    built = build_datasets(splits, None, False)
    assert (len(built.train), len(built.val)) == (10, 4)
    vitlab.fit("finetune", init=_vitlab_model(0), data=splits, out=tmp_path / "run", **TINY)
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert "10 items" in record["data"] and "4 items" in record["data"] and "6 items" not in record["data"]


def test_a_datasetdict_without_validation_holds_out_part_of_train_or_says_how():
    import datasets

    splits = datasets.DatasetDict({"train": _hf_dataset(10), "test": _hf_dataset(6)})
    with pytest.raises(DataError, match="hold out part of it with val_fraction=0.1"):
        build_datasets(splits, None, False)
    built = build_datasets(splits, 0.2, False)
    assert len(built.train) + len(built.val) == 10 and len(built.val) > 0


def test_a_dict_of_splits_without_train_is_refused_with_the_exact_call():
    with pytest.raises(DataError, match=r"no 'train' split; pass data=\(data\['fit'\], data\['check'\]\)"):
        build_datasets({"fit": _hf_dataset(4), "check": _hf_dataset(4)}, None, False)
