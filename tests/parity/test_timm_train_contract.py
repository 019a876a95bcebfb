"""timm's train.py and validate.py contract with `timm.create_model = vitlab.create_model`: timm's public training
pieces called as those scripts call them (create_model with their keywords, resolve_data_config, create_dataset,
create_loader, Mixup and SoftTargetCrossEntropy, ClassificationTask, create_optimizer_v2 with layer decay from
optimizer_kwargs, the task's ModelEmaV3, create_scheduler_v2 cosine from scheduler_kwargs, CheckpointSaver, then
validate.py's create_model, load_checkpoint and evaluation loop) give, with vitlab's model, what they give with timm's
model of the same name and weights: the same parameter groups, losses, trained and EMA weights, logits and top-1; and
`vitlab eval --weights model_best.pth.tar` (with --use-ema too) scores the validate loop's top-1."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import vitlab
from tests.weights.test_training_checkpoints import colour_cast_images  # noisy photos, a colour cast per class
from vitlab.cli import main

timm = pytest.importorskip("timm")

ARCH, CLASSES = "vit_tiny_patch16_224", ("ant", "bee", "cat", "dog")  # the classes colour_cast_images draws
MODEL_KWARGS = {"depth": 2, "embed_dim": 64, "num_heads": 2}  # train.py's --model-kwargs: a small ViT, timm's name
CPU = torch.device("cpu")


def _train_args(root, out) -> argparse.Namespace:
    """train.py's parsed settings for a fine-tuning run from an initial checkpoint (its defaults where not set)."""
    return argparse.Namespace(
        model=ARCH, pretrained=False, initial_checkpoint=str(root / "init.pth"), num_classes=len(CLASSES),
        gp=None, in_chans=None, input_size=None, img_size=None, crop_pct=None, mean=None, std=None,
        interpolation="", model_kwargs=MODEL_KWARGS, drop=0.0, drop_path=0.1, drop_block=None, bn_momentum=None,
        bn_eps=None, torchscript=False, data_dir=str(root), train_split="train", val_split="validation",
        batch_size=8, opt="adamw", lr=2e-3, weight_decay=0.05, momentum=0.9, opt_eps=None, opt_betas=None,
        layer_decay=0.65, sched="cosine", epochs=2, warmup_epochs=1, warmup_lr=1e-5, min_lr=1e-5,
        sched_on_updates=True, mixup=0.8, cutmix=1.0, cutmix_minmax=None, mixup_prob=1.0, mixup_switch_prob=0.5,
        mixup_mode="batch", smoothing=0.1, model_ema=True, model_ema_decay=0.8, model_ema_warmup=False, seed=42,
        eval_metric="top1", checkpoint_hist=2, output=str(out),
    )  # fmt: skip


def _validate(model, loader) -> dict:
    """train.py's and validate.py's evaluation loop: eval mode, inference mode, timm's `accuracy`."""
    from timm.utils import AverageMeter, accuracy

    top1, logits = AverageMeter(), []
    model.eval()
    with torch.inference_mode():
        for input, target in loader:
            output = model(input)
            top1.update(accuracy(output, target, topk=(1,))[0].item(), input.shape[0])
            logits.append(output)
    return {"top1": top1.avg, "logits": torch.cat(logits)}


def _loader(args, data_config, split: str, training: bool):
    from timm.data import create_dataset, create_loader

    dataset = create_dataset("", root=args.data_dir, split=split, is_training=training, batch_size=args.batch_size)
    return create_loader(dataset, input_size=data_config["input_size"], batch_size=args.batch_size,
                         is_training=training, use_prefetcher=False, interpolation=data_config["interpolation"],
                         mean=data_config["mean"], std=data_config["std"], num_workers=0,
                         crop_pct=None if training else data_config["crop_pct"],
                         crop_mode=None if training else data_config["crop_mode"], device=CPU)


