"""Nothing vitlab writes lands where it should not, and says so in one line.

- An output path that exists and is not a regular file (a character device, a FIFO, a symbolic link, a folder) is
  refused in one line, exit code 2, and stays what it was (checked with os.lstat; special files are made in
  tmp_path, never the machine's /dev/null).
- An existing regular file is replaced only if vitlab wrote it (its mark: JSON key, safetensors metadata, PNG
  text chunk, zip comment, Markdown comment), or with --force (vitlab.save: force=True); the user's bytes are
  checked by sha256.
- A folder export (--to hf|timm DIR) replaces only an earlier export; a folder holding the user's README.md or
  config.json is refused, one holding anything else even with --force.
- Messages name the user's path, never vitlab's temporary, and say what is wrong: a file where a folder should
  be, a whole path over PATH_MAX (not "255 bytes per name").
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.errors import OutputRefused
from vitlab.files.outputs import atomic_write, check_output, os_error_line, written_by
from vitlab.models import ViTConfig, build_model

TINY = ViTConfig(image_size=8, patch_size=4, width=16, depth=1, mlp_dim=32, num_heads=2, num_classes=10)
PRECIOUS = b"precious notes of the user\n"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_sha(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f.relative_to(folder).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def weights(tmp_path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "src.safetensors"
    vitlab.save(build_model(TINY), path)
    return path


def special(tmp_path: Path, kind: str) -> Path:
    """A special file of `kind` in tmp_path: fifo, chardev (like /dev/null: 1,3; root only), symlink (to a user
    file, which must keep its bytes), folder."""
    path = tmp_path / f"special-{kind}.out"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "chardev":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a character device needs root")
    elif kind == "symlink":
        (tmp_path / "target.txt").write_bytes(PRECIOUS)
        path.symlink_to(tmp_path / "target.txt")
    else:
        path.mkdir()
    return path


def still(path: Path, kind: str) -> bool:
    mode = os.lstat(path).st_mode
    return {"fifo": stat.S_ISFIFO, "chardev": stat.S_ISCHR, "symlink": stat.S_ISLNK, "folder": stat.S_ISDIR}[kind](mode)


def refused(capsys, verb: str, path: Path, words: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"vitlab {verb}: error: {path}: ") and words in err[0], err[0]
    assert "vitlab-tmp" not in err[0] and "Traceback" not in err[0]


KINDS = ["fifo", "chardev", "symlink", "folder"]
WORDS = {"fifo": "is a FIFO", "chardev": "is a character device", "symlink": "is a symbolic link",
         "folder": "is a folder"}


# --- special files are never renamed over ------------------------------------------------------------------------
@pytest.mark.parametrize("kind,to", [(k, to) for k in KINDS for to in ("vitlab", "timm", "jax-npz")
                                     if (k, to) != ("folder", "timm")])  # a folder is what --to timm writes
def test_convert_refuses_a_special_output_and_leaves_it_special(tmp_path, weights, capsys, kind, to):
    out = special(tmp_path, kind)
    code = main(["-q", "convert", str(weights), str(out), "--to", to, "--force"])  # --force does not lift it
    assert code == 2
    refused(capsys, "convert", out, WORDS[kind])
    assert still(out, kind)
    if kind == "symlink":
        assert (tmp_path / "target.txt").read_bytes() == PRECIOUS


@pytest.mark.parametrize("kind", ["fifo", "chardev", "symlink"])
def test_convert_to_a_folder_format_refuses_a_special_path(tmp_path, weights, capsys, kind):
    out = special(tmp_path, kind)
    assert main(["-q", "convert", str(weights), str(out), "--to", "hf"]) == 2
    refused(capsys, "convert", out, WORDS[kind])
    assert still(out, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_vitlab_save_refuses_a_special_path(tmp_path, kind):
    out = special(tmp_path, kind)
    with pytest.raises(FileExistsError) as info:
        vitlab.save(build_model(TINY), out, force=True)
    line = str(info.value)
    assert line.startswith(f"{out}: exists and ") and WORDS[kind] in line and "\n" not in line
    assert still(out, kind)


@pytest.mark.parametrize("kind", ["fifo", "chardev", "symlink"])
def test_eval_confusion_refuses_a_special_path_before_evaluating(tmp_path, weights, capsys, kind, monkeypatch):
    out = special(tmp_path, kind)
    import vitlab.eval.classify as classify

    monkeypatch.setattr(classify, "evaluate_weights", lambda *a, **k: pytest.fail("evaluated first"))
    assert main(["eval", "--weights", str(weights), "--data", "digits", "--confusion", str(out)]) == 2
    refused(capsys, "eval", out, WORDS[kind])
    assert still(out, kind)


@pytest.mark.parametrize("kind", ["fifo", "chardev", "symlink"])
def test_fewshot_json_refuses_a_special_path(tmp_path, weights, capsys, kind):
    out = special(tmp_path, kind)
    assert main(["fewshot", "--weights", str(weights), "--data", "digits", "--shots", "1", "--seeds", "1",
                 "--json", str(out), "--force"]) == 2
    refused(capsys, "fewshot", out, WORDS[kind])
    assert still(out, kind)


def test_bench_json_refuses_a_fifo_and_a_users_file_before_timing(tmp_path, capsys):
    fifo = special(tmp_path, "fifo")
    user = tmp_path / "mine.json"
    user.write_bytes(PRECIOUS)
    for out, words in ((fifo, "is a FIFO"), (user, "vitlab did not write it; pass --force")):
        assert main(["bench", "--model", "ViT-Ti/16", "--image-size", "32", "--batch-size", "1", "--repeats", "1",
                     "--warmup", "0", "--min-time", "0", "--mode", "infer", "--json", str(out)]) == 2
        refused(capsys, "bench", out, words)
    assert still(fifo, "fifo") and user.read_bytes() == PRECIOUS


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_analyze_refuses_a_special_file_among_its_outputs(tmp_path, weights, capsys, kind):
    out = tmp_path / "figs"
    out.mkdir()
    made = special(tmp_path, kind)
    made.rename(out / "attention_rollout.png")
    assert main(["analyze", "--weights", str(weights), "--out", str(out), "--num-images", "2"]) == 2
    refused(capsys, "analyze", out / "attention_rollout.png", WORDS[kind])
    assert still(out / "attention_rollout.png", kind)


def test_internal_writes_refuse_a_special_file_too(tmp_path):
    """The rename itself refuses: a writer inside vitlab that names a FIFO never replaces it."""
    fifo = special(tmp_path, "fifo")
    with pytest.raises(OutputRefused, match="is a FIFO"):
        atomic_write(fifo, lambda tmp: Path(tmp).write_text("x"))
    assert still(fifo, "fifo") and [p.name for p in tmp_path.iterdir()] == [fifo.name]


# --- the user's files are never replaced unasked ------------------------------------------------------------------
@pytest.mark.parametrize("name,to", [("x.safetensors", "vitlab"), ("x.npz", "jax-npz"), ("x.safetensors", "timm"),
                                     ("x.pth", "timm")])
def test_convert_refuses_a_users_file_and_replaces_its_own(tmp_path, weights, capsys, name, to):
    out = tmp_path / name
    out.write_bytes(PRECIOUS)
    assert main(["-q", "convert", str(weights), str(out), "--to", to]) == 2
    refused(capsys, "convert", out, "exists and vitlab did not write it; pass --force to replace it, or choose a new")
    assert out.read_bytes() == PRECIOUS
    assert main(["-q", "convert", str(weights), str(out), "--to", to, "--force"]) == 0
    assert written_by(out) == "vitlab" and out.read_bytes() != PRECIOUS
    os.utime(out, (0, 0))
    assert main(["-q", "convert", str(weights), str(out), "--to", to]) == 0  # its own: replaced without --force
    assert os.stat(out).st_mtime > 0 and written_by(out) == "vitlab"


def test_convert_card_beside_a_file_is_held_to_the_rule(tmp_path, weights, capsys):
    card = tmp_path / "x.md"
    card.write_bytes(PRECIOUS)
    assert main(["-q", "convert", str(weights), str(tmp_path / "x.safetensors"), "--card"]) == 2
    refused(capsys, "convert", card, "vitlab did not write it")
    assert card.read_bytes() == PRECIOUS and not (tmp_path / "x.safetensors").exists()


@pytest.mark.parametrize("to", ["hf", "timm"])
def test_convert_to_a_folder_holding_the_users_readme_and_config_is_refused(tmp_path, weights, capsys, to):
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "README.md").write_bytes(PRECIOUS)
    (folder / "config.json").write_text('{"mine": true}\n')
    before = tree_sha(folder)
    assert main(["-q", "convert", str(weights), str(folder), "--to", to]) == 2
    refused(capsys, "convert", folder, "README.md has no vitlab mark")
    assert tree_sha(folder) == before
    (folder / "photo.jpg").write_bytes(PRECIOUS)  # anything an export does not write: refused even with --force
    assert main(["-q", "convert", str(weights), str(folder), "--to", to, "--force"]) == 2
    refused(capsys, "convert", folder, "holds 'photo.jpg'")
    (folder / "photo.jpg").unlink()
    assert main(["-q", "convert", str(weights), str(folder), "--to", to, "--force"]) == 0
    assert "<!-- written_by: vitlab -->" in (folder / "README.md").read_text()
    assert main(["-q", "convert", str(weights), str(folder), "--to", to]) == 0  # an earlier export: replaced


def test_eval_confusion_keeps_a_users_png_and_replaces_its_own(tmp_path, weights, capsys):
    png = tmp_path / "user.png"
    png.write_bytes(PRECIOUS)
    argv = ["eval", "--weights", str(weights), "--data", "digits", "--confusion", str(png)]
    assert main(argv) == 2
    refused(capsys, "eval", png, "vitlab did not write it; pass --force")
    assert png.read_bytes() == PRECIOUS
    assert main([*argv, "--force"]) == 0
    assert written_by(png) == "vitlab eval"
    assert main(argv) == 0  # its own figure: replaced


def test_fewshot_json_keeps_a_users_file_and_replaces_its_own(tmp_path, weights, capsys):
    out = tmp_path / "user.json"
    out.write_text('{"mine": 1}\n')
    before = sha(out)
    argv = ["fewshot", "--weights", str(weights), "--data", "digits", "--shots", "1", "--seeds", "1",
            "--json", str(out)]
    assert main(argv) == 2
    refused(capsys, "fewshot", out, "vitlab did not write it; pass --force")
    assert sha(out) == before
    assert main([*argv, "--force"]) == 0
    assert json.loads(out.read_text())["written_by"] == "vitlab fewshot"
    assert main(argv) == 0


def test_analyze_keeps_a_users_figure(tmp_path, weights, capsys):
    out = tmp_path / "figs"
    out.mkdir()
    (out / "attention_rollout.png").write_bytes(PRECIOUS)
    assert main(["analyze", "--weights", str(weights), "--out", str(out), "--num-images", "2"]) == 2
    assert "attention_rollout.png was not written by vitlab analyze" in capsys.readouterr().err
    assert (out / "attention_rollout.png").read_bytes() == PRECIOUS


def test_vitlab_save_keeps_a_users_file_unless_forced(tmp_path):
    model = build_model(TINY)
    out = tmp_path / "m.safetensors"
    out.write_bytes(PRECIOUS)
    with pytest.raises(FileExistsError) as info:
        vitlab.save(model, out)
    assert str(info.value) == (f"{out}: exists and vitlab did not write it; pass force=True to replace it, or "
                               "choose a new name")
    assert out.read_bytes() == PRECIOUS
    vitlab.save(model, out, force=True)
    vitlab.save(model, out)  # its own file: replaced
    assert vitlab.load(out).config == model.config


def test_marks_are_recognised_only_when_vitlab_wrote_them(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text('{"written_by": "someone else"}')
    marked = tmp_path / "marked.json"
    marked.write_text('{\n  "written_by": "vitlab bench", "x": 1}')
    assert written_by(plain) is None and written_by(marked) == "vitlab bench"
    with pytest.raises(OutputRefused):
        check_output(plain)
    check_output(marked)


# --- messages about outputs ---------------------------------------------------------------------------------------
def test_a_failed_write_names_the_destination_not_the_temporary(tmp_path):
    dest = tmp_path / "out.json"

    def fail(tmp: str) -> None:
        raise OSError(errno.EIO, "Input/output error", tmp)

    with pytest.raises(OSError) as info:
        atomic_write(dest, fail)
    assert info.value.filename == str(dest) and "vitlab-tmp" not in os_error_line(info.value)
    assert os_error_line(info.value) == f"{dest}: Input/output error"


def test_a_file_where_a_folder_should_be_is_said_so(tmp_path, weights, capsys):
    (tmp_path / "notes").write_bytes(PRECIOUS)
    assert main(["-q", "convert", str(weights), str(tmp_path / "notes" / "x.safetensors")]) == 2
    refused(capsys, "convert", tmp_path / "notes", "is a file, not a folder")
    assert (tmp_path / "notes").read_bytes() == PRECIOUS


def test_a_whole_path_over_path_max_is_not_called_a_long_name(tmp_path, weights, capsys):
    deep = tmp_path.joinpath(*["d" * 200] * 21) / "x.safetensors"  # each name fits; the path is over 4096 bytes
    assert main(["-q", "convert", str(weights), str(deep)]) == 2
    err = capsys.readouterr().err
    assert "Path too long" in err and "for the temporary" in err and "255 bytes per name" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["sweep.json", "sweep.png"])
def test_lr_sweep_keeps_a_users_file_in_out_and_replaces_its_own(tmp_path, monkeypatch, name):
    from vitlab.train import resolve_config
    from vitlab.train import sweep as sweep_module

    monkeypatch.setattr(sweep_module, "_fine_tune", lambda resolved: (0.5, 0.4))  # the sweep's runs, faked
    out = tmp_path / "s"
    out.mkdir()
    (out / name).write_bytes(PRECIOUS)
    cfg = resolve_config("finetune", data="digits", out=str(out), lr_sweep=(0.01, 0.03), dev_fraction=0.1)
    with pytest.raises(ValueError, match=f"{name} was not written by vitlab train --lr-sweep; choose another --out"):
        sweep_module.run_sweep(cfg)
    assert (out / name).read_bytes() == PRECIOUS and sorted(p.name for p in out.iterdir()) == [name]
    (out / name).unlink()
    sweep_module.run_sweep(cfg)
    assert written_by(out / "sweep.json") == written_by(out / "sweep.png") == "vitlab train --lr-sweep"
    sweep_module.run_sweep(cfg)  # its own record and figure: replaced
