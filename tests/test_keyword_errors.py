"""vitlab's Python functions name a setting in their errors by the keyword the caller passed (`val_fraction=0.1`),
the command line by its flag (`--val-fraction 0.1`): one rule, vitlab.errors.setting."""

import pytest

import vitlab
from vitlab.cli import main


def test_setting_spells_a_flag_or_a_keyword():
    from vitlab.errors import keyword_errors, setting

    assert setting("val_fraction", value=0.1) == "--val-fraction 0.1"
    assert setting("weight_decay", "wd") == "--wd"
    as_keywords = keyword_errors(lambda: (setting("val_fraction", value=0.1), setting("weight_decay", "wd"),
                                          setting("lora_rank", "lora", "RANK"), setting("resume", value="auto")))
    assert as_keywords() == ("val_fraction=0.1", "weight_decay", "lora_rank=RANK", "resume='auto'")
    assert setting("resume") == "--resume"  # outside the call, flags again


@pytest.mark.parametrize(("settings", "message"), [
    ({"resume": True}, "resume needs out: the run folder to continue"),
    ({"precision": "int8"}, "precision='int8' is for the inference verbs only"),
    ({"lora_alpha": 4.0}, "lora_alpha and lora_targets shape LoRA adapters: add lora_rank=RANK"),
    ({"batch_size": 10, "accum": 3}, "batch_size 10 is not divisible by accum 3"),
    ({"epochs": 2, "steps": 3}, "epochs=2 and steps=3 both set the run's length"),
    ({"data": " "}, "data is empty"),
])
def test_vitlab_fit_names_its_keywords_not_flags(settings, message):
    with pytest.raises(ValueError) as err:
        vitlab.fit(**settings)
    assert message in str(err.value) and "--" not in str(err.value)


def test_the_command_line_still_names_its_flags(capsys):
    assert main(["train", "--lora-alpha", "4"]) == 2
    assert "--lora-alpha and --lora-targets shape LoRA adapters: add --lora RANK" in capsys.readouterr().err
    with pytest.raises(ValueError, match="^--precision must be one of"):
        from vitlab.runtime.precision import check_precision

        check_precision("fp16", "train")