def train_py(create_model, args) -> dict:
    """train.py's main() and train_one_epoch() on one CPU process, without a prefetcher (Mixup in the loop)."""
    from timm.data import Mixup, resolve_data_config
    from timm.loss import SoftTargetCrossEntropy
    from timm.optim import create_optimizer_v2, optimizer_kwargs
    from timm.scheduler import create_scheduler_v2, scheduler_kwargs
    from timm.task import ClassificationTask
    from timm.utils import CheckpointSaver, random_seed

    random_seed(args.seed, 0)
    model = create_model(
        args.model, pretrained=args.pretrained, in_chans=3, num_classes=args.num_classes, drop_rate=args.drop,
        drop_path_rate=args.drop_path, drop_block_rate=args.drop_block, global_pool=args.gp,
        bn_momentum=args.bn_momentum, bn_eps=args.bn_eps, scriptable=args.torchscript,
        checkpoint_path=args.initial_checkpoint, **args.model_kwargs,
    )
    # The two models' random initialisations draw differently (both then load the initial checkpoint): seeded again,
    # the loader, Mixup and stochastic depth draw the same for both.
    random_seed(args.seed, 0)
    data_config = resolve_data_config(vars(args), model=model, verbose=False)
    mixup_fn = Mixup(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, cutmix_minmax=args.cutmix_minmax,
                     prob=args.mixup_prob, switch_prob=args.mixup_switch_prob, mode=args.mixup_mode,
                     label_smoothing=args.smoothing, num_classes=args.num_classes)
    loader_train = _loader(args, data_config, args.train_split, training=True)
    loader_eval = _loader(args, data_config, args.val_split, training=False)
    task = ClassificationTask(model=model, criterion=SoftTargetCrossEntropy(), device=CPU, verbose=False)
    model = task.get_trainable_module()
    optimizer = create_optimizer_v2(model, **optimizer_kwargs(cfg=args))
    names = {id(p): n for n, p in model.named_parameters()}
    groups = sorted((g["lr_scale"], g["weight_decay"], sorted(names[id(p)] for p in g["params"]))
                    for g in optimizer.param_groups)
    task.setup_ema(decay=args.model_ema_decay, use_warmup=args.model_ema_warmup)
    saver = CheckpointSaver(model=model, optimizer=optimizer, args=args, amp_scaler=None,
                            checkpoint_dir=args.output, recovery_dir=args.output, decreasing=False,
                            max_history=args.checkpoint_hist, task=task)
    lr_scheduler, num_epochs = create_scheduler_v2(optimizer, **scheduler_kwargs(args, decreasing_metric=False),
                                                   updates_per_epoch=len(loader_train))
    losses, lrs, num_updates, evals = [], [], 0, []
    for epoch in range(num_epochs):
        model.train()
        for input, target in loader_train:
            input, target = mixup_fn(input, target)
            loss = task(input, target)["loss"]
            loss.backward()
            optimizer.step()
            num_updates += 1
            optimizer.zero_grad()
            task.update_ema(step=num_updates)
            losses.append(loss.item())
            lrs.append([g["lr"] for g in optimizer.param_groups])
            lr_scheduler.step_update(num_updates=num_updates, metric=sum(losses) / len(losses))
        metrics = _validate(task.get_eval_model(), loader_eval)
        metrics = {"model": metrics, "ema": _validate(task.get_eval_model(ema=True), loader_eval)}
        evals.append(metrics)
        saver.save_checkpoint(epoch, metric=metrics["ema"]["top1"])  # with EMA, train.py ranks by the EMA's
        lr_scheduler.step(epoch + 1, metrics["ema"]["top1"])
    ema = task.get_trainable_module(ema=True).module
    return {"data_config": data_config, "groups": groups, "losses": losses, "lrs": lrs, "evals": evals,
            "state": model.state_dict(), "ema": ema.state_dict()}


