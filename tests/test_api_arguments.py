"""`vitlab.load` and `vitlab.save` check each argument's type and range before any file is read or written, in
one line naming the argument; a model `load` could not rebuild (int8) is refused with what to do instead."""

from __future__ import annotations

import pytest

import vitlab

# case -> (call on a folder, the error's type, its whole message)
WRONG = {
    "load pretrained=5": (lambda d: vitlab.load(d / "m.safetensors", pretrained=5), TypeError,
                          "pretrained must be a tag name (str), True, False or None, got 5"),
    "load arch=5": (lambda d: vitlab.load(d / "m.safetensors", arch=5), TypeError,
                    "arch must be a timm architecture name (str) or None, got 5"),
    "load precision=5": (lambda d: vitlab.load(d / "m.safetensors", precision=5), TypeError,
                         "precision must be one of auto, fp32, bf16, int8, got 5"),
    "load precision='fp16'": (lambda d: vitlab.load(d / "m.safetensors", precision="fp16"), ValueError,
                              "precision must be one of auto, fp32, bf16, int8, got 'fp16'"),
    "save force='no'": (lambda d: vitlab.save(_tiny(), d / "m.safetensors", force="no"), TypeError,
                        "force must be True or False, got 'no'"),
    "save force=1": (lambda d: vitlab.save(_tiny(), d / "m.safetensors", force=1), TypeError,
                     "force must be True or False, got 1"),
}


def _tiny():
    return vitlab.create_model("ViT-Ti/16", depth=1, image_size=32, num_classes=3)


@pytest.mark.parametrize("case", list(WRONG))
def test_a_wrong_argument_is_one_line_naming_it_before_any_file(case, tmp_path):
    """m.safetensors does not exist: the argument is named, not the missing file."""
    call, kind, message = WRONG[case]
    with pytest.raises(kind) as err:
        call(tmp_path)
    assert str(err.value) == message and list(tmp_path.iterdir()) == []


def test_saving_an_int8_model_says_what_to_do_instead(tmp_path):
    from vitlab.runtime.quantize import quantize_int8

    with pytest.raises(ValueError) as err:
        vitlab.save(quantize_int8(_tiny()), tmp_path / "m.safetensors")
    assert str(err.value) == (
        "vitlab.save: an int8 (quantized) model cannot be saved as weights; save the float32 model before quantizing "
        "it (load(path, precision='int8') quantizes it again), or export it as int8 ONNX with "
        "export_onnx(model, path, precision='int8')")
    assert list(tmp_path.iterdir()) == []
