"""--resume reads a run directory as untrusted input: a run without checkpoints continues
from its final weights or is refused, never retrained from step 0 over its history; a tampered checkpoint or
config.json is one line naming the file (exit 2), never a traceback, never trained with; stray folders in
checkpoints/ are ignored with a warning. Every refusal leaves the run's files byte for byte as they were."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

import vitlab
from tests.train.test_resume import TINY, rows, tiny, tree_hashes
from vitlab.cli import main
from vitlab.train import run
from vitlab.train.optim import Schedule
from vitlab.weights.vitlab_format import save

LAST, FIRST = "checkpoints/step_00000004", "checkpoints/step_00000002"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4 (trained once; each test works on a copy)."""
    out = tmp_path_factory.mktemp("base") / "run"
    run(tiny(out, steps=4))
    return out


@pytest.fixture
def copy(trained, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def kept(out: Path) -> dict[str, str]:
    """What a refused resume must leave untouched: every file but the console log (it logs the warnings)."""
    return {k: v for k, v in tree_hashes(out).items() if k != "console.log"}


def refused(out: Path, capsys, *extra: str) -> str:
    """Resume `out` with --steps 6 on the command line; assert exit 2, one error line, and no file changed."""
    before = kept(out)
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--steps", "6", *extra]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("vitlab train: error: ")
    assert kept(out) == before  # metrics.jsonl, model.safetensors, checkpoints, config.json: byte for byte
    return line


def remanifest(ckpt: Path) -> None:
    """What a careful tamperer does: the manifest rewritten to vouch for the edited files."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (ckpt / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def edit_json(path: Path, **changes) -> None:
    record = json.loads(path.read_text())
    record.update(changes)
    path.write_text(json.dumps(record))


# ---- a run without checkpoints -------------------------------------------------------------------------------


def test_a_finished_run_without_checkpoints_continues_from_its_final_weights(copy, caplog):
    shutil.rmtree(copy / "checkpoints")
    history = (copy / "metrics.jsonl").read_text()
    caplog.set_level(logging.INFO, logger="vitlab")
    assert main(["train", "--out", str(copy), "--resume", "--steps", "6"]) == 0
    assert (copy / "metrics.jsonl").read_text().startswith(history)  # steps 1-4 kept byte for byte
    assert [r["step"] for r in rows(copy, "train")] == [1, 2, 3, 4, 5, 6]
    assert (f"no intact checkpoint in {copy}: continuing from its final weights {copy / 'model.safetensors'} "
            "(step 4) with a fresh optimizer state") in caplog.text
    assert "starting from step 0" not in caplog.text and "step 1/6" not in caplog.text
    # the schedule goes on from step 4 of the 6-step plan, as a resume from a checkpoint does
    cfg = tiny(copy, steps=6)
    planned = Schedule(cfg.warmup, 6, cfg.decay, cfg.linear_end / cfg.lr, cfg.lr_drops)
    assert rows(copy, "train")[4]["lr"] == pytest.approx(cfg.lr * planned(4), rel=1e-6)
    assert vitlab.load(copy / "model.safetensors") is not None
    meta = json.loads(_metadata(copy / "model.safetensors")["meta"])
    assert meta["step"] == 6  # the new final weights record their step in turn


def _metadata(path: Path) -> dict:
    from vitlab.weights.tensors import safetensors_header

    return safetensors_header(path)["__metadata__"]


def test_a_finished_run_without_checkpoints_resumed_to_its_end_keeps_its_weights(copy):
    shutil.rmtree(copy / "checkpoints")
    before, weights = tree_hashes(copy), vitlab.load(copy / "model.safetensors").state_dict()
    assert main(["train", "--out", str(copy), "--resume"]) == 0  # nothing to train: evaluated again
    after = tree_hashes(copy)
    for name in ("metrics.jsonl", "best.safetensors"):
        assert after[name] == before[name], name
    # model.safetensors is saved again with the same tensors (safetensors orders its metadata differently each time)
    again = vitlab.load(copy / "model.safetensors").state_dict()
    assert all(torch.equal(again[k], weights[k]) for k in weights)
    assert json.loads(_metadata(copy / "model.safetensors")["meta"])["step"] == 4


def test_an_unfinished_run_whose_checkpoints_were_deleted_is_refused(copy, capsys):
    shutil.rmtree(copy / "checkpoints")
    (copy / "model.safetensors").unlink()
    line = refused(copy, capsys)
    assert f"{copy}: its checkpoints/ holds no checkpoint and it has no final weights, but its metrics.jsonl goes " \
           "to step 4: training again from step 0 would replace" in line
    assert not (copy / "model.safetensors").exists()


def test_a_run_whose_checkpoints_are_all_damaged_and_without_final_weights_is_refused(copy, capsys):
    (copy / "model.safetensors").unlink()
    for ckpt in (LAST, FIRST):
        with open(copy / ckpt / "state.pt", "r+b") as f:
            f.truncate(100)
    line = refused(copy, capsys)
    assert "none of its 2 checkpoint(s) is intact" in line


def test_final_weights_that_do_not_record_their_step_are_not_continued(copy, capsys):
    shutil.rmtree(copy / "checkpoints")
    model = vitlab.load(copy / "model.safetensors")
    save(model, copy / "model.safetensors", user_named=False)  # weights as an older vitlab wrote them: no step
    line = refused(copy, capsys)
    assert "do not record the step they were trained to" in line


def test_final_weights_behind_the_history_are_not_continued(copy, capsys):
    """metrics.jsonl goes past the final weights (an extension that ran, its checkpoints then deleted)."""
    shutil.rmtree(copy / "checkpoints")
    with open(copy / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 5, "split": "train", "loss": 2.0, "lr": 1e-3}) + "\n")
    line = refused(copy, capsys)
    assert "final weights" in line and "are of step 4 but its metrics.jsonl goes to step 5" in line


def test_a_run_killed_before_its_first_checkpoint_still_starts_from_step_0(copy, caplog):
    """The supervisor's case (`--resume auto` after a kill before any checkpoint) is not refused."""
    out = copy
    shutil.rmtree(out / "checkpoints")
    (out / "model.safetensors").unlink()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text(lines[0] + "\n")  # logged step 1; the first checkpoint is at step 2
    caplog.set_level(logging.INFO, logger="vitlab")
    assert main(["train", "--out", str(out), "--resume", "auto"]) == 0
    assert "starting from step 0" in caplog.text
    assert [r["step"] for r in rows(out, "train")] == [1, 2, 3, 4]


# ---- tampered checkpoints ------------------------------------------------------------------------------------


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):  # what a malicious state.pt runs when unpickled without weights_only
        return (os.makedirs, (str(self.marker),))


