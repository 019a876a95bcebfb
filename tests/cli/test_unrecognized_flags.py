"""A flag the verb does not have is one line naming the flag it most likely misspells, or, for another library's
`--pretrained`, the vitlab spelling (exit 2, nothing run)."""

import pytest

from vitlab.cli import main


def error_of(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


def test_a_misspelt_flag_names_the_flag_it_means(capsys):
    line = error_of(["train", "--stpes", "3"], capsys)
    assert line.startswith("vitlab train: error: unrecognized arguments: --stpes 3; did you mean --steps?")
    assert "did you mean --pretrained?" in error_of(["models", "--pretraind"], capsys)
    assert "did you mean" not in error_of(["train", "--bogus"], capsys)  # nothing close: no guess


@pytest.mark.parametrize("verb", ["train", "finetune"])
def test_pretrained_points_to_finetune_init(verb, capsys):
    line = error_of([verb, "--model", "vit_tiny_patch16_224", "--pretrained"], capsys)
    assert f"vitlab {verb}: error: --pretrained: " in line
    assert "vitlab finetune --init vit_tiny_patch16_224" in line
