"""`vitlab export` / `vitlab.export_onnx` take exactly the values they can honour: the opsets torch's exporter
writes for every vitlab model (one declaration, `vitlab.ranges.ONNX_OPSET`, for the flag and the function), and
each argument of its type and range; anything else is one line naming the argument, before anything is loaded or
traced. What torch prints on the way never reaches the terminal, and a failure to write names the target."""

from __future__ import annotations

import errno
import logging

import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.ranges import ONNX_OPSET

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tests.deploy.test_onnx_export import SMALL, _model  # noqa: E402 - after the skips: it imports onnx too


@pytest.fixture(scope="module")
def vit():
    return _model(*SMALL["vit"])


@pytest.mark.parametrize("family", ["vit", "hybrid"])  # BiT has no attention: it exports from opset 7 (and
@pytest.mark.parametrize("end", ["low", "high"])       # at 20, torch's default: test_onnx_export)
def test_both_ends_of_the_opset_range_export_and_pass_the_check(family, end, tmp_path, caplog):
    """Each end exports, passes ONNX Runtime's check and is one torch's exporter supports (it warns above its
    highest and logs it here)."""
    opset = int(getattr(ONNX_OPSET, end))
    path = tmp_path / "m.onnx"
    with caplog.at_level(logging.DEBUG, logger="vitlab.deploy"):
        report = vitlab.export_onnx(_model(*SMALL[family]), path, opset=opset)
    assert report.check.passed and "is not supported" not in caplog.text
    assert [(i.domain, i.version) for i in onnx.load(str(path)).opset_import] == [("", opset)]


@pytest.mark.parametrize("opset", ["3", "9", "10", "13", "21", "30"])
def test_the_flag_refuses_an_opset_outside_the_range_in_one_line(opset, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["export", str(tmp_path / "w.safetensors"), str(tmp_path / "m.onnx"), "--opset", opset])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == (f"vitlab export: error: argument --opset: must be an integer in [14, 20], "
                                            f"got '{opset}' (see vitlab export --help)\n")


