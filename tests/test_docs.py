"""The documentation site: its CLI reference is generated from the parsers (every verb and every option appears),
and every page the navigation names exists (`make docs` builds it with --strict in CI); the README's examples run
as written."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

import vitlab
from vitlab.cli import VERB_MODULES, build_parser
from vitlab.cli.reference import cli_reference_markdown
from vitlab.eval.prediction import predict

ROOT = Path(__file__).resolve().parents[1]


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_cli_reference_lists_every_verb_and_every_option_of_the_parsers():
    text = cli_reference_markdown()
    verbs = _verbs(build_parser())
    assert len(verbs) >= len(VERB_MODULES)  # a module may register several verbs (weights: info, convert)
    for name, parser in verbs.items():
        section = text.split(f"## `vitlab {name}`", 1)
        assert len(section) == 2, f"no section for vitlab {name}"
        body = section[1].split("\n## `vitlab ", 1)[0]
        for action in parser._actions:
            for option in action.option_strings:
                if option in ("-h", "--help"):
                    continue
                assert f"`{option}`" in body, f"vitlab {name} {option} missing from the CLI reference"


def test_the_cli_reference_follows_a_changed_parser(monkeypatch):
    # Generated, not transcribed: an option added to a parser appears without editing any page.
    import vitlab.cli.reference as reference

    real = reference.build_parser

    def with_extra():
        parser = real()
        _verbs(parser)["models"].add_argument("--an-option-no-page-mentions", help="added by the test")
        return parser

    monkeypatch.setattr(reference, "build_parser", with_extra)
    assert "`--an-option-no-page-mentions`" in reference.cli_reference_markdown()


def test_every_page_in_the_navigation_exists_and_the_cli_page_is_generated():
    config = (ROOT / "mkdocs.yml").read_text()
    pages = re.findall(r"^\s+- [^:]+: (\S+\.md)$", config, flags=re.M)
    assert "cli.md" in pages and "api.md" in pages
    for page in pages:
        assert (ROOT / "docs" / page).is_file(), page
    assert "<!-- cli-reference -->" in (ROOT / "docs" / "cli.md").read_text()
    listed = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert listed == set(pages), f"pages outside the navigation: {listed - set(pages)}"


def test_the_public_api_is_typed_and_documents_every_argument():
    import inspect

    import vitlab

    for name in ("load", "save", "transforms", "export_onnx", "fit"):
        fn = getattr(vitlab, name)
        sig = inspect.signature(fn)
        assert sig.return_annotation is not inspect.Signature.empty, name
        doc = inspect.getdoc(fn)
        for param in sig.parameters.values():
            assert param.annotation is not inspect.Parameter.empty, f"{name}({param.name}) has no type"
            shown = f"**{param.name}" if param.kind is param.VAR_KEYWORD else param.name
            assert f"{shown}:" in doc, f"vitlab.{name}'s docstring does not describe {param.name}"
    # help(vitlab) lists the entry points, not the config dataclasses' generated methods
    assert set(vitlab.__all__) == {"create_model", "export_onnx", "fit", "list_models", "load", "save", "transforms",
                                   "__version__"}
    assert vitlab.ViTConfig is vitlab.models.ViTConfig


def test_help_names_the_return_types_and_the_objects_fit_takes():
    """help(vitlab.fit) and help(vitlab.export_onnx) name what they return, and fit's says that `data` may be a
    dataset object and `init` a model, not only paths."""
    import pydoc

    import vitlab

    for fn, returned in ((vitlab.fit, "FitResult"), (vitlab.export_onnx, "ExportReport")):
        text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
        assert f"-> '{returned}'" in text or f"-> {returned}" in text, text.splitlines()[2]
        assert f"A `{returned}`" in text or f"An `{returned}`" in text  # the Returns section says its fields
    text = pydoc.render_doc(vitlab.fit, renderer=pydoc.plaintext)
    for said in ("dataset object", "ImageFolder", "datasets.DatasetDict", "`init` may be a model"):
        assert said in text, said


def test_readme_is_a_landing_page_whose_example_runs(tmp_path, monkeypatch):
    import numpy as np
    from PIL import Image

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 150
    # every verb of the command line has a row with an example in README's table
    verbs = set(_verbs(build_parser()))
    listed = set(re.findall(r"^\| `(\w+)` \| .* \| `vitlab \w+", text, flags=re.M))
    assert listed == verbs, verbs ^ listed
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)).save("photo.jpg")
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["probs"].shape == (10,) and tuple(namespace["tokens"].shape) == (1, 197, 384)
    assert len(namespace["attention"]) == 12 and tuple(namespace["attention"][0].shape) == (1, 6, 197, 197)


README_QUICK_START = """\
import vitlab

model = vitlab.load(WEIGHTS)
x = vitlab.transforms(model)(IMAGE)
probs = model(x[None]).softmax(-1)[0]
print(model.class_names[probs.argmax()])
"""


def test_readme_quick_start(tmp_path, capsys, random_tiny_vit, noise_image):
    """The README's image -> class name example, run as written; `vitlab predict` (its own code path) agrees."""
    model = random_tiny_vit(5, image_size=32, patch_size=8, num_classes=4)
    model.class_names = ["cat", "dog", "fox", "owl"]
    vitlab.save(model, tmp_path / "w.safetensors")
    image = noise_image(tmp_path / "photo.jpg", (64, 48))
    with torch.no_grad():
        exec(README_QUICK_START, {"WEIGHTS": str(tmp_path / "w.safetensors"), "IMAGE": str(image)})
    printed = capsys.readouterr().out.strip()
    assert printed == predict(tmp_path / "w.safetensors", [str(image)], device="cpu")[0]["top"][0]["class"]


def test_every_help_prints_percent_once_and_export_offers_only_what_it_writes(capsys):
    """argparse leaves `%%` in a description as it is: no verb's help shows it doubled. export's choices are the
    precisions it writes (bf16, refused with its reason, is not among them)."""
    for name, verb in _verbs(build_parser()).items():
        assert "%%" not in verb.format_help(), name
    export = _verbs(build_parser())["export"].format_help()
    assert "--precision {auto,fp32,int8}" in export and "No bf16" in export


def test_the_readme_states_the_auto_precision_rule_not_one_machine_outcome():
    """README's bf16 rows give `auto`'s rule (the CPU flags and every bound of the regions runtime/precision.py
    reads), so a reader on a CPU with native bf16 is not told float32 is kept for every model."""
    from vitlab.constants import BF16_GAINS
    from vitlab.runtime.precision import NATIVE_BF16_FLAGS

    row = " ".join(line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
                   if line.startswith("| bf16"))  # the rule over rows, each cell short
    assert all(flag in row for flag in NATIVE_BF16_FLAGS)
    for use, words in (("infer", "inference"), ("train", "training")):
        said = row[row.index(f"in {words}"):]
        assert all(f"≥ {least}" in said for region in BF16_GAINS[use] for least in region.values()), use
