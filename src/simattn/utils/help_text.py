"""What ``--help`` shows: descriptions and help texts written in the docstrings' reStructuredText, made plain for a
terminal. :mod:`simattn.utils.recipe` builds every ``simattn`` parser with :func:`plain_help`."""
from __future__ import annotations

import argparse
import functools
import re
from typing import Any, Dict

__all__ = ["plain_text", "plain_help"]

#: an interpreted-text role (``:mod:`x```, ``:func:`~x.y```) and an inline literal (````x````)
_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str) -> str:
    """``text`` without reStructuredText markup: a literal ````x```` → ``x``, ``:mod:`x.y``` → ``x.y``,
    ``:func:`~x.y``` → ``y`` and a paragraph's closing ``::`` (a literal block follows) → ``:``."""
    text = _ROLE.sub(lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2].lstrip("."), text)
    text = _LITERAL.sub(r"\1", text)
    return re.sub(r"(\S) ?::$", r"\1:", text, flags=re.MULTILINE)


@functools.lru_cache(maxsize=None)
def _plain_formatter(base: type) -> type:
    """The argparse formatter class ``base`` with its whole output passed through :func:`plain_text`."""
    return type(f"Plain{base.__name__}", (base,), {"format_help": lambda self: plain_text(base.format_help(self))})


class _PlainSubparsers(argparse._SubParsersAction):
    """``add_subparsers()`` whose parsers format their help as their parent's does."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs["formatter_class"] = _plain_formatter(kwargs.get("formatter_class", argparse.HelpFormatter))
        return super().add_parser(name, **kwargs)


def plain_help(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``ArgumentParser`` keyword arguments with the formatter (``formatter_class``, default argparse's) made
    plain-text (:func:`plain_subparsers` does the same for a parser's subcommands)."""
    return {**kwargs, "formatter_class": _plain_formatter(kwargs.get("formatter_class", argparse.HelpFormatter))}


def plain_subparsers(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser``, whose ``add_subparsers()`` makes parsers with plain-text help; returns it."""
    parser.register("action", "parsers", _PlainSubparsers)
    return parser
