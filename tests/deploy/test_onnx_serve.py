"""`vitlab predict` and `vitlab eval` serve an ONNX file vitlab exported: the same top-1 and probabilities within
1e-4 as the PyTorch weights, pre-processed as its metadata says (the evaluation resize included); a file without
vitlab's metadata, a missing onnxruntime and PyTorch-only settings are one line each; the documented ONNX Runtime
snippet computes what `vitlab predict` does."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.data import EvalTransform, load_split, normalize
from vitlab.deploy.onnx_serve import open_onnx_session
from vitlab.eval.prediction import predict

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory) -> dict:
    """The trained tiny run's weights as .safetensors and as the .onnx `vitlab export` writes, and 40 digits of
    the embedded test split as PNG files."""
    root = tmp_path_factory.mktemp("serve")
    weights = tiny_run / "model.safetensors"
    assert main(["export", str(weights), str(root / "model.onnx")]) == 0
    split = load_split("digits", "val")
    images = root / "digits"
    images.mkdir()
    for i in range(40):
        Image.fromarray(split.arrays[i]).save(images / f"{i:02d}.png")
    return {"weights": weights, "onnx": root / "model.onnx", "images": images}


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_predict_of_the_onnx_file_matches_the_pytorch_weights(exported, tmp_path):
    records = {}
    for form in ("weights", "onnx"):
        out = tmp_path / f"{form}.json"
        assert main(["predict", "--weights", str(exported[form]), str(exported["images"]), "--json-out", str(out),
                     "--top-k", "10"]) == 0
        records[form] = json.loads(out.read_text())["predictions"]
    assert len(records["onnx"]) == len(records["weights"]) == 40
    for ours, theirs in zip(records["onnx"], records["weights"], strict=True):
        assert ours["image"] == theirs["image"]
        assert ours["top"][0]["class"] == theirs["top"][0]["class"]  # top-1 identical on every image
        by_class = {t["class"]: t["probability"] for t in theirs["top"]}
        assert max(abs(t["probability"] - by_class[t["class"]]) for t in ours["top"]) < 1e-4


def test_eval_of_the_onnx_file_matches_the_pytorch_weights(exported, tmp_path, capsys):
    docs, errors = {}, {}
    for form in ("weights", "onnx"):
        errors[form] = tmp_path / f"{form}.csv"
        assert main(["eval", "--weights", str(exported[form]), "--data", "digits", "--json", "--errors",
                     str(errors[form])]) == 0
        docs[form] = json.loads(capsys.readouterr().out)
    ours, theirs = docs["onnx"], docs["weights"]
    assert ours["count"] == theirs["count"] == 359 and ours["top1"] == theirs["top1"]
    assert ours["top5"] == theirs["top5"] and ours["loss"] == pytest.approx(theirs["loss"], abs=1e-5)
    assert ours["per_class"] == theirs["per_class"] and ours["eval_resize"] == theirs["eval_resize"] == "official"
    assert ours["precision"]["name"] == "fp32" and "ONNX Runtime" in ours["precision"]["reason"]
    rows = {form: list(csv.reader(errors[form].open()))[1:] for form in errors}
    assert [r[:3] for r in rows["onnx"]] == [r[:3] for r in rows["weights"]]  # the same images, same mistakes
    assert np.allclose([float(r[3]) for r in rows["onnx"]], [float(r[3]) for r in rows["weights"]], atol=1e-4)


def test_the_recorded_eval_resize_is_the_one_served(random_tiny_vit, noise_image, tmp_path):
    model = random_tiny_vit(0, num_classes=10)
    model.eval_resize = "big_vision"  # as vitlab.load sets it from a run that evaluated so
    path = tmp_path / "m.onnx"
    vitlab.export_onnx(model, path)
    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    assert meta["eval_resize"] == "big_vision"
    assert open_onnx_session(path).model.eval_resize == "big_vision"
    image = noise_image(tmp_path / "wide.png", size=(40, 22))  # not square: the resizes differ

    def reference(resize: str) -> np.ndarray:  # the transform PyTorch weights are evaluated with, by hand
        x = torch.tensor(EvalTransform(model.config.image_size, resize)(Image.open(image).convert("RGB")))
        with torch.no_grad():
            return model(normalize(x.permute(2, 0, 1)[None], model.config.mean, model.config.std))[0].softmax(-1)

    served = predict(str(path), [str(image)], top_k=10, session=open_onnx_session(path))[0]["top"]
    probs = np.array([t["probability"] for t in sorted(served, key=lambda t: t["index"])])
    assert np.abs(probs - reference("big_vision").numpy()).max() < 1e-4
    assert np.abs(probs - reference("official").numpy()).max() > 1e-3  # so the resize was what made them agree


def _rewritten(src: Path, dst: Path, drop: tuple[str, ...]) -> Path:
    proto = onnx.load(str(src))
    kept = [(p.key, p.value) for p in proto.metadata_props if p.key not in drop]
    del proto.metadata_props[:]
    for key, value in kept:
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(dst))
    return dst


def test_a_file_without_vitlab_metadata_is_one_line_naming_what_is_missing(exported, tmp_path, capsys, caplog):
    image = str(exported["images"] / "00.png")
    bare = _rewritten(exported["onnx"], tmp_path / "bare.onnx",
                      ("vitlab_config", "image_size", "mean", "std", "eval_resize", "precision", "class_names"))
    assert main(["predict", "--weights", str(bare), image]) == 2
    assert _one_line_error(capsys) == (
        f"vitlab predict: error: {bare} has no vitlab metadata (missing: vitlab_config, image_size, mean, std), so "
        "vitlab cannot tell how to feed it; serve a file vitlab export wrote (vitlab export WEIGHTS bare.onnx), or "
        "run this one in ONNX Runtime with its own pre-processing")
    partial = _rewritten(exported["onnx"], tmp_path / "partial.onnx", ("std",))
    assert main(["eval", "--weights", str(partial), "--data", "digits"]) == 2
    assert "has incomplete vitlab metadata (missing: std)" in _one_line_error(capsys)
    older = _rewritten(exported["onnx"], tmp_path / "older.onnx", ("eval_resize",))  # before the key existed
    assert main(["predict", "--weights", str(older), image]) == 0
    assert any("records no eval_resize" in r.getMessage() for r in caplog.records)
    capsys.readouterr()
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a graph")
    assert main(["predict", "--weights", str(broken), image]) == 2
    assert "broken.onnx is not an ONNX file ONNX Runtime can load" in _one_line_error(capsys)


def test_a_missing_onnxruntime_names_the_install_command(exported, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    assert main(["predict", "--weights", str(exported["onnx"]), str(exported["images"] / "00.png")]) == 2
    assert _one_line_error(capsys) == ("vitlab predict: error: running an ONNX file needs the onnxruntime package, "
                                       "which is missing: pip install 'vitlab[onnx]'")


@pytest.mark.parametrize("flags, said", [
    (["--precision", "int8"], "--precision int8: model.onnx computes in fp32, as it was exported"),
    (["--compile"], "--compile applies to PyTorch weights"),
    (["--device", "cuda"], "--device cuda: model.onnx runs on ONNX Runtime's CPU provider"),
])
def test_pytorch_only_settings_are_refused_in_one_line(exported, capsys, flags, said):
    assert main(["predict", "--weights", str(exported["onnx"]), str(exported["images"] / "00.png"), *flags]) == 2
    assert said in _one_line_error(capsys)


def test_the_documented_onnxruntime_snippet_computes_what_predict_does(exported, noise_image, tmp_path):
    page = (ROOT / "docs" / "deployment.md").read_text()
    assert '--8<-- "docs/snippets/onnxruntime_classify.py"' in page  # the page shows this very file
    spec = importlib.util.spec_from_file_location("snippet", ROOT / "docs" / "snippets" / "onnxruntime_classify.py")
    snippet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(snippet)
    for image in (noise_image(tmp_path / "photo.png", size=(37, 23)), exported["images"] / "07.png"):
        theirs = predict(str(exported["weights"]), [str(image)], top_k=5, device="cpu", precision="fp32")[0]["top"]
        ours = snippet.classify(str(exported["onnx"]), str(image), k=5)
        assert [name for name, _ in ours] == [t["class"] for t in theirs]
        assert np.allclose([p for _, p in ours], [t["probability"] for t in theirs], atol=1e-4)


def test_loading_an_onnx_file_as_weights_says_how_to_serve_it(exported):
    with pytest.raises(vitlab.weights.WeightsError, match=r"an ONNX file holds a graph to run, not weights .* "
                                                          r"onnxruntime.InferenceSession"):
        vitlab.load(exported["onnx"])


def test_a_graph_quantized_after_export_is_labelled_int8(exported, tmp_path, capsys):
    """ONNX Runtime's quantize_dynamic run on vitlab's fp32 export keeps the metadata's "fp32"; eval reads the
    precision from the graph's integer kernels instead, and says where it read it."""
    from onnxruntime.quantization import quantize_dynamic

    quantized = tmp_path / "model.int8.onnx"
    quantize_dynamic(str(exported["onnx"]), str(quantized))
    meta = {p.key: p.value for p in onnx.load(str(quantized)).metadata_props}
    assert meta["precision"] == "fp32"  # what the file says of itself
    assert main(["eval", "--weights", str(quantized), "--data", "digits", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["precision"]["name"] == "int8"
    assert "integer-kernel nodes in the graph, metadata says fp32" in record["precision"]["reason"]
    assert main(["eval", "--weights", str(exported["onnx"]), "--data", "digits", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["precision"]["name"] == "fp32"
