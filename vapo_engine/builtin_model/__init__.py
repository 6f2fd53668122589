"""The built-in tiny models of the CPU demos: the model and tokenizer (`model`), the supervised warm-start
(`sft`) and the cached builds, one per built-in task (`build`). Worker-side (torch); the RL recipe in
`vapo_engine.trainer` only asks for a directory (`builtin_model_dir`)."""
from .build import (
           BUILTIN_VERSION,
           DONE_MARKER,
           RECIPES,
           BuildRecipe,
           builtin_model_dir,
           cache_root,
           is_complete,
)
from .model import build_tokenizer, make_config, make_model, make_model_dir

__all__ = ["BUILTIN_VERSION", "DONE_MARKER", "RECIPES", "BuildRecipe", "build_tokenizer", "builtin_model_dir",
           "cache_root", "is_complete", "make_config", "make_model", "make_model_dir"]
