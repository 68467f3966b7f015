"""``simattn list [kinds|models|recipes|pretrained] [PATTERN ...]``: what this install holds, by name.

Attention kinds (with their class and SimA's Table 2 exp class), the models registered with timm (with their
family), the shipped recipes (with their command and model) and the pretrained tags (with where their weights come
from). PATTERNs filter names as ``timm.list_models`` does (shell wildcards, ``sima*``); a pattern without one
matches anywhere in the name. ``--json`` prints the same as one JSON object.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
from typing import Any, Dict, List, Optional, Sequence

from .utils.recipe import command_parser

__all__ = ["main", "build_parser", "listing"]

SECTIONS = ("kinds", "models", "recipes", "pretrained")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("simattn list", "List the attention kinds, models, shipped recipes and pretrained tags "
                                            "(all four by default), filtered as timm.list_models filters.")
    parser.add_argument("patterns", nargs="*", metavar="[SECTION] PATTERN",
                        help=f"a first word of {', '.join(SECTIONS)} lists that section only (default: all four); "
                             "then keep names matching any pattern (shell wildcards; plain text matches anywhere)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return parser


def _matches(name: str, patterns: Sequence[str]) -> bool:
    if not patterns:
        return True
    return any(fnmatch.fnmatch(name, p if any(c in p for c in "*?[") else f"*{p}*") for p in patterns)


def _kinds() -> List[Dict[str, Any]]:
    from .attention import get_attention_class, list_attentions
    rows = []
    for name in list_attentions():
        cls = get_attention_class(name)
        rows.append({"name": name, "class": cls.__name__, "exps": getattr(cls, "exp_complexity", "")})
    return rows


def _models() -> List[Dict[str, Any]]:
    import timm

    from .models import list_models
    return [{"name": name, "family": timm.models.model_entrypoint(name).__module__.rsplit(".", 1)[-1]}
            for name in list_models()]


def _recipe_facts(name: str, seen: Sequence[str] = ()) -> Dict[str, Any]:
    from .utils.recipe import find_recipe
    from .utils.values import load_yaml
    path = find_recipe(name)
    data = load_yaml(path.read_text(), str(path)) or {}
    base = data.get("base")
    facts = _recipe_facts(str(base), (*seen, name)) if base and str(base) not in seen else {}
    model = data.get("model")
    if isinstance(model, dict):  # the tasks with a model section: its backbone or name
        model = model.get("backbone") or model.get("name")
    kwargs = data.get("model_kwargs") if isinstance(data.get("model_kwargs"), dict) else {}
    return {"command": data.get("command", facts.get("command", "train")),
            "model": kwargs.get("backbone") or model or facts.get("model")}


def _recipes() -> List[Dict[str, Any]]:
    from .utils.recipe import list_recipes
    return [{"name": name, **_recipe_facts(name)} for name in list_recipes()]


def _pretrained() -> List[Dict[str, Any]]:
    """Every tag with what a researcher picks by: the authors' top-1 (from the tag's notes), the input size, the
    license (``none stated`` where the authors' repository states none), the file and where it comes from."""
    from urllib.parse import urlparse

    from timm.models import get_arch_pretrained_cfgs

    from .models import SEGMENTERS, list_models
    from .models.released import tag_top1
    rows = []
    for model in [*list_models(), *SEGMENTERS]:
        for name, cfg in get_arch_pretrained_cfgs(model).items():
            if "." not in name:  # the untagged default: a recipe's preprocessing, no weights
                continue
            source = (f"hf-hub:{cfg.hf_hub_id}" if cfg.hf_hub_id else cfg.url) or "none published"
            top1 = tag_top1(cfg.to_dict())
            file = (cfg.hf_hub_filename or "model.safetensors") if cfg.hf_hub_id else \
                os.path.basename(urlparse(cfg.url).path) if cfg.url else "-"
            published = bool(cfg.hf_hub_id or cfg.url)
            rows.append({"name": name, "top1": top1 if top1 is not None else "-", "input": cfg.input_size[-1],
                         "license": cfg.license or ("none stated" if published else "-"), "file": file,
                         "weights": source, "classes": cfg.num_classes})
    return rows


_BUILDERS = {"kinds": _kinds, "models": _models, "recipes": _recipes, "pretrained": _pretrained}


def listing(what: str = "all", patterns: Sequence[str] = ()) -> Dict[str, List[Dict[str, Any]]]:
    """``{section: rows}`` for ``what`` (a section of :data:`SECTIONS` or ``'all'``), rows whose name matches."""
    sections = SECTIONS if what == "all" else (what,)
    return {s: [row for row in _BUILDERS[s]() if _matches(row["name"], patterns)] for s in sections}


def _table(rows: List[Dict[str, Any]], header: bool = False) -> str:
    if not rows:
        return "  (none)"
    lines = ([{k: k for k in rows[0]}] if header else []) + rows
    widths = {k: max(len(str(r[k])) for r in lines) for k in rows[0]}
    return "\n".join("  " + "  ".join(f"{str(r[k]):<{widths[k]}}" for k in r).rstrip() for r in lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    words = list(args.patterns)
    what = words.pop(0) if words and words[0] in ("all", *SECTIONS) else "all"
    result = listing(what, words)
    if words and not any(result.values()):
        import difflib
        close = difflib.get_close_matches(words[0], ("all", *SECTIONS), n=1, cutoff=0.75)
        if close:  # a misspelt section reads as a pattern that matches nothing
            raise ValueError(f"nothing is named like {words[0]!r}; did you mean the section {close[0]!r} "
                             f"(simattn list {close[0]})?")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for section, rows in result.items():
        print(f"{section} ({len(rows)}):\n{_table(rows, header=section == 'pretrained')}")
    return 0
