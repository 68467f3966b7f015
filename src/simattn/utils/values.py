"""Values read from text, and values quoted in messages: YAML documents read with a bound on what their aliases
expand to (:func:`load_yaml`, for recipes and single values), the one option mini-language of every command
(``KEY=VALUE`` items), :func:`as_type`, which brings a value read so to an option's type, and :func:`quoted`, which
cuts a value shown in an error message to a few hundred characters.

``KEY=VALUE`` items are used by ``--set`` (recipe overrides), ``--model-kwargs`` and ``--attn-kwargs``:

- the value is parsed as a YAML scalar or flow collection: ``3`` is an int, ``1e-3`` a float, ``true`` a bool,
  ``null`` None, ``[0.9, 0.999]`` a list, ``{order: kv_first}`` a mapping, and a plain word stays a string;
- a dotted key nests: ``convert.transfer_lr=1e-3`` is ``{'convert': {'transfer_lr': 0.001}}`` and ``attn_kwargs.order=kv_first`` is
  ``{'attn_kwargs': {'order': 'kv_first'}}``;
- a later item for the same key wins; mappings given for the same key are merged key by key.

Bad text raises a one-line ``ValueError`` that quotes the item and says what is allowed.
"""
from __future__ import annotations

import math
import re
import typing
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import yaml

__all__ = ["first_line", "parse_value", "parse_assignments", "deep_merge", "OPTIONS_HELP", "quoted", "QUOTE_LIMIT",
           "load_yaml", "MAX_YAML_NODES", "as_type", "NotOfType", "numbers_in"]

#: one sentence for ``--help`` texts
OPTIONS_HELP = ("KEY=VALUE items; values are YAML (3, 1e-3, true, null, [a, b], {k: v}), dotted keys nest "
                "(a.b=1 is {a: {b: 1}})")


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML follows YAML 1.1, which reads ``1e-3`` (no dot) as a string; here it is a float, as in YAML 1.2.
    libyaml's parser where PyYAML has it (several times faster than the pure-Python one; the same safe types)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."))


#: the longest a value quoted in an error message may get (characters)
QUOTE_LIMIT = 200


def first_line(e: BaseException, *, with_type: bool = False, limit: Optional[int] = None) -> str:
    """The first line of an exception's message for a one-line error (``with_type``: after its type's name; cut to
    ``limit`` characters); its type's name when the message is empty."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    if line and with_type:
        line = f"{type(e).__name__}: {line}"
    line = line[:limit] if limit else line
    return line or type(e).__name__


def quoted(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters (``...`` marks the cut). Strings and
    containers are only rendered as far as they are shown, so a huge value costs no more than a small one."""
    out: List[str] = []
    budget = [limit]

    def emit(text: str) -> bool:
        if len(text) > budget[0]:
            out.append(text[:max(budget[0], 0)] + "...")
            budget[0] = -1
            return False
        out.append(text)
        budget[0] -= len(text)
        return True

    def walk(v: Any, depth: int, seen: frozenset) -> bool:
        if isinstance(v, str):
            return emit(repr(v[:budget[0] + 1]) if len(v) > budget[0] else repr(v))
        if isinstance(v, (list, tuple, dict)):
            if id(v) in seen or depth > 20:
                return emit("...")
            seen = seen | {id(v)}
            opening, closing = ("{", "}") if isinstance(v, dict) else ("[", "]") if isinstance(v, list) else ("(", ")")
            if not emit(opening):
                return False
            items = v.items() if isinstance(v, dict) else v
            for i, item in enumerate(items):
                if i and not emit(", "):
                    return False
                if isinstance(v, dict):
                    if not (walk(item[0], depth + 1, seen) and emit(": ") and walk(item[1], depth + 1, seen)):
                        return False
                elif not walk(item, depth + 1, seen):
                    return False
            if isinstance(v, tuple) and len(v) == 1 and not emit(","):
                return False
            return emit(closing)
        return emit(repr(v))

    walk(value, 0, frozenset())
    return "".join(out)


#: the most nodes a YAML document may hold once its aliases are expanded (a recipe has a few hundred; an "alias
#: bomb" of nested aliases expands a few lines into billions)
MAX_YAML_NODES = 100_000


