"""MkDocs hooks: the CLI reference page is generated from vitlab's argparse parsers at build time
(`vitlab.cli.reference`), and the API reference's second tier from the subpackages' `__all__`, so the
documentation cannot drift from the command or the code."""

import re

from mkdocs.plugins import event_priority

MARKER = "<!-- cli-reference -->"
FILE_WORKER = "javascripts/file-worker.js"


@event_priority(-100)  # after the offline plugin, which adds a polyfill fetched from unpkg.com
def on_config(config, **kwargs):
    # Search in a site opened as files needs its worker run in a frame (docs/javascripts/file-worker.js); the
    # offline plugin's polyfill for it comes from the network, which a site read offline does not have.
    polyfills = [p for p in config.extra.get("polyfills", []) if "iframe-worker" not in str(p)]
    config.extra["polyfills"] = [*polyfills, FILE_WORKER]
    return config


def on_page_markdown(markdown, page, config, files, **kwargs):
    if SECOND_TIER_MARKER in markdown:
        markdown = markdown.replace(SECOND_TIER_MARKER, second_tier_markdown())
    if TRAIN_SETTINGS_MARKER in markdown or FIELDS_MARKER in markdown:
        from vitlab.cli.reference import fields_markdown, train_settings_markdown

        markdown = markdown.replace(TRAIN_SETTINGS_MARKER, train_settings_markdown())
        markdown = re.sub(FIELDS_MARKER + r" ([\w.]+) -->", lambda m: fields_markdown(_class(m.group(1))), markdown)
    if MARKER not in markdown:
        return markdown
    from vitlab.cli.reference import cli_reference_markdown

    return markdown.replace(MARKER, cli_reference_markdown())


def on_files(files, config, **kwargs):
    # The reproduction report (included from REPRODUCTION.md) shows the committed figures of reproduction/NAME/.
    from pathlib import Path

    from mkdocs.structure.files import File

    root = Path(config["config_file_path"]).parent
    for png in sorted((root / "reproduction").glob("*/*.png")):
        files.append(File(str(png.relative_to(root)), str(root), config["site_dir"], config["use_directory_urls"]))
    return files


SECOND_TIER_MARKER = "<!-- second-tier -->"
# TrainConfig and the model configs field by field, read from the classes at build time (vitlab.cli.reference).
TRAIN_SETTINGS_MARKER = "<!-- train-settings -->"
FIELDS_MARKER = "<!-- fields:"


def _class(path: str) -> type:
    import importlib

    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)
SECOND_TIER = ("vitlab.runtime", "vitlab.deploy", "vitlab.train", "vitlab.eval", "vitlab.analysis", "vitlab.weights",
               "vitlab.data", "vitlab.models", "vitlab.files")
BOTTOM_MODULES = ("vitlab.errors", "vitlab.constants", "vitlab.ranges", "vitlab.progress")


def second_tier_markdown() -> str:
    """The API reference's second tier, read from each subpackage's `__all__` so that a name added there is
    documented without editing the page: a function or class by the module that defines it (mkdocstrings reads
    the source; the packages import their names lazily), a constant as its name and type."""
    import importlib
    import inspect

    parts = []
    for package in SECOND_TIER:
        module = importlib.import_module(package)
        summary = (inspect.getdoc(module) or "").split("\n\n")[0]
        parts.append(f"### `{package}`\n\n{summary}\n")
        constants = []
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                parts.append(f"::: {value.__module__}.{value.__qualname__}\n    options:\n      heading_level: 4\n")
            else:
                constants.append(f"- `{package}.{name}`: `{type(value).__name__}`")
        if constants:
            parts.append("Constants:\n\n" + "\n".join(constants) + "\n")
    for module in BOTTOM_MODULES:
        parts.append(f"::: {module}\n    options:\n      heading_level: 3\n      show_if_no_docstring: true\n")
    return "\n".join(parts)
