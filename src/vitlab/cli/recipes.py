"""`vitlab recipes`: every training recipe with its values and where they come from (paper table and row, or the
official config); and the `--help` of `vitlab train` / `finetune` that ends with the chosen recipe's."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vitlab.cli import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("recipes", help="list the training recipes: values, per-model rows and sources",
                       description="The training recipes of `vitlab train --recipe NAME` with their values, the "
                                   "values that depend on the model, and the paper table/row or official config "
                                   "they come from.")
    p.add_argument("names", nargs="*", metavar="NAME", help="recipes to show (default: all)")
    p.add_argument("--json", action="store_true", help="print the recipes as JSON")
    p.set_defaults(func=_recipes)


def _recipes(args: argparse.Namespace) -> int:
    from vitlab.train import RECIPES
    from vitlab.train.recipes import describe_recipe, recipe_record

    unknown = [n for n in args.names if n not in RECIPES]
    if unknown:
        raise UserError(f"unknown recipe {unknown[0]!r}; choose from {', '.join(RECIPES)}")
    names = args.names or list(RECIPES)
    if args.json:
        print(json.dumps({n: recipe_record(n) for n in names}, indent=1, default=_jsonable))
    else:
        print("\n\n".join(describe_recipe(n) for n in names))
    return 0


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else str(value)


class RecipeHelp(argparse.Action):
    """-h/--help ending with the recipe's values and source: `vitlab train --recipe pretrain --help` shows
    `pretrain` (a --recipe given after --help is not seen yet: the verb's default recipe is shown)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show this help and the chosen recipe's values and source, then exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from vitlab.train.recipes import DEFAULT_RECIPE, describe_recipe

        verb = parser.prog.split()[-1]
        recipe = describe_recipe(getattr(namespace, "recipe", None) or DEFAULT_RECIPE.get(verb, "demo"))
        parser.epilog = f"{parser.epilog}\n\n{recipe}" if parser.epilog else recipe
        parser.print_help()
        parser.exit()