def _foreign_pickle(ckpt: Path, tmp_path: Path) -> None:
    (ckpt / "state.pt").write_bytes(pickle.dumps({"step": 4, "x": _Evil(tmp_path / "PWNED")}))


def _empty(ckpt: Path, tmp_path: Path) -> None:
    torch.save({}, ckpt / "state.pt")


def _a_list(ckpt: Path, tmp_path: Path) -> None:
    torch.save([1, 2, 3], ckpt / "state.pt")


def _step_as_text(ckpt: Path, tmp_path: Path) -> None:
    state = torch.load(ckpt / "state.pt", weights_only=True)
    torch.save({**state, "step": "4"}, ckpt / "state.pt")


def _no_optimizer_state(ckpt: Path, tmp_path: Path) -> None:
    state = torch.load(ckpt / "state.pt", weights_only=True)
    torch.save({**state, "optimizer": {"state": {}, "param_groups": "x"}}, ckpt / "state.pt")


def _other_width(ckpt: Path, tmp_path: Path) -> None:
    args = {**TINY["model_args"], "width": 64}
    other = vitlab.create_model("ViT-Ti/4", num_classes=10, image_size=8, **args)
    save(other, ckpt / "model.safetensors", user_named=False)  # tampered behind vitlab's back


def _junk_weights(ckpt: Path, tmp_path: Path) -> None:
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")


