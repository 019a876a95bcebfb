"""Training checkpoints are weights: the files timm's train.py writes (its own `CheckpointSaver`: `model_best.pth.tar`,
`checkpoint-N.pth.tar`, `last.pth.tar`, with the optimizer, an argparse.Namespace of settings and EMA weights) and
PyTorch Lightning's `.ckpt` load with weights_only=True, the architecture told by the file; `vitlab eval` on them
scores what timm's validate.py scores (timm's own loader and evaluation transform as the control), the EMA weights
when asked (`use_ema`, timm's meaning), and nothing but plain types is unpickled."""

from __future__ import annotations

import argparse
import json
import pickle
import random

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.errors import WeightsError

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.parity

ARCH, CLASSES = "vit_tiny_patch16_224", ("ant", "bee", "cat", "dog")
KWARGS = {"depth": 2, "embed_dim": 64, "num_heads": 2}  # timm model_kwargs: a small ViT under a timm name


def colour_cast_images(root, per_class: int, seed: int) -> None:
    """Noisy images of varied sizes whose class is a colour cast: learnable in a few steps, not trivially."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            a = rng.normal(127, 60, (48 + 5 * i, 64 - 3 * i, 3))
            a[..., c % 3] += 25 * (1 + c // 3)
            Image.fromarray(a.clip(0, 255).astype(np.uint8)).save(root / name / f"{i}.png")


def _timm_top1(model, data, per_class: bool = False):
    """validate.py's evaluation: timm's eval transform resolved from the model, timm's ImageDataset, top-1 in %."""
    from timm.data import ImageDataset, create_transform, resolve_data_config

    transform = create_transform(**resolve_data_config({}, model=model))
    dataset = ImageDataset(str(data), transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8)
    preds, targets = [], []
    with torch.no_grad():
        for x, y in loader:
            preds.append(model.eval()(x).argmax(1))
            targets.append(y)
    pred, target = torch.cat(preds), torch.cat(targets)
    recall = [int((pred[target == c] == c).sum()) / int((target == c).sum()) for c in range(len(CLASSES))]
    top1 = 100 * int((pred == target).sum()) / len(target)
    return (top1, recall) if per_class else top1


@pytest.fixture(scope="module")
def timm_run(tmp_path_factory):
    """A tiny ViT trained a few steps the way timm's train.py trains (layer-decay AdamW, EMA), its checkpoints
    written by timm's CheckpointSaver."""
    from timm.data import ImageDataset, create_transform, resolve_data_config
    from timm.optim import create_optimizer_v2
    from timm.utils import CheckpointSaver, ModelEmaV3

    root = tmp_path_factory.mktemp("timm_run")
    random.seed(0)  # timm's training crop draws from Python's generator
    colour_cast_images(root / "train", 6, seed=0)
    colour_cast_images(root / "val", 6, seed=1)
    torch.manual_seed(0)
    model = timm.create_model(ARCH, num_classes=len(CLASSES), **KWARGS)
    args = argparse.Namespace(model=ARCH, num_classes=len(CLASSES), gp=None, in_chans=None, model_kwargs=KWARGS,
                              pretrained=False, lr=2e-3, layer_decay=0.75, model_ema=True, model_ema_decay=0.8,
                              mean=None, std=None, input_size=None, img_size=None, device="cpu", output=str(root))
    optimizer = create_optimizer_v2(model, "adamw", lr=args.lr, weight_decay=0.05, layer_decay=args.layer_decay)
    ema = ModelEmaV3(model, decay=args.model_ema_decay)
    train_tf = create_transform(**resolve_data_config({}, model=model), is_training=True)
    loader = torch.utils.data.DataLoader(ImageDataset(str(root / "train"), transform=train_tf), batch_size=8,
                                         shuffle=True, generator=torch.Generator().manual_seed(0))
    saver = CheckpointSaver(model, optimizer, args=args, model_ema=ema, checkpoint_dir=str(root),
                            recovery_dir=str(root), max_history=2)
    for epoch in range(2):
        model.train()
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ema.update(model)
        saver.save_checkpoint(epoch, metric=_timm_top1(model, root / "val"))
    return root