def validate_py(create_model, checkpoint, data_dir, use_ema: bool) -> dict:
    """validate.py's validate(): the model built as it builds it, `load_checkpoint(model, path, use_ema)`, timm's
    evaluation loader from the model's data config, the evaluation loop."""
    from timm.data import resolve_data_config
    from timm.models import load_checkpoint

    args = argparse.Namespace(model=ARCH, num_classes=len(CLASSES), gp=None, in_chans=None, input_size=None,
                              img_size=None, crop_pct=None, mean=None, std=None, interpolation="",
                              data_dir=str(data_dir), val_split="validation", batch_size=8)
    model = create_model(args.model, pretrained=False, num_classes=args.num_classes, in_chans=3,
                         global_pool=args.gp, scriptable=False, exportable=False, no_jit=False, **MODEL_KWARGS)
    load_checkpoint(model, str(checkpoint), use_ema)
    data_config = resolve_data_config(vars(args), model=model, use_test_size=True, verbose=False)
    return _validate(model, _loader(args, data_config, args.val_split, training=False))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("timm_train")
    colour_cast_images(root / "train", 6, seed=0)
    colour_cast_images(root / "val", 6, seed=1)
    torch.manual_seed(0)  # random initial weights under timm's name (timm's init: every tensor, the head too)
    torch.save(timm.create_model(ARCH, num_classes=len(CLASSES), **MODEL_KWARGS).state_dict(), root / "init.pth")
    out = {}
    for name, create_model in (("vitlab", vitlab.create_model), ("timm", timm.create_model)):
        (root / name).mkdir()
        out[name] = train_py(create_model, _train_args(root, root / name))
        out[name]["dir"] = root / name
    out["root"] = root
    return out


def test_data_config_and_layer_decay_groups_are_timms(runs) -> None:
    ours, theirs = runs["vitlab"], runs["timm"]
    assert ours["data_config"] == theirs["data_config"]
    assert ours["groups"] == theirs["groups"]
    assert len({scale for scale, _, _ in theirs["groups"]}) == MODEL_KWARGS["depth"] + 2  # embed, blocks, head
    assert len(ours["lrs"]) == len(theirs["lrs"]) == 6  # per step, the groups' learning rates (scheduled, scaled)
    for mine, timms in zip(ours["lrs"], theirs["lrs"], strict=True):
        assert sorted(mine) == pytest.approx(sorted(timms), rel=1e-12)


def test_losses_weights_and_ema_after_training_are_timms(runs) -> None:
    ours, theirs = runs["vitlab"], runs["timm"]
    assert len(theirs["losses"]) == 6
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-5)
    init = torch.load(runs["root"] / "init.pth", weights_only=True)
    assert ours["state"].keys() == theirs["state"].keys() == ours["ema"].keys()
    for key, value in theirs["state"].items():
        assert rel(ours["state"][key], value) <= 1e-5, key
        assert rel(ours["ema"][key], theirs["ema"][key]) <= 1e-5, key
    moved = [k for k, v in theirs["state"].items() if not torch.equal(v, init[k])]
    assert "blocks.1.mlp.fc2.weight" in moved and "head.weight" in moved  # the steps trained the model


def test_train_loop_validation_is_timms(runs) -> None:
    for ours, theirs in zip(runs["vitlab"]["evals"], runs["timm"]["evals"], strict=True):
        for which in ("model", "ema"):
            assert ours[which]["top1"] == theirs[which]["top1"]
            assert rel(ours[which]["logits"], theirs[which]["logits"]) <= 1e-5


@pytest.mark.parametrize("use_ema", [False, True], ids=["trained", "ema"])
def test_validate_py_and_vitlab_eval_of_model_best(runs, capsys, use_ema: bool) -> None:
    """validate.py on vitlab's model_best.pth.tar with vitlab's model gives what it gives with timm's model and
    timm's checkpoint; `vitlab eval --weights` on the same file scores the same top-1."""
    root = runs["root"]
    ours = validate_py(vitlab.create_model, runs["vitlab"]["dir"] / "model_best.pth.tar", root, use_ema)
    theirs = validate_py(timm.create_model, runs["timm"]["dir"] / "model_best.pth.tar", root, use_ema)
    assert ours["top1"] == theirs["top1"]
    assert rel(ours["logits"], theirs["logits"]) <= 1e-5
    flags = ["--use-ema"] if use_ema else []
    path = runs["vitlab"]["dir"] / "model_best.pth.tar"
    assert main(["eval", "--precision", "fp32", "--json", "--weights", str(path), "--data", str(root / "val"),
                 *flags]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["count"] == 4 * 6
    assert record["top1"] * 100 == pytest.approx(ours["top1"], abs=1e-9)
