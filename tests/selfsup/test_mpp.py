"""Masked patch prediction: corruption statistics, colour targets on hand-made patches, the objective."""

import pytest
import torch

from tests.conftest import TINY_TRAIN, TINY_VIT_ARGS
from vitlab.models import ViTConfig, build_model
from vitlab.selfsup import MaskedPatchPredictor, MPPConfig, corrupt_patches, mean_color_targets
from vitlab.selfsup.mpp import pixel_targets


def test_corruption_statistics_over_many_draws():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(64, 49, 8, generator=g)
    mask = torch.full((1, 1, 8), 7.0)
    counts = torch.zeros(4)
    for _ in range(50):
        out, corrupted, action = corrupt_patches(tokens, mask, MPPConfig(), generator=g)
        assert set(corrupted.sum(1).tolist()) <= {24, 25}  # half of 49 per image, randomly rounded
        counts += torch.bincount(action.flatten().long(), minlength=4).float()
        masked, random, kept = action == 1, action == 2, action == 3
        assert torch.equal(out[masked], mask.expand_as(out)[masked])
        assert torch.equal(out[~corrupted], tokens[~corrupted]) and torch.equal(out[kept], tokens[kept])
        # a random *other* patch: equal to some patch of the batch, never its own
        flat = tokens.reshape(-1, 8)
        for vec, own in zip(out[random][:20], tokens[random][:20], strict=False):
            assert not torch.equal(vec, own) and (flat == vec).all(-1).any()
    corrupted_total = counts[1:].sum()
    assert abs(corrupted_total / counts.sum() - 0.5) < 0.01
    shares = counts[1:] / corrupted_total
    assert abs(shares[0] - 0.8) < 0.02 and abs(shares[1] - 0.1) < 0.02 and abs(shares[2] - 0.1) < 0.02


def test_mean_color_bins_on_hand_made_patches():
    img = torch.zeros(1, 3, 8, 16)  # two 8×8 patches
    img[0, :, :, :8] = torch.tensor([1.0, 0.0, 0.5]).view(3, 1, 1)  # r=7, g=0, b=floor(4)=4
    img[0, 0, :4, 8:] = 1.0  # red on half the patch: mean 0.5 -> bin 4; g = b = 0
    ids = mean_color_targets(img, 8, bits=3)
    assert ids.tolist() == [[7 * 64 + 0 * 8 + 4, 4 * 64]]
    assert mean_color_targets(torch.full((1, 3, 8, 8), 0.999), 8).item() == 511
    cells = mean_color_targets(img, 8, bits=3, cells=4)  # 4×4 downsized: 2×2-pixel cells
    assert cells.shape == (1, 2, 16)
    assert cells[0, 0].unique().tolist() == [7 * 64 + 4]
    assert cells[0, 1].reshape(4, 4)[:2].unique().tolist() == [7 * 64] and cells[0, 1].reshape(4, 4)[2:].max() == 0


def test_pixel_targets_are_the_patches_in_raster_order():
    img = torch.arange(2 * 4 * 4, dtype=torch.float).reshape(1, 2, 4, 4)
    t = pixel_targets(img, 2)  # 4 patches of 2×2×2
    assert t.shape == (1, 4, 8)
    assert t[0, 1].tolist() == [2, 3, 6, 7, 18, 19, 22, 23]  # top-right patch: channel 0 then channel 1


@pytest.mark.parametrize("target", ["mean-color", "mean-color-4x4", "pixels"])
def test_objective_trains_encoder_and_mask_token(target):
    torch.manual_seed(0)
    enc = build_model(ViTConfig(image_size=16, patch_size=4, width=32, depth=2, mlp_dim=64, num_heads=2,
                                num_classes=0))
    mpp = MaskedPatchPredictor(enc, MPPConfig(target=target))
    opt = torch.optim.Adam(mpp.parameters(), lr=3e-3)
    images = torch.rand(8, 3, 16, 16) * 2 - 1
    first = None
    for _ in range(30):
        loss, metrics = mpp(images)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert torch.isfinite(loss) and loss.item() < first  # it learns
    assert mpp.mask_token.grad is not None and mpp.mask_token.grad.abs().sum() > 0
    assert set(enc.state_dict()) == set(build_model(enc.config).state_dict())  # encoder saves as a plain ViT


def test_hybrid_is_refused():
    enc = build_model(ViTConfig(image_size=32, patch_size=1, **TINY_VIT_ARGS,
                                resnet={"layers": ()}))
    with pytest.raises(ValueError, match="plain ViT"):
        MaskedPatchPredictor(enc)


# --- through the training loop --------------------------------------------------------------------------
def mpp_run(tmp_path, name, **overrides):
    from vitlab.train import resolve_config

    base = {**TINY_TRAIN, "out": str(tmp_path / name), "steps": 6, "eval_every": 3, "objective": "mpp"}
    return resolve_config("demo", **{**base, **overrides})


def test_mpp_recipe_holds_the_paper_values():
    from vitlab.train import resolve_config

    cfg = resolve_config("mpp")
    assert (cfg.objective, cfg.model, cfg.optimizer, cfg.lr, cfg.warmup, cfg.decay, cfg.batch_size, cfg.steps) == (
        "mpp", "ViT-B/16", "adam", 2e-4, 10_000, "cosine", 4096, 1_000_000)


def test_mpp_run_saves_a_plain_vit_that_finetunes_and_resumes_exactly(tmp_path, sigterm_during_step):

    import vitlab
    from vitlab.train import resolve_config, run

    result = run(mpp_run(tmp_path, "mpp"))
    assert result.status == "completed" and 0.0 <= result.metrics["top1"] <= 1.0
    encoder = vitlab.load(result.weights)  # the encoder alone: a ViT without head
    assert encoder.config.num_classes == 0 and not any(k.startswith("encoder.") for k in encoder.state_dict())
    # the paper's follow-up: fine-tune the self-supervised encoder on labels
    ft = run(resolve_config("finetune", init=str(result.weights), data="digits", out=str(tmp_path / "ft"),
                            image_size=8, batch_size=32, steps=3, warmup=1, eval_every=3, workers=0))
    assert ft.status == "completed" and vitlab.load(ft.weights).config.num_classes == 10
    # preempted after step 3, resumed: the mask token and prediction head come back too, so the weights
    # equal the uninterrupted run's bit for bit
    with sigterm_during_step(3):
        assert run(mpp_run(tmp_path, "split")).status == "preempted"
    ckpt = torch.load(tmp_path / "split" / "checkpoints" / "step_00000003" / "state.pt", weights_only=True)
    assert set(ckpt["objective"]) == {"mask_token", "head.weight", "head.bias"}
    resumed = run(mpp_run(tmp_path, "split", resume=True))
    a, b = vitlab.load(result.weights).state_dict(), vitlab.load(resumed.weights).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
