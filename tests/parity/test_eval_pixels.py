"""Evaluation pixels are the reference pipelines' pixels on real photographs of every size.

Real photos (scikit-image's astronaut, coffee and chelsea; scikit-learn's china and flower; matplotlib's
grace_hopper) are resized with PIL so that their short side runs from below the model size (224) to 4× it, and
saved as JPEG and PNG. Each file goes through `vitlab.transforms(model)` (what eval, predict, few-shot and analysis
feed the model) and through the references, which decode a file exactly (`Image.open(f).convert("RGB")`, as
timm's ImageDataset does): timm's `resolve_data_config(model=m)` + `create_transform(**cfg)` (vitlab's own
resizes, and timm's pipeline that a model of a timm name takes, at 224, 256, 384, 518 and non-square sizes), and,
for a Hugging Face folder, its image processor (`AutoImageProcessor`, PIL-based). The pixels must be equal, value for
value: a JPEG decoded at reduced size (Pillow's draft mode) differs by tens of grey levels on photos at least
twice the model size.

The one documented exception: big_vision's resize rounds the long side and floors the crop offset where timm
truncates and rounds it (models/timm_compat.py), so for those sizes the pixels are compared with the same
transform applied to the exactly decoded image instead.
"""

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.constants import resize_before_crop
from vitlab.data import EvalTransform, ShardSampler, TransformedSplit, make_loader
from vitlab.data.sources import ImageSplit

pytest.importorskip("timm")
skimage_data = pytest.importorskip("skimage.data")
import matplotlib.cbook  # noqa: E402
import timm.data  # noqa: E402
from sklearn.datasets import load_sample_images  # noqa: E402

SIZE = 224
SHORT_SIDES = (150, 224, 300, 448, 500, 672, 896)  # below the model size to 4× it; drafting began at 2 × 224


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Per-image tensors of 150k values: torch's thread pool costs more than it saves (4x on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _photos() -> dict[str, np.ndarray]:
    photos = {name: getattr(skimage_data, name)() for name in ("astronaut", "coffee", "chelsea")}
    sample = load_sample_images()
    photos.update({Path(name).stem: img for name, img in zip(sample.filenames, sample.images, strict=True)})
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
        photos["grace_hopper"] = np.asarray(Image.open(io.BytesIO(f.read())).convert("RGB"))
    return photos


@pytest.fixture(scope="module")
def photo_files(tmp_path_factory) -> list[str]:
    """Every photo at two of the short sides (cycled, so that each size meets several photos), as JPEG and PNG."""
    folder = tmp_path_factory.mktemp("photos")
    files = []
    for k, (name, arr) in enumerate(sorted(_photos().items())):
        img = Image.fromarray(arr)
        for short in (SHORT_SIDES[k % len(SHORT_SIDES)], SHORT_SIDES[(k + 3) % len(SHORT_SIDES)],
                      SHORT_SIDES[(k + 5) % len(SHORT_SIDES)]):
            scale = short / min(img.size)
            resized = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.LANCZOS)
            for ext in ("jpg", "png"):
                path = folder / f"{name}_{short}.{ext}"
                resized.save(path, quality=90) if ext == "jpg" else resized.save(path)
                files.append(str(path))
    assert {min(Image.open(f).size) for f in files} == set(SHORT_SIDES) and len(files) == 36
    return files


def reference_decode(path: str) -> Image.Image:
    """How timm's ImageDataset (and anyone calling Image.open) decodes a file: every pixel, then RGB."""
    with Image.open(path) as img:
        return img.convert("RGB")


def as_uint8(x: torch.Tensor, mean, std) -> np.ndarray:
    """The 0..255 values a normalised (3, H, W) tensor was made from (numpy: one thread, fast on a busy machine)."""
    m, s = np.array(mean, np.float32).reshape(3, 1, 1), np.array(std, np.float32).reshape(3, 1, 1)
    return np.rint((x.float().numpy() * s + m) * 255).astype(np.uint8)


def timm_geometry_is_big_vision(width: int, height: int, size: int = SIZE) -> bool:
    """Whether torchvision's Resize(r) + CenterCrop(S), as timm builds them for crop_mode "center", cut the same box
    as big_vision's resize_small(r) + central_crop(S): the long side int(r·long/short) vs round(...), the offset
    round-half-even vs floor."""
    r, short, long = resize_before_crop(size), min(width, height), max(width, height)
    timm_long, bv_long = int(r * long / short), round(long * r / short)
    return timm_long == bv_long and int(round((bv_long - size) / 2.0)) == (bv_long - size) // 2


def meta_vit(eval_resize: str, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) -> torch.nn.Module:
    with torch.device("meta"):  # pre-processing needs the config only
        model = vitlab.create_model("ViT-S/16", image_size=SIZE, mean=mean, std=std)
    model.eval_resize = eval_resize  # as a loaded run or a published checkpoint carries it
    return model


@pytest.mark.parametrize("eval_resize", ["official", "big_vision", "fewshot"])
def test_vitlab_transforms_equal_timm_on_photos_of_every_size(photo_files, eval_resize):
    model = meta_vit(eval_resize)
    ours_fn = vitlab.transforms(model)
    timm_fn = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
    mean, std = model.config.mean, model.config.std
    compared_with_timm = 0
    for path in photo_files:
        exact = reference_decode(path)
        ours = as_uint8(ours_fn(path), mean, std)
        # the file decoded by vitlab is the file decoded exactly (JPEG and PNG, every size)
        assert np.array_equal(ours, as_uint8(ours_fn(exact), mean, std)), path
        if eval_resize == "big_vision" and not timm_geometry_is_big_vision(*exact.size):
            continue  # timm cuts a box one pixel apart here (documented): the line above is the check
        assert np.array_equal(ours, as_uint8(timm_fn(exact), mean, std)), f"{path}: not timm's pixels"
        compared_with_timm += 1
    assert compared_with_timm >= len(photo_files) // 2  # the exception stays an exception


