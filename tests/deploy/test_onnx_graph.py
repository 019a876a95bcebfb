"""An ONNX file is served only where its graph agrees with its metadata: a float16 input, another rank or image
size, a fixed batch other than 1, or an output width that is not the class count is one line naming the file and
the mismatch (before: raw ONNX Runtime errors, an IndexError or silently wrong labels); a graph with a fixed batch of
1 is fed one image at a time and gives the dynamic graph's answers; a tampered eval_resize is refused like the flag."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.deploy.onnx_serve import open_onnx_session

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

CLASSES = 3
SIDE = 16


@pytest.fixture(scope="module")
def metadata(tmp_path_factory) -> dict[str, str]:
    """The metadata vitlab export writes for a 16 x 16, 3-class model."""
    torch.manual_seed(0)
    model = vitlab.create_model("ViT-Ti/16", image_size=SIDE, patch_size=4, width=32, depth=1, mlp_dim=64,
                                num_heads=2, num_classes=CLASSES).eval()
    path = tmp_path_factory.mktemp("m") / "m.onnx"
    vitlab.export_onnx(model, path)
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


def graph_file(path: Path, meta: dict[str, str], *, dtype: int = TensorProto.FLOAT, shape: list | None = None,
               classes: int = CLASSES, out_shape: list | None = None) -> Path:
    """A small graph as a vitlab file would be fed: pixels (N, 3, H, W) -> mean over H and W -> (N, 3) @ W ->
    logits (N, classes), with `meta` as its metadata; the input's type and shape and the output's as given."""
    shape = ["N", 3, SIDE, SIDE] if shape is None else shape
    weight = np.arange(3 * classes, dtype=np.float32).reshape(3, classes) / 10
    nodes = [helper.make_node("Cast", ["pixels"], ["x"], to=TensorProto.FLOAT),
             helper.make_node("ReduceMean", ["x"], ["m"], axes=list(range(2, len(shape))), keepdims=0),
             helper.make_node("MatMul", ["m", "w"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("pixels", dtype, shape)],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                             out_shape or ["N", classes])],
                              [helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.flatten())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(path))
    return path


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(("options", "said"), [
    ({"dtype": TensorProto.FLOAT16}, "its input 'pixels' is tensor(float16); vitlab feeds float32 pixels"),
    ({"shape": ["N", 3, 32, 32]}, "its input 'pixels' has shape (N, 3, 32, 32), its metadata says (N, 3, 16, 16)"),
    ({"shape": ["N", 3, SIDE]}, "its input 'pixels' has shape (N, 3, 16), its metadata says (N, 3, 16, 16)"),
    ({"shape": [4, 3, SIDE, SIDE]}, "its graph takes batches of exactly 4 images"),
    ({"classes": 5}, "its output 'logits' has shape (N, 5), its metadata says (N, 3) logits"),
])
def test_a_graph_that_disagrees_with_its_metadata_is_one_line(metadata, tmp_path, capsys, noise_image, options,
                                                              said):
    path = graph_file(tmp_path / "g.onnx", metadata, **options)
    image = noise_image(tmp_path / "x.png")
    assert main(["predict", "--weights", str(path), str(image)]) == 2
    assert one_line(capsys) == f"vitlab predict: error: {path}: {said}" + one_line_tail(said)


def one_line_tail(said: str) -> str:
    """The advice each message ends with."""
    if "batches of exactly" in said:
        return "; vitlab serves graphs with a dynamic batch (vitlab export writes them) or a batch of 1"
    if "float16" in said:
        return ", as vitlab export writes them: re-export the weights (vitlab export)"
    return "; re-export the weights (vitlab export)"


def test_an_output_width_the_graph_leaves_open_is_checked_when_it_runs(metadata, tmp_path):
    """Logits of another width than the class count at run time (a graph whose output width is symbolic): refused
    naming the file, rather than labels read past the class names."""
    model = open_onnx_session(graph_file(tmp_path / "g.onnx", metadata)).model

    class FiveWide:  # the session of such a graph, as far as the model sees it
        def run(self, names, feed):
            return [np.zeros((len(feed["pixels"]), 5), np.float32)]

    model.session = FiveWide()
    with pytest.raises(ValueError) as err:
        model(torch.zeros(2, 3, SIDE, SIDE))
    assert str(err.value) == (f"{tmp_path / 'g.onnx'}: its graph returned logits of shape (2, 5) for 2 images of a "
                              "3-class model (its metadata); re-export the weights (vitlab export)")


def test_a_batch_one_graph_is_fed_one_image_at_a_time(metadata, tmp_path):
    """The same graph traced for a fixed batch of 1 and for a dynamic batch: the same logits for 5 images."""
    fixed = open_onnx_session(graph_file(tmp_path / "one.onnx", metadata, shape=[1, 3, SIDE, SIDE])).model
    dynamic = open_onnx_session(graph_file(tmp_path / "n.onnx", metadata)).model
    x = torch.randn(5, 3, SIDE, SIDE)
    assert fixed.one_at_a_time and not dynamic.one_at_a_time
    assert torch.equal(fixed(x), dynamic(x)) and fixed(x).shape == (5, CLASSES)


@pytest.mark.parametrize("resize", ["timm:bilinear:0.001", "timm:bicubic:0", "timm:bicubic:nan", "nonsense"])
def test_a_tampered_eval_resize_is_refused_naming_the_file(metadata, tmp_path, capsys, noise_image, resize):
    """`eval_resize: timm:bilinear:0.001` asked for a 16,000-pixel resize of every image: refused as the flag's
    value would be, naming the file."""
    path = graph_file(tmp_path / "g.onnx", {**metadata, "eval_resize": resize})
    assert main(["predict", "--weights", str(path), str(noise_image(tmp_path / "x.png"))]) == 2
    line = one_line(capsys)
    assert line.startswith(f"vitlab predict: error: {path}: its metadata's ") and repr(resize) in line
