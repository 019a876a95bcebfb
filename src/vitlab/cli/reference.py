"""The command-line reference as Markdown, generated from the argparse parsers themselves, so that the
documentation site's CLI page cannot drift from what `vitlab <verb> --help` accepts (the docs build calls
`cli_reference_markdown`; a test checks that every verb and every option string appears in it)."""

from __future__ import annotations

import argparse
import dataclasses

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


def field_comments(cls: type) -> dict[str, str]:
    """Each dataclass field's comment in the class's source: the `# …` on its line and any comment-only lines that
    continue it (what the field means, written once beside the field)."""
    import inspect
    import io
    import textwrap
    import tokenize

    comments: dict[str, list[str]] = {}
    names = {f.name for f in dataclasses.fields(cls)}
    current = None
    for token in tokenize.generate_tokens(io.StringIO(textwrap.dedent(inspect.getsource(cls))).readline):
        if token.type == tokenize.NAME and token.start[1] == 4 and token.string in names:
            current = token.string
        elif token.type == tokenize.COMMENT and current is not None:
            text = token.string.lstrip("#").strip()
            own_line = token.line.lstrip().startswith("#")
            if own_line and not comments.get(current, [""])[-1].endswith((":", ",")):
                current = None  # a comment line that continues no sentence heads a group (`# data`)
                continue
            comments.setdefault(current, []).append(text)
        elif token.type == tokenize.NAME and token.start[1] == 4:
            current = None
    return {name: " ".join(lines) for name, lines in comments.items()}


def _type_name(annotation: object) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    return str(text).replace("typing.", "")


def _field_default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{f.default!r}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{f.default_factory()!r}`"
    return "(required)"


def fields_markdown(cls: type, flags: dict[str, str] | None = None) -> str:
    """A dataclass as a table, one row per field: name, type, default and meaning (the field's comment, else the
    help of its command-line flag); `flags`: field -> the flag that sets it, shown beside the name. Read from the
    class when the documentation is built, so a field added, renamed or removed changes the table with it."""
    comments = field_comments(cls)
    helps = flags_help() if flags is not None else {}
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        name = f"`{f.name}`" + (f" (`{flags[f.name]}`)" if flags and f.name in flags else "")
        dest = next((d for d, o in _train_flags().items() if o == (flags or {}).get(f.name)), f.name)
        meaning = helps.get(dest) or comments.get(f.name, "")
        rows.append(f"| {name} | `{_cell(_type_name(f.type))}` | {_cell(_field_default(f))} | {_cell(meaning)} |")
    return "\n".join(rows)


def flags_help() -> dict[str, str]:
    """The help text of every `vitlab train` / `vitlab finetune` option, by the setting it sets (its dest)."""
    verbs = _subcommands(build_parser())
    helps: dict[str, str] = {}
    for verb in ("train", "finetune"):
        for action in verbs[verb]._actions:
            if action.help and action.help != argparse.SUPPRESS and action.option_strings:
                helps.setdefault(action.dest, (action.help % {"default": action.default}).strip())
    return helps


def train_settings_markdown() -> str:
    """TrainConfig field by field, each with the flag that sets it on the command line (`vitlab.fit` takes the
    same names as keywords), from the settings' one declaration (vitlab.train.settings)."""
    from vitlab.train.settings import SETTINGS, TrainConfig

    flags = _train_flags()
    by_field = {}
    for field in (f.name for f in dataclasses.fields(TrainConfig)):
        declared = SETTINGS.get(field)
        option = declared.option if declared is not None else None
        if option is not None and option in flags.values():
            by_field[field] = option
    return fields_markdown(TrainConfig, by_field)


def _train_flags() -> dict[str, str]:
    """dest -> the long option of every `vitlab train` and `vitlab finetune` option."""
    verbs = _subcommands(build_parser())
    flags: dict[str, str] = {}
    for verb in ("train", "finetune"):
        for action in verbs[verb]._actions:
            if action.option_strings and action.dest not in flags and action.help != argparse.SUPPRESS:
                flags[action.dest] = action.option_strings[-1]
    return flags
