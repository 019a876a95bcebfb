"""`vitlab <verb>`: argparse sub-commands only; each verb module registers its parser and calls a library
function. Errors the user can fix become one line on stderr and exit code 2, never a stack trace."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping

from vitlab.errors import VitlabError, closest
from vitlab.lazy import lazy_names

# Each module defines `register(subparsers)`; its parsers set `func` to a callable taking the parsed args.
VERB_MODULES = ["models", "bench", "weights", "train", "evaluate", "recipes", "fewshot", "analyze", "download",
                "shards", "experiment", "export"]
# Verbs another package may provide (`commands=`, or an entry point of this group named for the verb); the module of
# that name is the fallback: `experiment`, the reproduction campaign beside the library.
PLUGIN_VERBS = ("experiment",)
PLUGIN_GROUP = "vitlab.commands"
Register = Callable[[argparse._SubParsersAction], None]
# The verbs that compute with a model start with the allocator tuning (vitlab.runtime.allocator); bench applies it
# itself, under its --no-malloc-tuning.
COMPUTING_VERBS = ("train", "finetune", "eval", "predict", "fewshot", "analyze", "experiment")


class UserError(VitlabError):
    """A problem with the user's input: printed as one line."""


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt: the verb unwinds, so what it was
    writing (a temporary beside the output, a work folder) is removed rather than left by a silent death."""


@contextlib.contextmanager
def terminated_as_exception() -> Iterator[None]:
    """SIGTERM raises `Terminated` in this process during the block (the training loop and `vitlab experiment`
    install their own stop handlers inside it); a process forked meanwhile dies of it as before."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread only
        yield
        return
    owner = os.getpid()

    def terminate(signum: int, frame: object) -> None:
        if os.getpid() != owner:  # a forked child that kept the handler: the default action
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_parser(commands: Mapping[str, Register] | None = None) -> argparse.ArgumentParser:
    """vitlab's parser; `commands`: verb -> the `register` of a plug-in verb (PLUGIN_VERBS) a caller provides."""
    from vitlab.cli.types import OneLineParser  # argparse errors as one line, like the verbs' own

    parser = OneLineParser(prog="vitlab", description="Vision Transformers exact to the paper.")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1, default=0,
                      help="warnings and errors only, no progress bars (results are still printed)")
    loud.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1,
                      help="also debug messages. Progress bars appear only on a terminal")
    sub = parser.add_subparsers(dest="verb", metavar="<verb>")
    sub.required = True
    for name in VERB_MODULES:
        plugin = (commands or {}).get(name) or _plugin(name) if name in PLUGIN_VERBS else None
        (plugin or importlib.import_module(f"vitlab.cli.{name}").register)(sub)
    return parser


def _plugin(verb: str) -> Register | None:
    """The `register` an installed package provides for `verb` (entry-point group PLUGIN_GROUP), if it loads."""
    from importlib.metadata import entry_points

    for point in entry_points(group=PLUGIN_GROUP, name=verb):
        try:
            return point.load()
        except ImportError:  # declared by a package whose code is not importable here
            continue
    return None


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parser.parse_args`, with an unrecognized flag answered by the verb's parser: where a flag of other
    libraries (`--pretrained`) lives in vitlab, or the flag it most likely misspells."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        verb = verbs.choices[args.verb]
        verb.error(_unrecognized(verb, extras, args))
    return args


def _unrecognized(verb: argparse.ArgumentParser, extras: list[str], args: argparse.Namespace) -> str:
    flags = [x.split("=", 1)[0] for x in extras if x.startswith("--")]
    if "--pretrained" in flags and args.verb in ("train", "finetune"):
        return (f"--pretrained: published weights are fine-tuned from their name or file with --init: vitlab "
                f"finetune --init {args.model or 'NAME'}")
    options = {o.removeprefix("--"): o for o in verb._option_string_actions if o.startswith("--")}
    guess = next(filter(None, (closest(f.removeprefix("--"), options) for f in flags)), None)
    return f"unrecognized arguments: {' '.join(extras)}" + (f"; did you mean {options[guess]}?" if guess else "")


def say_warnings(verb: str) -> None:
    """Python warnings (vitlab's own and its libraries') as vitlab says things, `vitlab <verb>: warning: <first
    line>`, instead of a source path, a category name and the line of code that warned."""
    import warnings

    def one_line(message, category, filename, lineno, line=None) -> str:  # noqa: ANN001 - warnings' signature
        text = str(message).strip().splitlines()
        return f"vitlab {verb}: warning: {text[0] if text else category.__name__}\n"

    # the formatter, not showwarning: warnings recorded (catch_warnings(record=True), pytest.warns) stay recorded
    warnings.formatwarning = one_line
    # Pillow's warning about images over 89 M pixels: vitlab refuses images over its own budget before decoding them
    # (vitlab.data.sources.pixel_budget), in one line that this one would only precede
    warnings.filterwarnings("ignore", message=r"Image size \(\d+ pixels\) exceeds limit of")


def main(argv: list[str] | None = None, commands: Mapping[str, Register] | None = None) -> int:
    """`vitlab ARGV`; `commands`: plug-in verbs the caller provides (build_parser)."""
    args = parse_args(build_parser(commands), argv)
    from vitlab.progress import set_verbosity

    set_verbosity(args.verbosity)
    say_warnings(args.verb)
    if args.verb in COMPUTING_VERBS:
        from vitlab.runtime.allocator import tune_for_compute

        tune_for_compute()

    try:
        with terminated_as_exception():
            result = args.func(args)
    except (VitlabError, ValueError, FileNotFoundError) as err:
        print(f"vitlab {args.verb}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `vitlab models | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # the storage: a full disk, a read-only target, a name too long
        from vitlab.files.outputs import os_error_line

        print(f"vitlab {args.verb}: error: {os_error_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vitlab {args.verb}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"vitlab {args.verb}: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    return int(result or 0)


# Argument types for verbs registered from outside the package (the reproduction campaign's `experiment`), read on
# first use so that importing the command line stays light.
__getattr__ = lazy_names(__name__, dict.fromkeys(("int_range", "jobs", "precision_name", "seed"), "types"), globals())


if __name__ == "__main__":
    sys.exit(main())