def _expanded_size(root: Any, limit: int) -> Optional[int]:
    """The number of nodes of the composed YAML node graph ``root`` with every alias expanded, or None when it
    exceeds ``limit`` or an alias holds itself (an infinite document). Iterative: nesting depth costs no stack."""
    size: Dict[int, int] = {}
    stack: List[Tuple[Any, bool]] = [(root, False)]
    open_: set = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.ScalarNode):
            size[key] = 1
            continue
        children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value))
        if children_done:
            open_.discard(key)
            total = 1 + sum(size[id(c)] for c in children)
            if total > limit:
                return None
            size[key] = total
            continue
        if key in size:
            continue
        if key in open_:
            return None  # a node inside itself
        open_.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_:
                return None
            if id(child) not in size:
                stack.append((child, False))
    return size[id(root)]


class InvalidYaml(ValueError):
    """Text that is not YAML at all (as opposed to YAML that is refused)."""


def load_yaml(text: str, where: str, limit: int = MAX_YAML_NODES) -> Any:
    """The YAML document ``text`` (safe types only), refused in one line (naming ``where``) when it is not valid
    YAML, is nested too deeply, or expands to more than ``limit`` nodes through its aliases."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, limit) is None:
            raise ValueError(f"{where} expands to more than {limit} values through its YAML aliases (&anchor/*alias), "
                             "or an alias refers to itself: refused; write the values out")
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise InvalidYaml(f"{where} is not valid YAML: {quoted(str(e).splitlines()[0], 300)}") from None
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to read") from None
    finally:
        loader.dispose()


class NotOfType(ValueError):
    """A value that is not of the type asked for (:func:`as_type`)."""


def as_type(hint: Any, value: Any) -> Any:
    """``value`` as type ``hint`` (YAML 1.1 reads ``5e-4`` as a string: such strings are numbers), or
    :class:`NotOfType`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        for alt in (a for a in args if a is not type(None)):
            try:
                return as_type(alt, value)
            except NotOfType:
                continue
        raise NotOfType
    if hint is Any:
        return value
    if value is None:
        raise NotOfType
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise NotOfType
    if hint is int:
        if isinstance(value, bool):
            raise NotOfType
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise NotOfType
    if hint is float:
        if isinstance(value, bool):
            raise NotOfType
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise NotOfType from None
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
        raise NotOfType
    if hint is str:
        if isinstance(value, str):
            return value
        raise NotOfType
    if origin in (list, List) or hint is list:
        if not isinstance(value, (list, tuple)):
            raise NotOfType
        return [as_type(args[0], v) for v in value] if args else list(value)
    if origin in (dict, Dict) or hint is dict:
        if not isinstance(value, Mapping):
            raise NotOfType
        return dict(value)
    return value


def numbers_in(value: Any) -> List[float]:
    """The numbers of a number or a list (each checked against an option's range)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return []


#: the most values one ``KEY=VALUE`` item may expand to through YAML aliases
MAX_ITEM_NODES = 10_000


def parse_value(text: str) -> Any:
    """A YAML value; text that is not valid YAML (e.g. ``a: b: c``) stays the string it is. A value that expands
    through aliases to more than :data:`MAX_ITEM_NODES` values is refused (one-line ValueError)."""
    try:
        return load_yaml(text, f"value {quoted(text)}", MAX_ITEM_NODES)
    except InvalidYaml:
        return text


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> Dict[str, Any]:
    """``base`` updated with ``update``, mappings merged key by key (neither input is modified)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_assignments(items: Union[str, Iterable[str], None], what: str = "option") -> Dict[str, Any]:
    """``['model.name=x', 'epochs=3']`` → ``{'model': {'name': 'x'}, 'epochs': 3}``.

    ``what`` names the items in error messages (``'--set item'``, ``'model kwarg'``). A single string is one item.
    """
    if isinstance(items, str):
        items = [items]
    nested: Dict[str, Any] = {}
    for item in items or ():
        key, sep, text = str(item).partition("=")
        key = key.strip()
        parts = key.split(".")
        if not sep or not key or not all(p.strip() for p in parts):
            raise ValueError(f"{what} {item!r} is not KEY=VALUE (e.g. epochs=3, attn_kwargs.order=kv_first)")
        value = parse_value(text)
        for part in reversed(parts[1:]):
            value = {part.strip(): value}
        nested = deep_merge(nested, {parts[0].strip(): value})
    return nested
