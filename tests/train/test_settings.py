"""Each training setting is declared once (vitlab.train.settings) and every reader follows the declaration: the
train/finetune flags (spelling, range, choices, help, verbs), the config's checks, vitlab.fit's keywords, and the
words a message names a setting by (its flag on the command line, its keyword in Python)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from vitlab.cli import build_parser
from vitlab.errors import keyword_errors
from vitlab.train.config import TrainConfig, validate
from vitlab.train.settings import FIELDS, SETTINGS, flag_settings, named_by_flag, spelled


def verb_parser(verb: str) -> argparse.ArgumentParser:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[verb]


@pytest.mark.parametrize("verb", ["train", "finetune"])
def test_each_declared_flag_is_the_verbs_option_with_the_declared_help_and_destination(verb):
    options = verb_parser(verb)._option_string_actions
    for s in flag_settings(verb):
        action = options[s.option]
        assert action.dest == s.name and action.help == s.help_for(verb), s.name
        assert all(options[f"--{alias}"] is action for alias in s.aliases)
        if s.choices is not None:
            assert list(action.choices) == list(s.choices)


def test_a_setting_declared_for_finetune_only_is_no_train_flag():
    train = verb_parser("train")._option_string_actions
    only = [s for s in SETTINGS.values() if s.option and s.verbs == ("finetune",)]
    assert {s.name for s in only} >= {"init", "preset", "lr_sweep", "dev_fraction", "refit"}
    assert not any(s.option in train for s in only)


def test_every_field_has_its_declaration_with_the_fields_type_and_default():
    defaults = TrainConfig()
    assert list(FIELDS) == [f.name for f in dataclasses.fields(TrainConfig)]
    for name in FIELDS:
        assert SETTINGS[name].default == getattr(defaults, name)
        assert SETTINGS[name].type is not None


def test_the_lora_flag_takes_what_lora_rank_takes():
    parse = verb_parser("finetune").parse_args
    assert parse(["--lora", "0"]).lora_rank == 0  # 0: off, as the setting allows
    assert parse(["--lora", "8"]).lora_rank == 8
    with pytest.raises(SystemExit):
        parse(["--lora", "-1"])
    with pytest.raises(ValueError, match=r"^--lora must be an integer in \[0, "):
        validate(TrainConfig(lora_rank=-1))


def test_a_message_names_the_flag_on_the_command_line_and_the_keyword_in_python():
    assert spelled("weight_decay") == "--wd"
    assert spelled("weight_decay", 0.1) == "--wd 0.1"
    assert spelled("ema") == "--ema"  # the flag spelled as the setting, where it has one
    assert spelled("heads") == "--heads"
    assert keyword_errors(spelled)("weight_decay") == "weight_decay"
    assert keyword_errors(spelled)("weight_decay", 0.1) == "weight_decay=0.1"
    with pytest.raises(ValueError, match=r"^--wd must be "):
        validate(TrainConfig(weight_decay=-1.0))
    with pytest.raises(ValueError, match=r"^weight_decay must be "):
        keyword_errors(validate)(TrainConfig(weight_decay=-1.0))


def test_a_flag_spelling_names_its_setting():
    assert named_by_flag("wd").name == "weight_decay"
    assert named_by_flag("ema_decay").name == "ema"
    assert named_by_flag("lora").name == "lora_rank"
    assert named_by_flag("lr") is None  # the setting's own name: no other spelling


def test_vitlab_fit_answers_a_flag_spelling_with_its_keyword():
    import vitlab

    with pytest.raises(TypeError, match="the flag --wd is the keyword weight_decay"):
        vitlab.fit(wd=0.1, progress=False)
    with pytest.raises(TypeError, match="the flag --lora is the keyword lora_rank"):
        vitlab.fit(lora=4, progress=False)
