"""`vitlab train / finetune / eval / predict` from the command line: outputs and one-line errors (exit 2)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from tests.conftest import TINY_TRAIN_FLAGS, TINY_VIT_ARGS
from vitlab.cli import main


def folder(root, classes=("a", "b", "c"), splits=("train", "val"), per_class=3):
    for split in splits:
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.new("RGB", (10, 10), (80 * c, 40 * i, 0)).save(root / split / name / f"{i}.png")
    return root


@pytest.fixture
def trained(tiny_run):
    """One tiny digits run shared by the eval/predict tests (tests/conftest.py trains it once)."""
    return tiny_run


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1
    return err[-1]


def test_train_prints_summary(trained, capsys):
    assert (trained / "model.safetensors").exists() and (trained / "curves.png").exists()
    records = [json.loads(x) for x in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3]


def test_train_cli_flags_reach_the_config(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", "--out", str(out), "--steps", "2", "--lr", "0.002", "--wd", "0.1", "--clip", "0",
                 "--no-flip", "--crop-scale", "0.3", "1", "--ema", "0.9", "--accum", "2", *TINY_TRAIN_FLAGS]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["lr"], cfg["weight_decay"], cfg["grad_clip"], cfg["flip"], cfg["ema"], cfg["accum"]) == (
        0.002, 0.1, 0.0, False, 0.9, 2)
    assert cfg["crop_scale"] == [0.3, 1.0] and cfg["model_args"]["width"] == 32
    stdout = capsys.readouterr().out
    assert stdout.startswith("done: step 2, val top-1") and "img/s data" in stdout
    # --resume restores the recorded settings; flags given now override them
    assert main(["train", "--out", str(out), "--resume", "--steps", "3"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["steps"], cfg["lr"], cfg["resume"]) == (3, 0.002, True)


def test_eval_prints_metrics_and_writes_confusion(trained, tmp_path, capsys):
    png = tmp_path / "cm.png"
    assert main(["eval", "--weights", str(trained), "--data", "digits", "--confusion", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("top-1 ") and "top-5" in out and "(359 images)" in out
    assert png.stat().st_size > 1000
    assert main(["eval", "--weights", str(trained / "model.safetensors"), "--data", "digits", "--json",
                 "--confusion", str(png)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["count"] == 359 and 0 <= result["top1"] <= result["top5"] <= 1


def test_predict_top5_and_json(trained, tmp_path, capsys):
    images = []
    for i in range(2):
        path = tmp_path / f"{i}.png"
        Image.fromarray((np.random.RandomState(i).rand(8, 8) * 255).astype(np.uint8)).save(path)
        images.append(str(path))
    assert main(["predict", "--weights", str(trained), *images]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(images[0] + ": ") and lines[0].count(",") == 4
    assert main(["predict", "--weights", str(trained), "--json", *images]) == 0
    result = json.loads(capsys.readouterr().out)
    top = result[1]["top"]
    assert len(top) == 5 and top[0]["class"] in [str(d) for d in range(10)]
    assert sum(t["probability"] for t in top) <= 1.0 + 1e-6
    assert top == sorted(top, key=lambda t: -t["probability"])


def test_finetune_from_vitlab_weights_on_a_folder(trained, tmp_path, capsys):
    data = folder(tmp_path / "data")
    out = tmp_path / "ft"
    assert main(["finetune", "--init", str(trained / "model.safetensors"), "--data", str(data), "--out", str(out),
                 "--image-size", "12", "--steps", "2", "--batch-size", "9", "--warmup", "1", "--workers", "0"]) == 0
    import vitlab

    model = vitlab.load(out / "model.safetensors")
    assert model.config.image_size == (12, 12) and model.config.num_classes == 3
    assert model.class_names == ["a", "b", "c"]


def test_finetune_resumes_without_init_from_another_folder(trained, tmp_path, monkeypatch, capsys):
    """The run records its --init (as typed: here relative); a resume needs nothing of it, so it may leave it out,
    as the refusal of another --init advises, wherever it is started from."""
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    (tmp_path / "a" / "init.safetensors").write_bytes((trained / "model.safetensors").read_bytes())
    flags = ["--data", "digits", "--steps", "2", "--batch-size", "32", "--warmup", "1", "--workers", "0",
             "--eval-every", "0", "--save-every", "2"]
    assert main(["finetune", "--init", "init.safetensors", "--out", "../run", *flags]) == 0
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["finetune", "--out", "run", "--resume", "--steps", "3"]) == 0
    assert capsys.readouterr().out.startswith("done: step 3,")


def test_finetune_without_init_is_one_line_unless_it_resumes(tmp_path, capsys):
    for resume in ([], ["--resume", "auto"]):
        assert main(["finetune", "--data", "digits", "--out", str(tmp_path / "run"), *resume]) == 2
        line = "vitlab finetune: error: --init WEIGHTS is required for finetune: the weights to start from\n"
        assert capsys.readouterr().err == line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing_split", r"vitlab train: error: missing split: .* has no val/ folder"),
        ("empty_class", r"vitlab train: error: class folder .*b has no images \(\.jpg, \.jpeg, \.png, \.webp\)"),
        ("num_classes", r"vitlab train: error: num_classes mismatch: --num-classes 7 but .* has 3 classes"),
        ("strict", r"vitlab train: error: 1 unreadable image\(s\) in .*broken\.jpg \(--strict\)"),
        ("strict_val", r"vitlab train: error: 1 unreadable image\(s\) in evaluation: .*cut\.jpg \(--strict\)"),
        ("resume_without_out", r"vitlab train: error: --resume needs --out RUN_DIR"),
        ("used_out", r"vitlab train: error: .* already holds a run; pass --resume"),
        ("diverged", r"vitlab train: error: loss is (nan|inf) at step \d+; stopped without saving it"),
        ("bad_model", r"vitlab train: error: unknown model 'ViT-Q/3'"),
        ("finetune_no_data", r"vitlab finetune: error: --data is required for finetune"),
        ("finetune_bad_init", r"vitlab finetune: error: .*nope: no such file or folder"),
    ],
)
def test_train_errors_are_one_line(tmp_path, capsys, case, message):
    data = tmp_path / "data"
    out = ["--out", str(tmp_path / "out")]
    args = ["train", "--data", str(data), *out, "--steps", "2", *TINY_TRAIN_FLAGS]
    if case == "missing_split":
        folder(data, splits=("train",))
    elif case == "empty_class":
        folder(data)
        for f in (data / "train" / "b").iterdir():
            f.unlink()
    elif case == "num_classes":
        folder(data)
        args += ["--num-classes", "7"]
    elif case == "strict":
        folder(data)
        (data / "train" / "a" / "broken.jpg").write_bytes(b"\xff\xd8 garbage")
        args += ["--strict"]
    elif case == "strict_val":  # its header reads, its pixels do not: found by the evaluation at the end
        folder(data)
        whole = io.BytesIO()
        Image.fromarray(np.random.RandomState(0).randint(0, 256, (64, 64, 3), dtype=np.uint8)).save(whole, "JPEG")
        (data / "val" / "a" / "cut.jpg").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
        args += ["--strict"]
    elif case == "resume_without_out":
        args = ["train", "--resume"]
    elif case == "used_out":
        folder(data)
        assert main(args) == 0
        capsys.readouterr()
    elif case == "diverged":
        args = ["train", *out, *TINY_TRAIN_FLAGS, "--steps", "6", "--optimizer", "sgd", "--lr", "100", "--warmup", "0",
                "--clip", "0"]  # SGD at the flag's bound: the weights overflow within a few steps
    elif case == "bad_model":
        args = ["train", *out, "--model", "ViT-Q/3", "--steps", "1"]
    elif case == "finetune_no_data":
        args = ["finetune", "--init", "x.safetensors", *out]
    elif case == "finetune_bad_init":
        folder(data)
        args = ["finetune", "--init", str(tmp_path / "nope"), "--data", str(data), *out]
    assert main(args) == 2
    line = error_line(capsys)
    assert __import__("re").match(message, line), line


def test_eval_and_predict_errors(trained, tmp_path, capsys):
    data = folder(tmp_path / "data")
    assert main(["eval", "--weights", str(trained), "--data", str(data), "--confusion", str(tmp_path / "c.png")]) == 2
    assert "/val has class folders unknown to the 10 training classes: a, b, c" in error_line(capsys)
    assert main(["eval", "--weights", str(trained), "--data", str(tmp_path / "none")]) == 2
    assert "does not exist" in error_line(capsys)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    assert main(["predict", "--weights", str(trained), str(bad)]) == 2
    assert error_line(capsys).startswith(f"vitlab predict: error: cannot read image {bad}")
    assert main(["predict", "--weights", str(tmp_path / "missing.safetensors"), str(bad)]) == 2
    assert "no such file or folder" in error_line(capsys)


def test_eval_class_mismatches(tmp_path, capsys):
    import vitlab

    seven = tmp_path / "seven.safetensors"
    vitlab.save(vitlab.create_model("ViT-Ti/4", num_classes=7, image_size=8, depth=1, width=32, num_heads=2,
                                    mlp_dim=64), seven)
    assert main(["eval", "--weights", str(seven), "--data", "digits"]) == 2
    assert error_line(capsys) == (
        "vitlab eval: error: num_classes mismatch: the weights have 7 classes, digits has 10; "
        "evaluate on the dataset the model was trained for")
    letters = tmp_path / "letters.safetensors"
    model = vitlab.create_model("ViT-Ti/4", num_classes=10, image_size=8, **TINY_VIT_ARGS)
    model.class_names = list("abcdefghij")
    vitlab.save(model, letters)
    assert main(["eval", "--weights", str(letters), "--data", "digits"]) == 2
    assert "vitlab eval: error: class names of digits differ from the weights' (a, b, c, d, e, …)" in error_line(capsys)