def _timm_model(path, use_ema: bool):
    """timm's model loaded from the checkpoint as validate.py loads it (`load_checkpoint(model, path, use_ema)`)."""
    from timm.models import load_checkpoint

    model = timm.create_model(ARCH, num_classes=len(CLASSES), **KWARGS)
    load_checkpoint(model, str(path), use_ema=use_ema)
    return model.eval()


def _vitlab_eval(capsys, *flags) -> dict:
    assert main(["eval", "--precision", "fp32", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_timm_saver_writes_what_this_reads(timm_run):
    """The files timm's saver writes, with the entries these tests rely on (a newer timm changing them shows here)."""
    names = {p.name for p in timm_run.glob("*.pth.tar")}
    assert {"model_best.pth.tar", "last.pth.tar", "checkpoint-1.pth.tar"} <= names
    with pytest.raises(pickle.UnpicklingError, match="argparse.Namespace"):  # what a plain weights-only load says
        torch.load(timm_run / "model_best.pth.tar", weights_only=True)


@pytest.mark.parametrize("use_ema", [False, True], ids=["trained", "ema"])
def test_eval_of_model_best_scores_what_timm_validate_scores(timm_run, capsys, use_ema):
    """`vitlab eval --weights model_best.pth.tar` (with --use-ema: its EMA weights) gives timm's validate.py top-1
    and per-class recall; the weights are the file's, bit for bit."""
    path = timm_run / "model_best.pth.tar"
    control = _timm_model(path, use_ema)
    top1, recall = _timm_top1(control, timm_run / "val", per_class=True)
    record = _vitlab_eval(capsys, "--weights", str(path), "--data", str(timm_run / "val"),
                          *(["--use-ema"] if use_ema else []))
    assert record["count"] == 24 and record["eval_resize"] == "timm:bicubic:0.9"
    assert record["top1"] * 100 == pytest.approx(top1, abs=1e-9)
    assert [c["recall"] for c in record["per_class"]] == pytest.approx(recall, abs=1e-9)
    assert [c["class"] for c in record["per_class"]] == list(CLASSES)  # the folder's names, as timm's dataset
    model = vitlab.load(path, use_ema=use_ema)
    for key, value in control.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_ema_weights_differ_and_default_is_trained(timm_run):
    """use_ema picks state_dict_ema, the default state_dict (validate.py's default); they differ, so the choice
    is visible."""
    raw = torch.load(timm_run / "last.pth.tar", weights_only=False)  # the test's own file: trusted
    trained, ema = vitlab.load(timm_run / "last.pth.tar"), vitlab.load(timm_run / "last.pth.tar", use_ema=True)
    key = "blocks.0.attn.qkv.weight"
    assert torch.equal(trained.state_dict()[key], raw["state_dict"][key])
    assert torch.equal(ema.state_dict()[key], raw["state_dict_ema"][key])
    assert not torch.equal(raw["state_dict"][key], raw["state_dict_ema"][key])


def test_every_reader_takes_a_timm_checkpoint(timm_run, tmp_path, capsys):
    """info tells the architecture, epoch and which weights; convert writes weights that load as the checkpoint's;
    finetune's --init reads it (resolve)."""
    path = timm_run / "checkpoint-1.pth.tar"
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "timm" and info["config"]["width"] == 64 and info["config"]["num_classes"] == 4
    assert info["checkpoint epoch"] == 1 and info["checkpoint weights"].startswith("trained (EMA weights too")
    assert main(["convert", str(path), str(tmp_path / "ema.safetensors"), "--use-ema"]) == 0
    capsys.readouterr()
    raw = torch.load(path, weights_only=False)["state_dict_ema"]
    converted = vitlab.load(tmp_path / "ema.safetensors")
    assert converted.eval_resize == "timm:bicubic:0.9" and converted.config.mean == (0.5, 0.5, 0.5)
    assert all(torch.equal(converted.state_dict()[k], v) for k, v in raw.items())
    from vitlab.train.resolution import read_init

    assert read_init(path).checkpoint.config.depth == 2


def test_use_ema_without_ema_weights_is_one_line(tmp_path, capsys):
    """Asking for EMA weights a file does not hold is refused, never silently answered with other weights."""
    model = timm.create_model(ARCH, num_classes=4, depth=1)  # a bare state dict: its width tells the heads
    torch.save({"state_dict": model.state_dict(), "epoch": 3}, tmp_path / "plain.pth.tar")
    with pytest.raises(WeightsError, match="holds no EMA weights"):
        vitlab.load(tmp_path / "plain.pth.tar", use_ema=True)
    vitlab.save(vitlab.load(tmp_path / "plain.pth.tar"), tmp_path / "m.safetensors")
    with pytest.raises(WeightsError, match="holds no EMA weights"):
        vitlab.load(tmp_path / "m.safetensors", use_ema=True)
    assert main(["info", str(tmp_path / "plain.pth.tar"), "--use-ema"]) != 0
    assert "holds no EMA weights" in capsys.readouterr().err


class _Payload:
    def __reduce__(self):
        return (print, ("unpickled",))


def test_only_plain_types_are_unpickled(tmp_path, capsys):
    """The allow-list holds plain types only: a checkpoint whose settings hold any other object (here one whose
    unpickling would call a function) is refused in one line, before anything of it runs."""
    model = timm.create_model(ARCH, num_classes=4, depth=1)
    args = argparse.Namespace(model=ARCH, hook=_Payload())
    torch.save({"state_dict": model.state_dict(), "args": args}, tmp_path / "bad.pth.tar")
    with pytest.raises(WeightsError, match="not loadable with weights_only=True"):
        vitlab.load(tmp_path / "bad.pth.tar")
    assert "unpickled" not in capsys.readouterr().out


def test_args_model_names_the_architecture_and_normalisation(tmp_path):
    """The checkpoint's `args.model` gives timm's normalisation and evaluation crop for the name; a name vitlab
    has no timm equivalent for leaves the architecture to the tensors."""
    model = timm.create_model("vit_small_patch16_224", num_classes=3, depth=1, global_pool="avg")
    args = argparse.Namespace(model="vit_small_patch16_224.dino", num_classes=3, gp="avg", model_kwargs={"depth": 1})
    torch.save({"state_dict": model.state_dict(), "args": args, "version": 2}, tmp_path / "a.pth.tar")
    loaded = vitlab.load(tmp_path / "a.pth.tar")
    assert loaded.config.mean == tuple(timm.data.IMAGENET_DEFAULT_MEAN)  # the .dino tag's statistics
    assert loaded.config.classifier == "gap" and loaded.config.fc_norm
    x = torch.randn(2, 3, 224, 224)
    torch.testing.assert_close(loaded(x), model.eval()(x), rtol=1e-5, atol=1e-5)
    args.model = "ViT-S/16"  # vitlab.create_model in timm's train.py: not a timm name
    torch.save({"state_dict": model.state_dict(), "args": args}, tmp_path / "b.pth.tar")
    torch.testing.assert_close(vitlab.load(tmp_path / "b.pth.tar")(x), model(x), rtol=1e-5, atol=1e-5)


def test_lightning_checkpoint_loads_under_its_module_prefix(tmp_path):
    """A PyTorch Lightning `.ckpt` (the Trainer's ModelCheckpoint) of a LightningModule holding a timm ViT as
    `self.model`: its state dict's `model.` prefix is removed and the architecture read from the tensors."""
    lightning = pytest.importorskip("lightning")

    class Module(lightning.LightningModule):
        def __init__(self, lr: float = 1e-3):
            super().__init__()
            self.save_hyperparameters()
            self.model = timm.create_model(ARCH, num_classes=3, depth=1, img_size=32, patch_size=8)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.model(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,)))
    trainer = lightning.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=tmp_path,
                                callbacks=[lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path)])
    module = Module()
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    (ckpt,) = tmp_path.glob("*.ckpt")
    loaded = vitlab.load(ckpt)
    assert loaded.config.image_size == (32, 32) and loaded.config.patch_size == 8 and loaded.config.depth == 1
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), module.model.eval()(x), rtol=1e-5, atol=1e-5)