# Models of timm names where their pipelines differ: crop_pct 0.9 at 224, 0.95 and 0.9 at 256, 1.0 at 384 and at
# DINOv2's 518; non-square inputs (timm resizes the side that reaches its scaled size first); timm's squash mode.
TIMM_CASES = [
    ("vit_small_patch16_224", {}), ("deit_small_patch16_224", {}), ("vit_medium_patch16_reg4_gap_256", {}),
    ("vit_base_patch16_reg4_gap_256", {}), ("vit_small_patch16_384", {}), ("vit_small_patch14_dinov2", {}),
    ("vit_small_patch16_224", {"img_size": (224, 320)}), ("deit_small_patch16_224", {"img_size": (320, 224)}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "kwargs"), TIMM_CASES, ids=[f"{n}{k.get('img_size', '')}" for n, k in TIMM_CASES])
def test_models_of_timm_names_take_timms_pixels_on_photos(photo_files, name, kwargs):
    """`vitlab.transforms` of a model made by a timm name runs timm's pipeline for the name (timm's pretrained cfg,
    vitlab's own code): timm's `create_transform` values on every photo."""
    from timm.models import get_pretrained_cfg

    with torch.device("meta"):
        model = vitlab.create_model(name, **kwargs)
    expected = timm.data.resolve_data_config(pretrained_cfg=get_pretrained_cfg(name).to_dict())
    expected["input_size"] = (3, *model.config.image_size)  # the name's, or the size asked for
    assert timm.data.resolve_data_config(model=model) == expected
    check_timm_pixels(photo_files, model, timm.data.create_transform(**expected))


def test_timm_squash_mode_takes_timms_pixels_on_photos(photo_files):
    with torch.device("meta"):
        model = vitlab.create_model("ViT-S/16", image_size=(224, 320))
    model.eval_resize = "timm:bilinear:0.875:squash"  # the whole image to (256, 365), then the central crop
    cfg = timm.data.resolve_data_config(model=model)
    assert (cfg["crop_mode"], cfg["crop_pct"], cfg["input_size"]) == ("squash", 0.875, (3, 224, 320))
    check_timm_pixels(photo_files, model, timm.data.create_transform(**cfg))


def check_timm_pixels(photo_files: list[str], model: torch.nn.Module, timm_fn) -> None:
    ours_fn, mean, std = vitlab.transforms(model), model.config.mean, model.config.std
    for path in photo_files:
        ours, theirs = ours_fn(path), timm_fn(reference_decode(path))
        assert ours.shape == theirs.shape == (3, *model.config.image_size)
        assert np.array_equal(as_uint8(ours, mean, std), as_uint8(theirs, mean, std)), f"{path}: not timm's pixels"
        assert (ours - theirs).abs().max() <= 1e-6, path  # normalised in another order: float rounding only


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> str:
    """A transformers folder as vitlab writes it (config.json, preprocessor_config.json as the google/vit-*
    checkpoints': resize to 224×224, bilinear, mean = std = 0.5): a one-block ViT-Ti, weights irrelevant."""
    pytest.importorskip("transformers")
    from vitlab.weights.hf import write_hf

    folder = tmp_path_factory.mktemp("hf") / "vit"
    write_hf(vitlab.create_model("ViT-Ti/16", num_classes=3, depth=1), folder)
    return str(folder)


def test_vitlab_transforms_equal_hf_image_processor_on_photos(photo_files, hf_folder):
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(hf_folder, use_fast=False)  # the PIL reference
    model = vitlab.load(hf_folder)
    ours_fn = vitlab.transforms(model)
    assert vitlab.transforms(hf_folder)(photo_files[0]).equal(ours_fn(photo_files[0]))  # path or model: one pipeline
    mean, std = model.config.mean, model.config.std
    for path in photo_files:
        theirs = processor(reference_decode(path), return_tensors="pt").pixel_values[0]
        assert np.array_equal(as_uint8(ours_fn(path), mean, std), as_uint8(theirs, mean, std)), path


def test_evaluation_loader_decodes_photos_exactly(photo_files):
    """The loader `vitlab eval`, validation and few-shot read through: the same pixels as timm's for JPEGs at
    least twice the model size (where draft decoding used to start)."""
    big = [p for p in photo_files if p.endswith(".jpg") and min(Image.open(p).size) >= 2 * SIZE]
    assert len(big) >= 4
    model = meta_vit("official")
    split = ImageSplit("photos", np.zeros(len(big), dtype=np.int64), ["photo"], paths=big)
    loader = make_loader(TransformedSplit(split, EvalTransform((SIZE, SIZE), "official")),
                         ShardSampler(len(big), len(big)), 0, torch.device("cpu"))
    batch = next(iter(loader))["images"]  # (N, 3, H, W) uint8
    timm_fn = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
    mean, std = model.config.mean, model.config.std
    expected = np.stack([as_uint8(timm_fn(reference_decode(p)), mean, std) for p in big])
    assert np.array_equal(batch.numpy(), expected)
