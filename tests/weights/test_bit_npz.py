"""big_transfer BiT .npz reader/writer: logits of a random BiT-layout file against an independent numpy forward
written here from the description of BiT (Kolesnikov et al. 2020; big_transfer's bit_pytorch/bit_jax models), bit-exact
npz -> vitlab -> npz round trips in both GroupNorm layouts, format detection, and one clear error per bad file.
The files are generated here from big_transfer's tensor names, not by vitlab's writer."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.errors import WeightsError
from vitlab.models import BiT, BiTConfig, VisionTransformer, ViTConfig
from vitlab.models.registry import bit_name
from vitlab.weights.bit_npz import read_bit_npz, write_bit_npz
from vitlab.weights.convert import convert, write
from vitlab.weights.jax_npz import read_jax_npz, write_jax_npz
from vitlab.weights.load import detect_format

torch.set_num_threads(1)
TOL = 1e-5
CONV = "standardized_conv2d/kernel"


# --- a random file in big_transfer's layout ------------------------------------------------------------------
def bit_arrays(layers: tuple[int, ...], gn_4d: bool = False, classes: int = 7, seed: int = 0) -> dict[str, np.ndarray]:
    """Every tensor big_transfer's ResNetV2 holds, width factor 1. Conv kernels get scales from 3e-5 to 1e-2 so
    that the weight-standardisation eps (1e-10 here, 1e-8 in timm and transformers) visibly changes the output;
    GroupNorm scales and offsets and the head are random so that no tensor can be mis-mapped unnoticed."""
    rng = np.random.default_rng(seed)

    def conv(k: int, cin: int, cout: int) -> np.ndarray:
        return (rng.standard_normal((k, k, cin, cout)) * 10 ** rng.uniform(-4.5, -2)).astype(np.float32)

    def gn(prefix: str, c: int) -> None:
        shape = (1, 1, 1, c) if gn_4d else (c,)
        arrays[f"{prefix}/group_norm/gamma"] = (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        arrays[f"{prefix}/group_norm/beta"] = (0.2 * rng.standard_normal(shape)).astype(np.float32)

    arrays = {f"resnet/root_block/{CONV}": conv(7, 3, 64)}
    cin = 64
    for b, units in enumerate(layers):
        mid = 64 * 2**b
        for u in range(units):
            unit = f"resnet/block{b + 1}/unit{u + 1:02d}"
            gn(f"{unit}/a", cin)
            arrays[f"{unit}/a/{CONV}"] = conv(1, cin, mid)
            if u == 0:
                arrays[f"{unit}/a/proj/{CONV}"] = conv(1, cin, 4 * mid)
            gn(f"{unit}/b", mid)
            arrays[f"{unit}/b/{CONV}"] = conv(3, mid, mid)
            gn(f"{unit}/c", mid)
            arrays[f"{unit}/c/{CONV}"] = conv(1, mid, 4 * mid)
            cin = 4 * mid
    gn("resnet", cin)
    arrays["resnet/head/conv2d/kernel"] = (rng.standard_normal((1, 1, cin, classes)) / np.sqrt(cin)).astype(np.float32)
    arrays["resnet/head/conv2d/bias"] = (0.2 * rng.standard_normal(classes)).astype(np.float32)
    return arrays


def save(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


# --- the independent numpy forward -----------------------------------------------------------------------------
def np_conv(x: np.ndarray, kernel: np.ndarray, stride: int, pad: int, ws_eps: float) -> np.ndarray:
    """Weight-standardised conv: x (N, C, H, W), kernel HWIO, standardised per output filter over (H, W, I)."""
    k = kernel.astype(np.float64)
    mean, var = k.mean(axis=(0, 1, 2)), k.var(axis=(0, 1, 2))
    k = (k - mean) / np.sqrt(var + ws_eps)
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(x, k.shape[:2], axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("nchwij,ijco->nohw", win, k)  # (N, O, H', W')


def np_gn_relu(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, groups: int = 32, eps: float = 1e-5) -> np.ndarray:
    n, c, h, w = x.shape
    g = x.reshape(n, groups, c // groups, h, w)
    g = (g - g.mean(axis=(2, 3, 4), keepdims=True)) / np.sqrt(g.var(axis=(2, 3, 4), keepdims=True) + eps)
    y = g.reshape(n, c, h, w) * gamma.reshape(1, c, 1, 1) + beta.reshape(1, c, 1, 1)
    return np.maximum(y, 0)


def numpy_bit(arrays: dict[str, np.ndarray], x: np.ndarray, ws_eps: float = 1e-10) -> np.ndarray:
    """BiT ResNetV2 logits: root conv 7×7/2 (pad 3), zero pad 1 + 3×3/2 VALID max-pool, pre-activation units
    (GN+ReLU, projection from that when the unit has one, 1×1, GN+ReLU, 3×3 with the block's stride, GN+ReLU, 1×1,
    add, no ReLU after), final GN+ReLU, spatial mean, 1×1 head."""
    a = {k: v.astype(np.float64) for k, v in arrays.items()}
    y = np_conv(x.astype(np.float64), a[f"resnet/root_block/{CONV}"], 2, 3, ws_eps)
    y = np.pad(y, ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.lib.stride_tricks.sliding_window_view(y, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(4, 5))
    blocks = sorted({int(k.split("/")[1][5:]) for k in a if k.startswith("resnet/block")})
    for b in blocks:
        units = sorted({k.split("/")[2] for k in a if k.startswith(f"resnet/block{b}/")})
        for unit in units:
            p = f"resnet/block{b}/{unit}"
            stride = 2 if b > 1 and unit == "unit01" else 1
            pre = np_gn_relu(y, a[f"{p}/a/group_norm/gamma"], a[f"{p}/a/group_norm/beta"])
            short = np_conv(pre, a[f"{p}/a/proj/{CONV}"], stride, 0, ws_eps) if f"{p}/a/proj/{CONV}" in a else y
            z = np_conv(pre, a[f"{p}/a/{CONV}"], 1, 0, ws_eps)
            z = np_conv(np_gn_relu(z, a[f"{p}/b/group_norm/gamma"], a[f"{p}/b/group_norm/beta"]),
                        a[f"{p}/b/{CONV}"], stride, 1, ws_eps)  # fmt: skip
            z = np_conv(np_gn_relu(z, a[f"{p}/c/group_norm/gamma"], a[f"{p}/c/group_norm/beta"]),
                        a[f"{p}/c/{CONV}"], 1, 0, ws_eps)  # fmt: skip
            y = z + short
    pooled = np_gn_relu(y, a["resnet/group_norm/gamma"], a["resnet/group_norm/beta"]).mean(axis=(2, 3))
    return pooled @ a["resnet/head/conv2d/kernel"][0, 0] + a["resnet/head/conv2d/bias"]


def nonsquare_input() -> np.ndarray:
    return np.random.default_rng(1).uniform(-1, 1, (2, 3, 40, 56)).astype(np.float32)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# --- parity and round trips ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layers, gn_4d", [((1, 1, 1, 1), False), ((2, 1, 1, 1), True)], ids=["1111-C", "2111-11C"])
def test_logits_match_numpy_forward(tmp_path: Path, layers: tuple[int, ...], gn_4d: bool) -> None:
    arrays = bit_arrays(layers, gn_4d)
    path = save(tmp_path / "bit.npz", arrays)
    model = vitlab.load(path)
    assert isinstance(model, BiT) and model.config.layers == layers and model.config.ws_eps == 1e-10
    x = nonsquare_input()
    with torch.no_grad():
        got = model(torch.from_numpy(x)).double().numpy()
    want = numpy_bit(arrays, x)
    err = rel_err(got, want)
    print(f"BiT npz {layers} gn_4d={gn_4d}: vitlab vs numpy relative L2 {err:.2e}")
    assert err <= TOL
    # the reference is sensitive to what is tested: timm's / transformers' WS eps gives other logits
    assert rel_err(numpy_bit(arrays, x, ws_eps=1e-8), want) > 100 * TOL


@pytest.mark.parametrize("gn_4d", [False, True], ids=["gn-C", "gn-111C"])
def test_npz_vitlab_npz_is_bit_exact(tmp_path: Path, gn_4d: bool) -> None:
    arrays = bit_arrays((2, 1), gn_4d, classes=5)
    src = save(tmp_path / "src.npz", arrays)
    ck = read_bit_npz(src)
    assert ck.meta["gn_4d"] is gn_4d and ck.config.layers == (2, 1) and ck.config.num_classes == 5
    model = BiT(ck.config)
    model.load_state_dict(ck.state_dict)
    write_bit_npz(model, tmp_path / "out.npz", gn_4d=gn_4d)
    with np.load(tmp_path / "out.npz") as out:
        assert sorted(out.files) == sorted(arrays)
        for name, want in arrays.items():
            got = out[name]
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), name


def test_convert_npz_to_npz_and_routes_through_jax_npz(tmp_path: Path) -> None:
    arrays = bit_arrays((1, 1))
    src = save(tmp_path / "src.npz", arrays)
    assert detect_format(src) == "bit-npz"
    assert convert(src, tmp_path / "copy.npz") == "bit-npz"  # .npz of a BiT: big_transfer's layout
    write(vitlab.load(src), tmp_path / "routed.npz", "jax-npz", numbering="linen")  # numbering does not apply
    for name in ("copy.npz", "routed.npz"):
        with np.load(tmp_path / name) as out:
            assert sorted(out.files) == sorted(arrays) and all(np.array_equal(out[k], v) for k, v in arrays.items())


def test_rehead_and_backbone(tmp_path: Path) -> None:
    arrays = bit_arrays((1, 1))
    path = save(tmp_path / "bit.npz", arrays)
    x = torch.from_numpy(nonsquare_input())
    model, reheaded = vitlab.load(path), vitlab.load(path, num_classes=3)
    assert reheaded.config.num_classes == 3 and not reheaded.head.weight.any() and not reheaded.head.bias.any()
    with torch.no_grad():
        features = model.forward_head(model.forward_features(x), pre_logits=True)
        assert torch.equal(reheaded.forward_head(reheaded.forward_features(x), pre_logits=True), features)
    # a file without the head: num_classes 0, the forward returns the pooled representation
    headless = {k: v for k, v in arrays.items() if not k.startswith("resnet/head/")}
    backbone = vitlab.load(save(tmp_path / "backbone.npz", headless))
    assert backbone.config.num_classes == 0
    with torch.no_grad():
        assert torch.equal(backbone(x), features)


def test_architecture_and_name_inference() -> None:
    assert bit_name(BiTConfig(layers=(3, 4, 6, 3))) == "BiT-R50x1"
    assert bit_name(BiTConfig(layers=(3, 8, 36, 3), width_factor=4)) == "BiT-R152x4"
    assert bit_name(BiTConfig(layers=(3, 4, 6, 3), width_factor=5)) == ""  # not a listed variant
    assert bit_name(BiTConfig(layers=(1, 1))) == ""


# --- bad files: one line each, naming the file and the tensor --------------------------------------------------
def _drop(name: str):
    return lambda a: a.pop(name)


def _put(name: str, value: np.ndarray):
    return lambda a: a.__setitem__(name, value)


BAD_EDITS = {
    "missing": (_drop("resnet/block2/unit01/b/group_norm/gamma"),
                r"missing tensor resnet/block2/unit01/b/group_norm/gamma"),
    "missing-proj": (_drop(f"resnet/block2/unit01/a/proj/{CONV}"),
                     rf"missing tensor resnet/block2/unit01/a/proj/{CONV}"),
    "missing-block": (lambda a: [a.pop(k) for k in list(a) if k.startswith("resnet/block1/")],
                      rf"missing tensor resnet/block1/unit01/a/{CONV}"),
    "extra": (_put("resnet/block1/unit01/d/group_norm/gamma", np.ones(64, np.float32)),
              r"unknown tensors resnet/block1"),
    "shape": (_put(f"resnet/block1/unit01/c/{CONV}", np.ones((1, 1, 64, 255), np.float32)),
              rf"tensor resnet/block1/unit01/c/{CONV} has shape \(1, 1, 64, 255\), expected \(1, 1, 64, 256\)"),
    "gn-shape": (_put("resnet/group_norm/beta", np.ones(511, np.float32)),
                 r"resnet/group_norm/beta has shape \(511,\)"),
    "int-dtype": (_put("resnet/head/conv2d/bias", np.zeros(7, np.int64)), r"head/conv2d/bias has dtype int64"),
    "root-width": (_put(f"resnet/root_block/{CONV}", np.ones((7, 7, 3, 48), np.float32)), r"64·width factor"),
    "head-bias-only": (_drop("resnet/head/conv2d/kernel"), r"missing tensor resnet/head/conv2d/kernel"),
}


@pytest.mark.parametrize("name", list(BAD_EDITS))
def test_bad_tensors_are_named(tmp_path: Path, name: str) -> None:
    edit, message = BAD_EDITS[name]
    arrays = bit_arrays((1, 1))
    edit(arrays)
    path = save(tmp_path / "bad.npz", arrays)
    with pytest.raises(WeightsError, match=message) as info:
        vitlab.load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_vit_and_bit_files_are_told_apart(tmp_path: Path) -> None:
    vit = VisionTransformer(ViTConfig(image_size=32, patch_size=8, width=48, depth=1, mlp_dim=96, num_heads=4,
                                      num_classes=3, gelu="tanh"))  # fmt: skip
    mislabelled = tmp_path / "BiT-M-R50x1.npz"  # a ViT under a BiT name: the content decides
    write_jax_npz(vit, mislabelled)
    assert detect_format(mislabelled) == "jax-npz" and isinstance(vitlab.load(mislabelled), VisionTransformer)
    with pytest.raises(WeightsError, match=r"not a big_transfer BiT checkpoint \(it is a ViT checkpoint"):
        read_bit_npz(mislabelled)
    bit = save(tmp_path / "ViT-B_16.npz", bit_arrays((1, 1)))
    assert detect_format(bit) == "bit-npz"
    with pytest.raises(WeightsError, match="no embedding/kernel"):
        read_jax_npz(bit)
    with pytest.raises(ValueError, match="holds BiT ResNets, not VisionTransformer"):
        write_bit_npz(vit, tmp_path / "x.npz")
    with pytest.raises(ValueError, match="jax-npz"):
        convert(mislabelled, tmp_path / "y.npz", to="bit-npz")


@pytest.mark.parametrize("cut", ["truncated", "corrupt"])
def test_corrupt_archives(tmp_path: Path, cut: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = save(tmp_path / "ok.npz", bit_arrays((1, 1))).read_bytes()
    data = data[: len(data) // 2] if cut == "truncated" else data[:3000] + bytes(200) + data[3200:]
    path = tmp_path / "bad.npz"
    path.write_bytes(data)
    for read in (vitlab.load, read_bit_npz):
        with pytest.raises(WeightsError, match="corrupt") as info:
            read(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert main(["info", str(path)]) == 2  # the command line: one line on stderr, exit code 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.npz" in err[0] and "corrupt" in err[0]


def test_other_containers_are_refused(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "z.npz", "w") as z:
        z.writestr(f"resnet/root_block/{CONV}.npy", b"not an array")
    with pytest.raises(WeightsError, match="is not a numpy array"):
        read_bit_npz(tmp_path / "z.npz")
    (tmp_path / "t.npz").write_text("text")
    with pytest.raises(WeightsError, match="not an .npz archive"):
        read_bit_npz(tmp_path / "t.npz")


def test_writer_warns_when_big_transfer_computes_otherwise(tmp_path: Path) -> None:
    model = BiT(BiTConfig(layers=(1,), num_classes=2, ws_eps=1e-8))  # e.g. read from timm or transformers
    with pytest.warns(UserWarning, match="eps 1e-08 and big_transfer with 1e-10"):
        write_bit_npz(model, tmp_path / "m.npz")
    assert read_bit_npz(tmp_path / "m.npz").config.ws_eps == 1e-10
