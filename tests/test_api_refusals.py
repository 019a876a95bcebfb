"""Every refusal of the Python entry points (vitlab.fit, load, save, export_onnx, create_model) speaks Python: it
names keywords (`resume=True`, `out=`) and functions, never a command-line flag (`--out`): the one mechanism is
vitlab.errors.setting / by_surface, which spell a setting by the caller's surface."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import vitlab
from tests.conftest import TINY_TRAIN, TINY_TRAIN_FLAGS
from vitlab.errors import VitlabError

FLAG = re.compile(r"(?<![\w-])--[a-z][\w-]*")  # a flag's spelling: --out, --resume, --val-fraction


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny saved ViT, a finished tiny run and a few files each refusal points at."""
    root = tmp_path_factory.mktemp("refusals")
    model = vitlab.create_model("ViT-Ti/16", num_classes=3, image_size=32, depth=1)
    vitlab.save(model, root / "tiny.safetensors")
    (root / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(64))
    (root / "notes.txt").write_text("not weights")
    (root / "foreign").mkdir()
    (root / "foreign" / "theirs.txt").write_text("someone else's")
    (root / "a_file").write_text("x")
    run = root / "run"
    vitlab.fit(data="digits", out=str(run), steps=2, progress=False, **TINY_TRAIN)
    return {"root": root, "model": model, "weights": root / "tiny.safetensors", "run": run}


def _cases():
    r = lambda t, *parts: str(Path(t["root"], *parts))  # noqa: E731
    return {
        # vitlab.create_model
        "create_model unknown name": lambda t: vitlab.create_model("ViT-Q/16"),
        "create_model unknown keyword": lambda t: vitlab.create_model("ViT-Ti/16", no_such_option=1),
        "create_model bad image_size": lambda t: vitlab.create_model("ViT-Ti/16", image_size=30),
        "create_model unknown checkpoint": lambda t: vitlab.create_model("ViT-Ti/16", pretrained="no-such-tag"),
        "create_model bad num_classes": lambda t: vitlab.create_model("ViT-Ti/16", num_classes=-1),
        # vitlab.load
        "load missing file": lambda t: vitlab.load(r(t, "missing.safetensors")),
        "load an image": lambda t: vitlab.load(r(t, "photo.jpg")),
        "load a text file": lambda t: vitlab.load(r(t, "notes.txt")),
        "load an ONNX file": lambda t: vitlab.load(r(t, "model.onnx")) if _onnx(t) else None,
        "load bad precision": lambda t: vitlab.load(t["weights"], precision="fp8"),
        "load bad image_size": lambda t: vitlab.load(t["weights"], image_size=30),
        "load a foreign folder": lambda t: vitlab.load(r(t, "foreign")),
        # vitlab.save
        "save not a model": lambda t: vitlab.save({"w": torch.zeros(1)}, r(t, "x.safetensors")),
        "save over a foreign file": lambda t: vitlab.save(t["model"], r(t, "notes.txt")),
        "save as a pickle": lambda t: vitlab.save(t["model"], r(t, "x.pt")),
        "save as onnx": lambda t: vitlab.save(t["model"], r(t, "x.onnx")),
        "save force not bool": lambda t: vitlab.save(t["model"], r(t, "y.safetensors"), force="yes"),
        "save into a run's files": lambda t: vitlab.save(t["model"], t["run"] / "model.safetensors"),
        "save an int8 model": lambda t: vitlab.save(vitlab.load(t["weights"], precision="int8"), r(t, "q.safetensors")),
        # vitlab.export_onnx
        "export_onnx not a model": lambda t: vitlab.export_onnx(42, r(t, "m.onnx")),
        "export_onnx over a foreign file": lambda t: vitlab.export_onnx(t["model"], r(t, "notes.txt")),
        "export_onnx bad precision": lambda t: vitlab.export_onnx(t["model"], r(t, "m.onnx"), precision="fp8"),
        "export_onnx bad batch_size": lambda t: vitlab.export_onnx(t["model"], r(t, "m.onnx"), batch_size=0),
        "export_onnx not .onnx": lambda t: vitlab.export_onnx(t["model"], r(t, "m.safetensors")),
        "export_onnx a converted model": lambda t: vitlab.export_onnx(
            vitlab.load(t["weights"], precision="int8"), r(t, "m.onnx")),
        # vitlab.fit: before the run
        "fit resume without out": lambda t: vitlab.fit(resume=True),
        "fit int8": lambda t: vitlab.fit(precision="int8"),
        "fit lora_alpha alone": lambda t: vitlab.fit(lora_alpha=4.0),
        "fit accum": lambda t: vitlab.fit(batch_size=10, accum=3),
        "fit epochs and steps": lambda t: vitlab.fit(epochs=2, steps=3),
        "fit empty data": lambda t: vitlab.fit(data=" "),
        "fit unknown keyword": lambda t: vitlab.fit(learning_rate=0.1),
        "fit wrong type": lambda t: vitlab.fit(steps="many"),
        "fit out of range": lambda t: vitlab.fit(lr=-1.0),
        "fit unknown recipe": lambda t: vitlab.fit("no-such-recipe"),
        "fit bad val_fraction": lambda t: vitlab.fit(data="digits", val_fraction=1.5),
        "fit warmup over steps": lambda t: vitlab.fit(data="digits", steps=4, warmup=10, out=r(t, "w")),
        "fit dev_fraction without sweep": lambda t: vitlab.fit(data="digits", dev_fraction=0.1, out=r(t, "d")),
        "fit negative lr_sweep": lambda t: vitlab.fit(data="digits", lr_sweep=(-0.1, 0.1), out=r(t, "s")),
        "fit out is a file": lambda t: vitlab.fit(data="digits", steps=1, out=r(t, "a_file")),
        "fit out is foreign": lambda t: vitlab.fit(data="digits", steps=1, out=r(t, "foreign")),
        "fit out holds a run": lambda t: vitlab.fit(data="digits", steps=1, out=str(t["run"])),
        "fit resume contradicts": lambda t: vitlab.fit(data="digits", out=str(t["run"]), resume=True, lr=0.5),
        "fit resume shorter": lambda t: vitlab.fit(data="digits", out=str(t["run"]), resume=True, steps=1),
        "fit num_classes mismatch": lambda t: vitlab.fit(data="digits", steps=1, num_classes=3, out=r(t, "n")),
        "fit model_args unknown": lambda t: vitlab.fit(data="digits", steps=1, model_args={"no_such": 1},
                                                       out=r(t, "m")),
        "fit init contradicts model": lambda t: vitlab.fit("finetune", init=str(t["weights"]), model="ViT-B/16",
                                                           data="digits", steps=1, out=r(t, "i")),
        "fit representation_size with init": lambda t: vitlab.fit("finetune", init=str(t["weights"]),
                                                                  representation_size=8, data="digits", steps=1,
                                                                  out=r(t, "rs")),
        "fit layer_decay on BiT": lambda t: vitlab.fit(data="digits", steps=1, model="BiT-R50x1", layer_decay=0.7,
                                                       image_size=32, out=r(t, "ld")),
        "fit drop_path_rate on BiT": lambda t: vitlab.fit(data="digits", steps=1, model="BiT-R50x1",
                                                          drop_path_rate=0.1, image_size=32, out=r(t, "dp")),
        "fit lora on BiT": lambda t: vitlab.fit("finetune", init=vitlab.create_model("BiT-R50x1", num_classes=3),
                                                lora_rank=4, data="digits", steps=1, image_size=32, out=r(t, "lo")),
    }


