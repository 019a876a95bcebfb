"""How a run starts is decided in one place (vitlab.train.start.decide_start): a recorded run continues, an
interrupted sweep resumes run by run, `resume auto` with nothing there starts afresh, a plain `resume` with nothing
there is refused, and otherwise the run starts from `init` weights (a flag or a config file's) or from scratch; a new
run's config file is read and its recipe named in the same decision."""

from __future__ import annotations

import pytest

from vitlab.train.start import decide_start


def test_a_recorded_run_continues(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    start = decide_start({"resume": True, "out": str(tmp_path), "init": "w.safetensors"})
    assert start.case == "continue" and start.record == tmp_path / "config.json" and start.resuming
    assert decide_start({"resume": "auto", "out": str(tmp_path)}).case == "continue"


def test_an_interrupted_sweep_resumes(tmp_path):
    (tmp_path / "lr_0.01").mkdir()
    (tmp_path / "lr_0.01" / "config.json").write_text("{}")
    start = decide_start({"resume": True, "out": str(tmp_path)})
    assert start.case == "sweep" and start.resuming


def test_resume_auto_with_nothing_there_starts_a_new_run(tmp_path):
    assert decide_start({"resume": "auto", "out": str(tmp_path / "new")}).case == "scratch"
    assert decide_start({"resume": "auto", "out": str(tmp_path), "init": "w"}).case == "init"


def test_resume_with_nothing_to_continue_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^--resume: .* holds no run to continue"):
        decide_start({"resume": True, "out": str(tmp_path)})
    with pytest.raises(ValueError, match=r"^--resume needs --out"):
        decide_start({"resume": True})


def test_init_from_the_flags_or_the_config_file_else_scratch(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_text('{"init": "file.safetensors", "lr": 0.01}')
    start = decide_start({"init": "w.safetensors"}, config_file=str(settings))
    assert (start.case, start.init) == ("init", "w.safetensors")  # the flag wins over the file
    start = decide_start({}, config_file=str(settings))
    assert (start.case, start.init, start.file_values["lr"]) == ("init", "file.safetensors", 0.01)
    assert decide_start({}).case == "scratch"
    assert not decide_start({}).resuming


def test_a_new_run_names_its_recipe_once():
    assert decide_start({}, verb="finetune").recipe == "finetune"  # the verb's default
    assert decide_start({}, recipe="demo", verb="finetune").recipe == "demo"
    with pytest.raises(ValueError, match=r"^unknown recipe 'nope'"):
        decide_start({}, recipe="nope")
