"""`vitlab export` / `vitlab.export_onnx`: the ONNX file runs in ONNX Runtime (an independent implementation) at a
batch size other than the traced one and agrees with PyTorch; a failed check, a bad path, a foreign file or a
missing package is one line and no file."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.files.outputs import written_by
from vitlab.models import ResNetConfig

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

SMALL = {  # every family at a few seconds' export: the hybrid's stem is an R50-style ResNet cut to two stages
    "vit": ("ViT-Ti/16", {"depth": 1}, 32),
    "hybrid": ("R50+ViT-B/16", {"depth": 1, "width": 32, "num_heads": 2, "mlp_dim": 64,
                                "resnet": ResNetConfig(layers=(1, 1), width_factor=0.5)}, 32),
    "bit": ("BiT-R50x1", {"layers": (1, 1, 1, 1)}, 32),
}


def _model(name: str, overrides: dict, size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = vitlab.create_model(name, num_classes=5, image_size=size, **overrides).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)  # the zero-initialised head would make every logit 0
    return model


def _run_onnx(path, x: torch.Tensor) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["pixels"]
    return sess.run(None, {"pixels": x.numpy()})[0]


def _relative(out: np.ndarray, ref: torch.Tensor) -> float:
    ref = ref.double().numpy()
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def _exported(name, overrides, size, tmp_path, batch=5, **kwargs):
    model = _model(name, overrides, size)
    path = tmp_path / "model.onnx"
    report = vitlab.export_onnx(model, path, **kwargs)
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x)
    return report, path, _run_onnx(path, x), ref


@pytest.mark.parametrize("family", list(SMALL))
def test_exported_file_runs_in_onnx_runtime_at_another_batch_size(family, tmp_path):
    name, overrides, size = SMALL[family]
    report, path, out, ref = _exported(name, overrides, size, tmp_path)  # traced at 2, run here at 5
    assert out.shape == (5, 5)
    assert report.check.batch_sizes == (2, 3) and report.check.error <= report.check.bound
    assert _relative(out, ref) <= max(1e-5, report.check.bound)
    assert report.check.bound <= 1e-4  # widened past 1e-5 only by float32's own rounding (BiT: ~2e-5)
    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    assert json.loads(meta["vitlab_config"])["num_classes"] == 5 and meta["precision"] == "fp32"
    assert meta["eval_resize"] == "official"  # a vitlab name's: what vitlab.transforms runs
    assert written_by(path) == "vitlab export"  # so the next export may replace it


@pytest.mark.parametrize("family", ["vit", "hybrid"])
def test_int8_export_stays_within_its_bound(family, tmp_path):
    name, overrides, size = SMALL[family]
    report, path, out, ref = _exported(name, overrides, size, tmp_path, precision="int8")
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert "DynamicQuantizeLinear" in ops and "MatMulInteger" in ops  # the encoder computes in int8
    assert 0 < _relative(out, ref) <= 0.10 and report.note == ""


def test_int8_export_of_a_trained_model_keeps_its_predictions(tmp_path):
    from tests.runtime.test_quantize import trained_digits_vit

    model, x, y = trained_digits_vit()
    report = vitlab.export_onnx(model, tmp_path / "int8.onnx", precision="int8")
    out = _run_onnx(tmp_path / "int8.onnx", x)  # all 359 validation images in one batch
    with torch.no_grad():
        ref = model(x)
    agree = float((out.argmax(-1) == ref.argmax(-1).numpy()).mean())
    assert agree >= 0.99 and _relative(out, ref) <= report.check.bound, (agree, _relative(out, ref))


def test_int8_of_bit_says_nothing_is_int8(tmp_path):
    report = vitlab.export_onnx(_model(*SMALL["bit"]), tmp_path / "bit.onnx", precision="int8")
    assert report.note.startswith("no Linear layer outside the head")


def test_cli_writes_the_file_and_reports_the_check(tmp_path, capsys):
    weights = tmp_path / "w.safetensors"
    vitlab.save(_model(*SMALL["vit"]), weights)
    out = tmp_path / "m.onnx"
    assert main(["export", str(weights), str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["precision"] == "fp32" and report["batch_sizes"] == [2, 3]
    assert report["relative_error"] <= 1e-5 and report["bytes"] == out.stat().st_size
    assert main(["export", str(weights), str(out)]) == 0  # its own earlier export is replaced
    assert capsys.readouterr().out.startswith(f"wrote {out} (fp32, ")


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", captured
    return lines[0]


def test_a_failing_check_is_one_line_and_no_file(tmp_path, capsys, monkeypatch):
    import vitlab.deploy.onnx_export as export

    describe = export._describe

    def corrupt(proto, model, precision):  # one weight 1 % off in the graph: ONNX Runtime now disagrees
        describe(proto, model, precision)
        init = next(t for t in proto.graph.initializer if t.dims and "head" in t.name)
        arr = onnx.numpy_helper.to_array(init) * 1.01
        init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))

    monkeypatch.setattr(export, "_describe", corrupt)
    weights = tmp_path / "w.safetensors"
    vitlab.save(_model(*SMALL["vit"]), weights)
    assert main(["export", str(weights), str(tmp_path / "m.onnx")]) == 2
    line = _one_line_error(capsys)
    assert line.startswith("vitlab export: error: ONNX Runtime's output differs from PyTorch's by 0.0")
    assert line.endswith(f"nothing written to {tmp_path / 'm.onnx'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]  # no file, no temporary


def test_a_bad_weights_path_is_one_line_and_no_file(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing.safetensors"), str(tmp_path / "m.onnx")]) == 2
    assert "missing.safetensors" in _one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_package_names_the_install_command(tmp_path, capsys, monkeypatch):
    weights = tmp_path / "w.safetensors"
    vitlab.save(_model(*SMALL["vit"]), weights)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    assert main(["export", str(weights), str(tmp_path / "m.onnx")]) == 2
    assert _one_line_error(capsys) == ("vitlab export: error: ONNX export needs the onnx and onnxruntime packages "
                                       "(onnxruntime is missing): pip install 'vitlab[onnx]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


def test_bf16_and_a_foreign_file_are_refused(tmp_path, capsys):
    weights = tmp_path / "w.safetensors"
    vitlab.save(_model(*SMALL["vit"]), weights)
    assert main(["export", str(weights), str(tmp_path / "m.onnx"), "--precision", "bf16"]) == 2
    assert "ONNX Runtime's CPU provider has no bf16 kernels" in _one_line_error(capsys)
    mine = tmp_path / "mine.onnx"
    mine.write_bytes(b"not vitlab's")
    assert main(["export", str(weights), str(mine)]) == 2
    assert "exists and vitlab did not write it" in _one_line_error(capsys)
    assert mine.read_bytes() == b"not vitlab's"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ViT-B/16", "R50+ViT-B/16", "BiT-R50x1"])
def test_full_size_models_export_and_agree(name, tmp_path):
    report, _, out, ref = _exported(name, {}, 224, tmp_path, batch=3)
    assert report.check.error <= report.check.bound <= 1e-4
    assert _relative(out, ref) <= max(1e-5, report.check.bound)