# case -> (keywords, the error's type, its whole message)
WRONG = {
    "opset 3": ({"opset": 3}, ValueError, "opset must be an integer in [14, 20], got 3"),
    "opset 21": ({"opset": 21}, ValueError, "opset must be an integer in [14, 20], got 21"),
    "opset 14.0": ({"opset": 14.0}, TypeError, "opset must be an integer in [14, 20], got 14.0"),
    "opset '14'": ({"opset": "14"}, TypeError, "opset must be an integer in [14, 20], got '14'"),
    "batch 2.5": ({"batch_size": 2.5}, TypeError, "batch_size must be an integer in [1, 1024], got 2.5"),
    "batch True": ({"batch_size": True}, TypeError, "batch_size must be an integer in [1, 1024], got True"),
    "batch 0": ({"batch_size": 0}, ValueError, "batch_size must be an integer in [1, 1024], got 0"),
    "batch 1025": ({"batch_size": 1025}, ValueError, "batch_size must be an integer in [1, 1024], got 1025"),
    "precision 5": ({"precision": 5}, TypeError, "precision must be one of auto, fp32, int8, bf16, got 5"),
    "precision fp16": ({"precision": "fp16"}, ValueError,
                       "precision must be one of auto, fp32, int8, bf16, got 'fp16'"),
    "force 'yes'": ({"force": "yes"}, TypeError, "force must be True or False, got 'yes'"),
    "path 5": ({"path": 5}, TypeError, "path must be a file path (str or pathlib.Path), got int"),
    "model 5": ({"model_or_weights": 5}, TypeError, "model_or_weights must be a vitlab model (vitlab.load, "
                "create_model) or weights (a path or a published name), got int"),
    "model Linear": ({"model_or_weights": torch.nn.Linear(2, 2)}, TypeError,
                     "model must be a vitlab model (from vitlab.load or create_model: a module with a .config), "
                     "got Linear"),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_a_wrong_argument_is_one_line_naming_it_and_prints_nothing(case, vit, tmp_path, capfd):
    keywords, kind, message = WRONG[case]
    call = {"model_or_weights": vit, "path": tmp_path / "m.onnx", **keywords}
    with pytest.raises(kind) as err:
        vitlab.export_onnx(call.pop("model_or_weights"), call.pop("path"), **call)
    assert str(err.value) == message
    assert capfd.readouterr() == ("", "") and list(tmp_path.iterdir()) == []


def test_weights_arguments_are_checked_before_the_weights_are_read(tmp_path):
    """A wrong argument is named even when the weights would take minutes to load (here: would not be found)."""
    with pytest.raises(TypeError, match=r"^batch_size must be an integer in \[1, 1024\], got 2\.5$"):
        vitlab.export_onnx(str(tmp_path / "missing.safetensors"), tmp_path / "m.onnx", batch_size=2.5)


class _NoOnnxKernel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.bessel_j0(x)  # no ONNX operator: the exporter fails after tracing


def test_an_exporter_failure_is_one_line_with_its_output_logged_not_printed(vit, tmp_path, capfd, caplog):
    model = _model(*SMALL["vit"])
    model.norm = torch.nn.Sequential(model.norm, _NoOnnxKernel())
    with caplog.at_level(logging.DEBUG, logger="vitlab.deploy"), pytest.raises(ValueError) as err:
        vitlab.export_onnx(model, tmp_path / "m.onnx", opset=17)
    line = str(err.value)
    assert line.startswith("torch's ONNX exporter cannot export this VisionTransformer at opset 17: Exporting the "
                           "operator 'aten::special_bessel_j0'") and "\n" not in line
    assert capfd.readouterr() == ("", "")  # neither its warnings nor the graph it dumps on failure
    assert "Torch IR graph at exception" in caplog.text  # kept for whoever asks (vitlab -v)
    assert list(tmp_path.iterdir()) == []


def test_a_storage_failure_inside_the_exporter_names_the_target(vit, tmp_path, monkeypatch, capsys):
    """The exporter writes its own files beside the target before the checked file is renamed into place: a full
    disk there is reported as the target's, not as a file vitlab made up."""
    def full_disk(model, args, f, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", f)

    monkeypatch.setattr(torch.onnx, "export", full_disk)
    target = tmp_path / "m.onnx"
    with pytest.raises(OSError) as err:
        vitlab.export_onnx(vit, target)
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(target)
    weights = tmp_path / "w.safetensors"
    vitlab.save(vit, weights)
    assert main(["export", str(weights), str(target)]) == 2
    assert capsys.readouterr().err == (f"vitlab export: error: {target}: No space left on device; free some space "
                                       "there or write elsewhere\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]  # no temporary, no work folder left


@pytest.mark.parametrize("name", ["m.safetensors", "m.pt", "m"])
def test_a_graph_is_written_only_under_an_onnx_name(name, vit, tmp_path, capsys):
    """predict and eval serve a graph by its .onnx name and read any other name as weights: an export under another
    name would be served by nothing, so it is refused before the tracing, from the command line and from Python."""
    weights = tmp_path / "w.safetensors"
    vitlab.save(vit, weights)
    target = tmp_path / name
    assert main(["export", str(weights), str(target)]) == 2
    assert capsys.readouterr().err == (f"vitlab export: error: {target}: an export is an ONNX graph, which predict "
                                       "and eval serve by its .onnx name; write m.onnx (vitlab convert writes weights "
                                       "in other formats)\n")
    with pytest.raises(ValueError, match=r"an export is an ONNX graph.*; write m\.onnx"):
        vitlab.export_onnx(vit, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


def test_weights_are_never_written_under_an_onnx_name(vit, tmp_path, capsys):
    """The other way round: vitlab.save and convert refuse a .onnx name, which predict and eval would serve as a
    graph (and vitlab.load refuses as one), each naming the command that writes ONNX."""
    weights = tmp_path / "w.safetensors"
    vitlab.save(vit, weights)
    with pytest.raises(ValueError, match=r"m\.onnx: vitlab\.save writes safetensors, but a \.onnx file is served as "
                                         r"an ONNX graph; name it m\.safetensors \(export_onnx writes ONNX\)"):
        vitlab.save(vit, tmp_path / "m.onnx")
    assert main(["convert", str(weights), str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "convert writes weights; an ONNX graph is what vitlab export writes" in err[0]
    assert main(["convert", str(weights), str(tmp_path / "m.onnx"), "--to", "vitlab"]) == 2
    assert "vitlab.save writes safetensors, but a .onnx file is served as an ONNX graph" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]
