"""The command-line reference as Markdown, generated from the argparse parsers themselves, so that the
documentation site's CLI page cannot drift from what `vitlab <verb> --help` accepts (the docs build calls
`cli_reference_markdown`; a test checks that every verb and every option string appears in it)."""

from __future__ import annotations

import argparse

from vitlab.cli import build_parser

_HIDDEN = {"-h", "--help"}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _cell(text: str) -> str:
    # A table cell is one line; a literal "|" would end it.
    return " ".join(text.split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction):
        return ""
    if isinstance(action.default, bool):
        return ""
    return f"`{action.default}`"


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or set(action.option_strings) & _HIDDEN:
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            names = ", ".join(f"`{s}`" for s in action.option_strings)
            if action.nargs != 0 and action.metavar != "":
                metavar = action.metavar or (action.dest.upper())
                if isinstance(metavar, tuple):
                    metavar = " ".join(metavar)
                names += f" `{metavar}`"
        else:
            names = f"`{action.metavar or action.dest}`"
        help_text = (action.help or "") % {"default": action.default, "prog": parser.prog} if action.help else ""
        choices = f" (one of: {', '.join(map(str, action.choices))})" if action.choices and not isinstance(
            action.choices, dict) and len(action.choices) <= 12 else ""
        rows.append(f"| {names} | {_cell(help_text + choices)} | {_default(action)} |")
    return rows


def _section(parser: argparse.ArgumentParser, title: str, level: int) -> list[str]:
    lines = [f"{'#' * level} `{title}`", ""]
    if parser.description:
        lines += [" ".join(parser.description.split()), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = _option_rows(parser)
    if rows:
        lines += ["| argument | what it does | default |", "|---|---|---|", *rows, ""]
    for name, sub in _subcommands(parser).items():
        lines += _section(sub, f"{title} {name}", level + 1)
    return lines


def cli_reference_markdown() -> str:
    """Every verb of `vitlab`, its usage and each of its arguments with help text and default."""
    root = build_parser()
    lines = ["Generated from the command's own parsers when the documentation is built; `vitlab VERB --help`",
             "prints the same.", ""]
    lines += ["| global option | what it does |", "|---|---|"]
    lines += [row.rsplit(" |", 2)[0] + " |" for row in _option_rows(root)]
    lines.append("")
    for name, sub in _subcommands(root).items():
        lines += _section(sub, f"vitlab {name}", 2)
    return "\n".join(lines)