TAMPERED = {
    "foreign pickle": (_foreign_pickle, "state.pt is a pickle of more than tensors and plain values (refused "
                                        "unexecuted), not a vitlab training state"),
    "{}": (_empty, "state.pt has no 'step', not a vitlab training state"),
    "a list": (_a_list, "state.pt holds a list, not a vitlab training state"),
    "step as text": (_step_as_text, "state.pt has a str for 'step', not a vitlab training state"),
    "broken optimizer state": (_no_optimizer_state, "its training state does not fit the model"),
    "weights of another width": (_other_width, "holds a model with width 64, the run trains width 32 (config.json)"),
    "not weights": (_junk_weights, "model.safetensors is not vitlab weights"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_checkpoint_that_passes_its_manifest_is_one_line(copy, capsys, tmp_path, case):
    tamper, expected = TAMPERED[case]
    ckpt = copy / LAST
    tamper(ckpt, tmp_path)
    remanifest(ckpt)
    line = refused(copy, capsys)
    assert str(ckpt) in line and expected in line, line
    assert "aside to resume from the previous checkpoint" in line
    assert not (tmp_path / "PWNED").exists()  # never unpickled with code


def test_a_stray_folder_in_checkpoints_is_ignored_with_a_warning_and_kept(copy, caplog):
    (copy / "checkpoints" / "step_abc").mkdir()
    (copy / "checkpoints" / "step_abc" / "mine.txt").write_text("the user's")
    caplog.set_level(logging.INFO, logger="vitlab")
    assert main(["train", "--out", str(copy), "--resume", "--steps", "6", "--keep-last", "1"]) == 0
    assert f"{copy / 'checkpoints' / 'step_abc'} is not a vitlab checkpoint" in caplog.text
    assert f"resuming from {copy / LAST} (step 4)" in caplog.text
    assert (copy / "checkpoints" / "step_abc" / "mine.txt").read_text() == "the user's"  # never pruned
    assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == ["step_00000006", "step_abc"]


def _outside(ckpt: Path) -> None:
    secret = ckpt.parent.parent / "SECRET"
    secret.write_text("x")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["../../SECRET"] = {"size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _listing_nothing(ckpt: Path) -> None:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    (ckpt / "manifest.json").write_text(json.dumps({**manifest, "files": {}}))
    (ckpt / "state.pt").write_bytes(b"not a state")


MANIFESTS = {"naming a file outside": (_outside, "manifest.json names '../../SECRET', not a file of a checkpoint"),
             "listing no files": (_listing_nothing, "manifest.json does not list model.safetensors or state.pt")}


@pytest.mark.parametrize("case", list(MANIFESTS))
def test_a_manifest_that_vouches_for_the_wrong_files_makes_its_checkpoint_damaged(copy, caplog, case):
    tamper, expected = MANIFESTS[case]
    tamper(copy / LAST)
    caplog.set_level(logging.INFO, logger="vitlab")
    assert main(["train", "--out", str(copy), "--resume", "--steps", "6"]) == 0
    assert f"checkpoint {copy / LAST} is damaged ({expected}" in caplog.text
    assert f"resuming from {copy / FIRST} (step 2)" in caplog.text  # the previous one, as for any damage


@pytest.mark.parametrize("case", list(MANIFESTS))
def test_a_manifest_that_vouches_for_the_wrong_files_is_refused_when_nothing_else_is_left(copy, capsys, case):
    MANIFESTS[case][0](copy / LAST)
    shutil.rmtree(copy / FIRST)
    (copy / "model.safetensors").unlink()
    line = refused(copy, capsys)
    assert "none of its 1 checkpoint(s) is intact" in line


# ---- a tampered config.json ----------------------------------------------------------------------------------


CONFIGS = {
    "sources not a mapping": ({"sources": "x"}, "config.json: 'sources' must map each setting to where its value "
                                                "came from, got \"x\""),
    "notes not a list": ({"notes": 5}, "config.json: 'notes' must be a list of lines, got 5"),
    "steps as text": ({"steps": "4"}, "config.json: steps must be an integer, got '4' (a string)"),
    "lr edited": ({"lr": 0.5}, "config.json says lr 0.5 but checkpoint"),
    "model edited": ({"model_args": {**TINY["model_args"], "width": 64}}, "config.json says model_args"),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_an_edited_config_json_is_one_line_and_never_trained_with(copy, capsys, case):
    changes, expected = CONFIGS[case]
    edit_json(copy / "config.json", **changes)
    line = refused(copy, capsys)
    assert expected in line, line


def test_an_edited_lr_is_never_credited_to_the_recipe_in_the_banner(copy, caplog, capsys):
    edit_json(copy / "config.json", lr=0.5)
    caplog.set_level(logging.INFO, logger="vitlab")
    assert main(["train", "--out", str(copy), "--resume", "--steps", "6"]) == 2
    assert "lr 0.5" not in caplog.text  # no banner, no step: refused before either
    assert "config.json was edited after the run started; put 0.002 back" in capsys.readouterr().err


def test_an_edited_setting_a_resume_may_change_is_kept_and_said(copy, caplog):
    """log_every decides what is reported, not what is computed: an edit is used, with a warning naming it."""
    edit_json(copy / "config.json", log_every=2)
    caplog.set_level(logging.INFO, logger="vitlab")
    assert main(["train", "--out", str(copy), "--resume", "--steps", "6"]) == 0
    said = f"{copy / 'config.json'} says log_every 2, checkpoint {copy / LAST} was trained with 1 (edited"
    assert said in caplog.text
    assert [r["step"] for r in rows(copy, "train")] == [1, 2, 3, 4, 6]


def test_a_setting_changed_by_a_resume_flag_is_not_an_edit(copy, caplog):
    """--log-every on resume (a safe change, recorded as such in config.json) resumes again without complaint,
    also from a checkpoint written before the change."""
    assert main(["train", "--out", str(copy), "--resume", "--steps", "5", "--log-every", "2", "--save-every",
                 "100"]) == 0
    shutil.rmtree(copy / "checkpoints" / "step_00000005")  # back to the step-4 checkpoint (log_every 1)
    (copy / "model.safetensors").unlink()
    caplog.set_level(logging.INFO, logger="vitlab")
    assert main(["train", "--out", str(copy), "--resume", "--steps", "5"]) == 0
    assert "edited" not in caplog.text
