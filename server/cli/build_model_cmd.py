"""`vapo-mcp build-model NAME [--force]`: build a built-in model from its recipe into the cache.

    vapo-mcp build-model builtin:chain             build it unless the cache already holds a build of its recipe
    vapo-mcp build-model builtin:addition --force  build it again

The built-in models ship with the package, so runs need no build; this is for people who change a recipe
(vapo_engine/builtin_model/recipes.py): a run then uses the cache build of the changed recipe. A recipe that
continues another (`start`) builds on the shipped start model when its recipe is unchanged. Builds take minutes
(up to ~an hour for the chain models on 2 CPU cores). Torch is imported only when a build starts.
"""
from __future__ import annotations

import sys

from tools.paths import known_secrets
from vapo_engine.providers.redaction import public_message

from .common import UserError, add_json_option, print_json


def register(sub) -> None:
    p = sub.add_parser("build-model", help="build a built-in model (builtin:addition, builtin:chain, …) from its "
                                           "recipe into the cache (after changing a recipe)")
    p.add_argument("name", metavar="NAME", help="a built-in model name, e.g. builtin:addition or builtin:chain")
    p.add_argument("--force", action="store_true", help="build again even if the cache holds a build of it")
    add_json_option(p)
    p.set_defaults(func=build_model)


def build_model(args) -> int:
    from vapo_engine.builtin_model.recipes import RECIPES
    from vapo_engine.builtin_model.shipped import shipped_folder

    if args.name not in RECIPES:  # only the user's text goes through the redaction (not the list of names)
        shown = public_message(UserError(args.name), known_secrets())
        print(f"error: {shown!r} is not a built-in model. Fix: use one of {', '.join(sorted(RECIPES))}.",
              file=sys.stderr)
        return 2
    from vapo_engine.builtin_model.build import builtin_model_dir, cache_root, is_current

    recipe = RECIPES[args.name]
    cached = cache_root() / recipe.folder_name()
    existed = is_current(cached, recipe) and not args.force
    path = cached if existed else builtin_model_dir(task=args.name, rebuild=True, log=lambda line: None
                                                    if args.json else print(line, flush=True))
    shipped = shipped_folder(recipe)
    used = shipped or path
    if args.json:
        print_json({"name": args.name, "path": str(path), "built": not existed, "recipe_hash": recipe.recipe_hash(),
                    "runs_use": str(used), "shipped": str(shipped) if shipped else None})
        return 0
    print(f"{args.name}: {path}" + (" (already built; --force builds it again)" if existed else ""))
    if shipped:
        print(f"runs use the shipped model {shipped} (built from the same recipe);\n"
              "change the recipe, or point model.local_path at the folder above, to train from this build")
    return 0
