"""MkDocs hook: the CLI reference page is generated from vitlab's argparse parsers at build time
(`vitlab.cli.reference`), so the documentation cannot drift from the command."""

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown, page, config, files, **kwargs):
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