def _onnx(t) -> bool:
    path = Path(t["root"], "model.onnx")
    if not path.exists():
        path.write_bytes(b"\x08\x07" + bytes(32))
    return True


CASES = _cases()


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_every_refusal_of_the_python_api_names_keywords_not_flags(case, tiny):
    with pytest.raises((VitlabError, ValueError, TypeError, FileExistsError, FileNotFoundError)) as err:
        CASES[case](tiny)
    message = str(err.value)
    assert message and "\n" not in message.strip(), f"{case}: not one line: {message!r}"
    assert not FLAG.search(message), f"{case}: a flag in a Python error: {message}"


def test_the_same_refusal_names_flags_on_the_command_line(tiny, capsys):
    from vitlab.cli import main

    assert main(["train", "--data", "digits", "--steps", "1", "--out", str(tiny["run"]), *TINY_TRAIN_FLAGS]) == 2
    assert "pass --resume to continue it or choose another --out DIR" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"pass resume=True to continue it or choose another out=DIR"):
        vitlab.fit(data="digits", steps=1, out=str(tiny["run"]))


def test_load_names_an_image_passed_as_weights(tiny):
    from PIL import Image

    for suffix in ("png", "jpg", "gif", "webp"):
        path = tiny["root"] / f"picture.{suffix}"
        Image.new("RGB", (8, 8)).save(path)
        with pytest.raises(ValueError, match=r"an image, not weights; load weights, then vitlab.transforms\(model\)"):
            vitlab.load(path)
