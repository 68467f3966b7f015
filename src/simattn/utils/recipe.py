"""The one option mechanism: typed, range-checked options, and one recipe loader for every task's schema.

A recipe is a YAML mapping of options. Each task declares its schema in its own package, listing every option with
its type, default, help text and allowed values (a range, a list of choices, or a check such as timm's auto-augment
parser), either as a dataclass whose fields are :func:`option` (and :func:`section`) fields, or as nested dicts of
:class:`Opt`:

- the engine: :class:`simattn.engine.config.EngineConfig`; ``simattn train``: ``simattn.train.config.TrainConfig``
  (a flat dataclass: every field is also a ``--flag``); ``simattn convert``: ``simattn.convert.options.ConvertConfig``
  (TrainConfig and a ``convert`` section);
- ``simattn ssl`` and ``simattn detect``: nested dict schemas (``simattn.ssl.schema``, ``simattn.detect.schema``),
  registered with :func:`register_nested_schema`.

:func:`load_recipe` reads defaults < a recipe file (a path or the name of a recipe shipped in ``simattn/configs``,
which may start from another with ``base: NAME``) < overrides (``--set key=value`` items, parsed with
:func:`simattn.utils.options.parse_assignments`), and checks every value. Bad input is a one-line ValueError that
names the option, the value and what is allowed. Options whose default is an empty mapping (``model_kwargs``,
``model.kwargs``) are free-form keyword arguments for a library call; overrides merge into them key by key and
``null`` empties them.

``output``, ``resume`` and ``overwrite`` say where a run goes, not what it does: they are left out of the
``config.yaml`` a run writes (:func:`recipe_to_save`), so that file is a recipe for a new run as it is.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["Opt", "option", "section", "check_fields", "check_section", "RUN_KEYS", "RecipeDefaults", "load_recipe", "merge_recipe",
           "parse_overrides", "find_recipe", "list_recipes", "recipe_to_save", "recipe_name", "defaults_of",
           "specs_of", "check_value", "add_recipe_arguments", "recipe_from_args", "register_nested_schema",
           "check_optimizer", "check_device", "check_auto_augment", "check_path", "INTERPOLATIONS", "SCHEDULES",
           "PROB", "maybe", "add_option_flags", "checked_flags", "quoted", "load_yaml", "MAX_YAML_NODES"]

#: keys that say where a run writes, not what it does (never saved into a run's config.yaml)
RUN_KEYS = ("output", "resume", "overwrite")


#: the longest a value quoted in an error message may get (characters)
QUOTE_LIMIT = 200


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


# ----- one option ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Opt:
    """One recipe option: its default, type and allowed values.

    ``low``/``high`` bound numbers (and each number of a list), inclusive unless ``low_open``/``high_open``;
    ``choices`` is a list or a function returning one; ``check(value)`` returns None or says what is wrong;
    ``length`` fixes a list's length; ``allowed`` overrides the generated "allowed: ..." text.
    """
    default: Any = None
    help: str = ""
    type: Any = None
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    choices: Union[Sequence[Any], Callable[[], Sequence[Any]], None] = None
    check: Optional[Callable[[Any], Optional[str]]] = None
    length: Optional[int] = None
    allowed: Optional[str] = None
    const: Any = None  # the value of a bare ``--flag`` (train flags)

    @property
    def hint(self) -> Any:
        if self.type is not None:
            return self.type
        if self.default is None:
            return Any
        if isinstance(self.default, list):
            inner = type(self.default[0]) if self.default else Any
            return List[inner]
        if isinstance(self.default, dict):
            return Dict[str, Any]
        return type(self.default)

    def choice_list(self) -> Optional[List[Any]]:
        if self.choices is None:
            return None
        return list(self.choices() if callable(self.choices) else self.choices)

    def describe(self) -> str:
        """What the option accepts, for error messages."""
        if self.allowed:
            return self.allowed
        choices = self.choice_list()
        if choices is not None:
            text = "one of " + ", ".join(str(c) for c in choices)
        else:
            text = _describe_type(self.hint)
            if self.low is not None or self.high is not None:
                text += " " + _describe_range(self)
        if self.length is not None:
            text += f" ({self.length} values)"
        if _nullable(self.hint):
            text += ", or null"
        return text


def _nullable(hint: Any) -> bool:
    return typing.get_origin(hint) is Union and type(None) in typing.get_args(hint)


def _describe_type(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        return " or ".join(_describe_type(a) for a in args if a is not type(None))
    if origin in (list, List):
        return f"a list of {_describe_type(args[0]).replace('a ', '').replace('an ', '')}s" if args else "a list"
    if origin in (dict, Dict) or hint is dict:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, "any value")


def _describe_range(spec: Opt) -> str:
    lo, hi = spec.low, spec.high
    if lo is not None and hi is not None:
        return f"in {'(' if spec.low_open else '['}{lo:g}, {hi:g}{')' if spec.high_open else ']'}"
    if lo is not None:
        return f"{'>' if spec.low_open else '>='} {lo:g}"
    return f"{'<' if spec.high_open else '<='} {hi:g}"


class _Bad(ValueError):
    pass


def _coerce(hint: Any, value: Any) -> Any:
    """``value`` as type ``hint`` (YAML 1.1 reads ``5e-4`` as a string: such strings are numbers), or _Bad."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        for alt in (a for a in args if a is not type(None)):
            try:
                return _coerce(alt, value)
            except _Bad:
                continue
        raise _Bad
    if hint is Any:
        return value
    if value is None:
        raise _Bad
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Bad
    if hint is int:
        if isinstance(value, bool):
            raise _Bad
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _Bad
    if hint is float:
        if isinstance(value, bool):
            raise _Bad
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise _Bad from None
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
        raise _Bad
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Bad
    if origin in (list, List) or hint is list:
        if not isinstance(value, (list, tuple)):
            raise _Bad
        return [_coerce(args[0], v) for v in value] if args else list(value)
    if origin in (dict, Dict) or hint is dict:
        if not isinstance(value, Mapping):
            raise _Bad
        return dict(value)
    return value


def _numbers(value: Any) -> List[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return []


def check_value(name: str, spec: Opt, value: Any) -> Any:
    """``value`` for option ``name`` brought to its type and checked; a one-line ValueError otherwise."""
    def bad(extra: str = "") -> ValueError:
        return ValueError(f"option {name!r}: got {quoted(value)}; allowed: {spec.describe()}{extra}")

    try:
        out = _coerce(spec.hint, value)
    except _Bad:
        raise bad() from None
    if out is None:
        return None
    choices = spec.choice_list()
    if choices is not None and out not in choices:
        close = difflib.get_close_matches(str(out), [str(c) for c in choices], n=1)
        raise bad(f" (did you mean {quoted(close[0])}?)" if close else "")
    for v in _numbers(out):
        if spec.low is not None and (v < spec.low or (spec.low_open and v == spec.low)):
            raise bad()
        if spec.high is not None and (v > spec.high or (spec.high_open and v == spec.high)):
            raise bad()
    if spec.length is not None and isinstance(out, list) and len(out) != spec.length:
        raise bad()
    if spec.check is not None:
        problem = spec.check(out)
        if problem:
            raise ValueError(f"option {name!r}: got {quoted(value)}; {problem}")
    return out


# ----- checks that ask the libraries --------------------------------------------------------------------------------

def _optimizers() -> List[str]:
    from timm.optim import list_optimizers
    return list(list_optimizers())


def check_optimizer(name: str) -> Optional[str]:
    names = _optimizers()
    if name.lower() in names or name.lower().split("_")[-1] in names:  # timm accepts 'lookahead_adamw'
        return None
    close = difflib.get_close_matches(name.lower(), names, n=3)
    return (f"allowed: an optimizer timm.optim knows ({len(names)}, e.g. adamw, sgd, lamb"
            + (f"; did you mean {', '.join(close)}?" if close else "") + ")")


def check_auto_augment(text: str) -> Optional[str]:
    from timm.data.auto_augment import augment_and_mix_transform, auto_augment_transform, rand_augment_transform
    make = (rand_augment_transform if text.startswith("rand") else
            augment_and_mix_transform if text.startswith("augmix") else auto_augment_transform)
    try:
        make(text, {"translate_const": 100, "img_mean": (124, 116, 104)})
    except (AssertionError, ValueError, KeyError, IndexError, TypeError) as e:
        reason = str(e).strip() or "not understood"
        return (f"{reason}; allowed: a timm auto-augment string such as rand-m9-mstd0.5-inc1, augmix-m5-w4-d2, "
                "original, v0, 3a")
    return None


def check_path(text: str) -> Optional[str]:
    """An empty path is refused: ``Path('')`` is the current folder, which nobody means by it."""
    return None if text.strip() else "an empty path is not allowed (give a path, or leave the option out)"


def check_device(text: str) -> Optional[str]:
    if text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return None
    return "allowed: cpu, cuda, cuda:N, or null (CUDA when available)"


INTERPOLATIONS = ["bicubic", "bilinear", "nearest", "box", "hamming", "lanczos", "random"]
SCHEDULES = ["cosine", "tanh", "step", "multistep", "poly", "wsd", "rsqrt", "constant", "plateau", "none"]
PROB = dict(low=0.0, high=1.0)


# ----- options of dataclass schemas ------------------------------------------------------------------------------------------------

def option(default: Any = None, help: str = "", factory=None, **spec: Any):
    """A dataclass schema's field; its :class:`Opt` (help, range, choices) lives in the field's metadata."""
    opt = Opt(default=factory() if factory is not None else default, help=help, **spec)
    if factory is not None:
        return field(default_factory=factory, metadata={"opt": opt})
    return field(default=default, metadata={"opt": opt})


def section(specs: Mapping[str, Any]):
    """A dataclass schema's field that is a nested section of options (``convert.transfer_lr``): a dict of their
    values, each checked against ``specs`` (a nested dict schema)."""
    return field(default_factory=lambda: _defaults(specs), metadata={"section": dict(specs)})


def check_fields(config: Any) -> None:
    """Check (and coerce) every field of a dataclass schema instance against its :class:`Opt` or section, whichever
    way the instance was made (recipe, flags, Python)."""
    for name, spec in _dataclass_specs(type(config)).items():
        value = getattr(config, name)
        if isinstance(spec, Mapping):
            setattr(config, name, check_section(value, spec, f"{name}."))
        else:
            setattr(config, name, check_value(name, spec, value))


def check_section(values: Mapping[str, Any], specs: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """``values`` of a nested section checked against ``specs`` (unknown keys refused, defaults filled in)."""
    if not isinstance(values, Mapping):
        raise ValueError(f"recipe: {where.rstrip('.')!r} must be a mapping of options, got {quoted(values)}")
    _merge({}, values, specs, where, check=False)  # unknown keys
    return _check_all(values, specs, where)


def maybe(hint: Any) -> Any:
    return Optional[hint]


#: the nested schemas (a recipe's sections tell which one it follows), registered by the tasks that declare them
NESTED_SCHEMAS: List[Dict[str, Any]] = []


def register_nested_schema(schema: Dict[str, Any]) -> Dict[str, Any]:
    """Make a task's nested schema known to :func:`merge_recipe` (which finds a recipe's schema by its sections)."""
    if not any(schema is known for known in NESTED_SCHEMAS):
        NESTED_SCHEMAS.append(schema)
    return schema


# ----- schemas as nested specs --------------------------------------------------------------------------------------

Schema = Union[type, Mapping[str, Any]]


@functools.lru_cache(maxsize=None)
def _dataclass_specs(cls: type) -> Dict[str, Opt]:
    hints = typing.get_type_hints(cls)
    return {f.name: dataclasses.replace(f.metadata["opt"], type=hints[f.name]) if "opt" in f.metadata
            else f.metadata["section"] for f in dataclasses.fields(cls) if "opt" in f.metadata or "section" in f.metadata}


def specs_of(schema: Schema) -> Dict[str, Any]:
    """The nested ``{key: Opt | {…}}`` of a schema (a dataclass such as ``TrainConfig``, or a nested dict)."""
    if isinstance(schema, RecipeDefaults):
        return schema.specs
    if dataclasses.is_dataclass(schema):
        return dict(_dataclass_specs(schema if isinstance(schema, type) else type(schema)))
    return dict(schema)


class RecipeDefaults(dict):
    """A nested schema's defaults as a plain nested dict (``DEFAULTS['train']['epochs']``), which also carries the
    schema (``.specs``) so that :func:`load_recipe` and :func:`merge_recipe` check values against it."""

    def __init__(self, specs: Mapping[str, Any]) -> None:
        super().__init__(_defaults(specs))
        self.specs = dict(specs)


def _defaults(specs: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: copy.deepcopy(v.default) if isinstance(v, Opt) else _defaults(v) for k, v in specs.items()}


def defaults_of(schema: Schema) -> RecipeDefaults:
    """Every option of ``schema`` at its default."""
    return RecipeDefaults(specs_of(schema))


def _is_free(spec: Any) -> bool:
    return isinstance(spec, Opt) and isinstance(spec.default, dict)


def _unknown(name: str, specs: Mapping[str, Any]) -> ValueError:
    leaf = name.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, list(specs), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    known = (f"known keys here: {', '.join(sorted(specs))}" if len(specs) <= 25 else
             "--help lists every option")
    return ValueError(f"recipe: unknown key {quoted(name)}{hint}; {known}")


def _merge(values: Dict[str, Any], update: Mapping[str, Any], specs: Mapping[str, Any], where: str = "",
           check: bool = True) -> Dict[str, Any]:
    out = copy.deepcopy(values)
    for key, value in update.items():
        name = f"{where}{key}"
        if key not in specs:
            raise _unknown(name, specs)
        spec = specs[key]
        if isinstance(spec, Mapping):  # a checked section
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ValueError(f"recipe: {name!r} must be a mapping of options, got {quoted(value)}")
            out[key] = _merge(out.get(key, {}), value, spec, f"{name}.", check)
        elif _is_free(spec):  # free-form kwargs: null empties them, a mapping merges key by key
            if value is None:
                out[key] = {}
            elif not isinstance(value, Mapping):
                raise ValueError(f"option {name!r}: got {quoted(value)}; allowed: a mapping (KEY=VALUE items)")
            else:
                out[key] = {**(out.get(key) or {}), **value}
        else:
            out[key] = check_value(name, spec, value) if check else value
    return out


def _check_all(values: Mapping[str, Any], specs: Mapping[str, Any], where: str = "") -> Dict[str, Any]:
    out = {}
    for key, spec in specs.items():
        name = f"{where}{key}"
        if isinstance(spec, Mapping):
            out[key] = _check_all(values.get(key, {}), spec, f"{name}.")
        else:
            out[key] = check_value(name, spec, values.get(key, spec.default))
    return out


def merge_recipe(base: Mapping[str, Any], update: Mapping[str, Any], schema: Optional[Schema] = None,
                 where: str = "") -> Dict[str, Any]:
    """``base`` deep-updated with ``update``, every value checked against ``schema`` (``base``'s when it is a
    :class:`RecipeDefaults`); unknown keys raise a ValueError naming them."""
    schema = schema if schema is not None else base
    if not isinstance(schema, RecipeDefaults) and not dataclasses.is_dataclass(schema):
        schema = _schema_of_values(schema)
    return _merge(dict(base), update, specs_of(schema), where)


def _schema_of_values(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """The nested schema (:data:`NESTED_SCHEMAS`) whose sections are those of the recipe ``values``."""
    if any(isinstance(v, Opt) for v in values.values()):
        return values
    for schema in NESTED_SCHEMAS:
        if set(values) == set(schema):
            return schema
    raise ValueError(f"recipe sections {sorted(values)} are not those of any command's recipe")


def parse_overrides(items: Union[str, Iterable[str], None]) -> Dict[str, Any]:
    """``['train.epochs=3', 'model.kwargs.depth=4']`` → a nested dict
    (:func:`simattn.utils.options.parse_assignments`)."""
    from .options import parse_assignments
    return parse_assignments(items, what="--set item")


# ----- recipe files -------------------------------------------------------------------------------------------------

def _recipe_dir():
    # package data (pyproject: simattn = ["configs/*.yaml"]); repo-root configs/ links to the same files
    return resources.files("simattn") / "configs"


def _fits(data: Mapping[str, Any], specs: Mapping[str, Any]) -> bool:
    """Whether every key of ``data`` (and of its checked sections) is one of the schema's."""
    for key, value in data.items():
        if key == "base":
            continue
        if key not in specs:
            return False
        if isinstance(specs[key], Mapping) and isinstance(value, Mapping) and not _fits(value, specs[key]):
            return False
    return True


def list_recipes(schema: Optional[Schema] = None) -> List[str]:
    """Names of the recipes shipped in the package (``--config NAME``); with ``schema``, only those for that task
    (whose keys the schema knows)."""
    import yaml
    specs = specs_of(schema) if schema is not None else None
    names = []
    for entry in _recipe_dir().iterdir():
        if not entry.name.endswith(".yaml"):
            continue
        try:
            data = yaml.safe_load(entry.read_text())
        except yaml.YAMLError:
            continue
        if isinstance(data, Mapping) and (specs is None or _fits(data, specs)):
            names.append(entry.name[:-5])
    return sorted(names)


def find_recipe(recipe: str, schema: Optional[Schema] = None) -> Path:
    """A recipe file from a path or a shipped recipe name (with or without ``.yaml``, or as ``configs/NAME.yaml``)."""
    path = Path(recipe)
    if path.is_file():
        return path
    name = path.name[:-5] if path.name.endswith(".yaml") else path.name
    shipped = _recipe_dir() / f"{name}.yaml"
    if str(path.parent) in ("", ".", "configs") and shipped.is_file():
        return Path(str(shipped))
    if path.exists():
        raise ValueError(f"recipe {quoted(recipe)} is not a file")
    raise FileNotFoundError(f"recipe file not found: {quoted(recipe)} is neither a file nor a shipped recipe "
                            f"({', '.join(list_recipes(schema))})")


def recipe_name(recipe: Optional[str]) -> Optional[str]:
    """The short name of a recipe path or name (``configs/digits_cpu.yaml`` → ``digits_cpu``)."""
    if not recipe:
        return None
    name = Path(str(recipe)).name
    return name[:-5] if name.endswith(".yaml") else name


#: the most nodes a YAML document may hold once its aliases are expanded (a recipe has a few hundred; an "alias
#: bomb" of nested aliases expands a few lines into billions)
MAX_YAML_NODES = 100_000


def _expanded_size(root: Any, limit: int) -> Optional[int]:
    """The number of nodes of the composed YAML node graph ``root`` with every alias expanded, or None when it
    exceeds ``limit`` or an alias holds itself (an infinite document). Iterative: nesting depth costs no stack."""
    import yaml
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


def load_yaml(text: str, where: str, limit: int = MAX_YAML_NODES) -> Any:
    """The YAML document ``text`` (safe types only), refused in one line (naming ``where``) when it is not valid
    YAML, is nested too deeply, or expands to more than ``limit`` nodes through its aliases."""
    import yaml
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, limit) is None:
            raise ValueError(f"{where} expands to more than {limit} values through its YAML aliases (&anchor/*alias), "
                             "or an alias refers to itself: refused; write the values out")
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ValueError(f"{where} is not valid YAML: {quoted(str(e).splitlines()[0], 300)}") from None
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to read") from None
    finally:
        loader.dispose()


def _read_yaml_mapping(path: Path) -> Dict[str, Any]:
    """A recipe file's top-level mapping (:func:`load_yaml`); an empty file is an empty mapping."""
    if not path.is_file():
        raise FileNotFoundError(f"recipe file not found: {path}")
    loaded = load_yaml(path.read_text(), f"recipe {path}") or {}
    if not isinstance(loaded, Mapping):
        raise ValueError(f"recipe {path} must hold a mapping of option: value, got {type(loaded).__name__}")
    return dict(loaded)


def _read_recipe(recipe: str, specs: Mapping[str, Any], schema: Schema, chain: Tuple[Path, ...] = ()
                 ) -> Dict[str, Any]:
    """A recipe's values (unchecked), after those of its ``base:`` recipe (a shipped name or a path beside it)."""
    path = find_recipe(recipe, schema)
    if path.resolve() in chain:
        raise ValueError(f"recipe {path} inherits from itself (base: chain {' -> '.join(map(str, chain))})")
    loaded = _read_yaml_mapping(path)
    base = loaded.pop("base", None)
    values: Dict[str, Any] = {}
    if base is not None:
        name = str(base) if str(base).endswith(".yaml") else f"{base}.yaml"
        sibling = path.parent / name
        values = _read_recipe(str(sibling) if sibling.is_file() else str(base), specs, schema,
                              chain + (path.resolve(),))
    try:
        return _merge(values, loaded, specs, check=False)
    except ValueError as e:
        raise ValueError(f"{e} (in recipe {path})") from None


def load_recipe(schema: Schema, recipe: Optional[str] = None,
                overrides: Union[Mapping[str, Any], Iterable[str], None] = None) -> Any:
    """Defaults < the recipe file ``recipe`` (a path or shipped name) < ``overrides`` (a nested mapping or
    ``key=value`` items), every value checked.

    ``schema`` is a dataclass schema (returns an instance with ``recipe`` set to the recipe given) or a nested
    schema / its :class:`RecipeDefaults` (returns the nested dict).
    """
    specs = specs_of(schema)
    values: Dict[str, Any] = _defaults(specs)
    if recipe is not None:
        values = _merge(values, _read_recipe(str(recipe), specs, schema), specs, check=False)
    if overrides:
        update = overrides if isinstance(overrides, Mapping) else parse_overrides(overrides)
        values = _merge(values, update, specs, check=False)
    if dataclasses.is_dataclass(schema):
        if recipe is not None and "recipe" in specs:
            values["recipe"] = str(recipe)
        return schema(**values).validate()
    return _check_all(values, specs)


def recipe_to_save(values: Union[Mapping[str, Any], Any]) -> Dict[str, Any]:
    """A run's recipe as it is saved to ``config.yaml``: every option except :data:`RUN_KEYS`, so the file is a
    recipe for a new run (``--config run/config.yaml``) that writes to its own folder."""
    data = values.to_dict() if hasattr(values, "to_dict") else copy.deepcopy(dict(values))
    return {k: v for k, v in data.items() if k not in RUN_KEYS and k != "recipe"}


# ----- the command line of nested recipes (ssl, detect) --------------------------------------------------------------

def add_recipe_arguments(parser: Any, schema: Schema, example: str, run: bool = False) -> None:
    """``--config``, ``--set`` and ``--output`` (and with ``run``, ``--resume`` and ``--overwrite``) for a command
    driven by a nested recipe; :func:`recipe_from_args` reads them back."""
    from .options import OPTIONS_HELP
    parser.add_argument("-c", "--config", metavar="RECIPE",
                        help=f"a YAML file or a shipped recipe name ({', '.join(list_recipes(schema))}); default: "
                             "the built-in defaults")
    parser.add_argument("--set", dest="set_items", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help=f"recipe options to override ({OPTIONS_HELP}), e.g. --set {example} (repeatable)")
    parser.add_argument("--output", help="output folder (default: runs/<recipe>/<date-time>)")
    if run:
        parser.add_argument("--resume", action="store_true",
                            help="continue the run in --output from its last.pth")
        parser.add_argument("--overwrite", action="store_true",
                            help="write into --output even if it holds another run's files (they are replaced)")


def recipe_from_args(schema: Schema, args: Any) -> Dict[str, Any]:
    """The checked recipe of :func:`add_recipe_arguments`' options."""
    from .options import deep_merge, parse_assignments
    overrides = parse_assignments(args.set_items, what="--set item")
    if args.output is not None:  # '' too: the schema refuses it rather than falling back to the default folder
        overrides = deep_merge(overrides, {"output": args.output})
    return load_recipe(schema, args.config, overrides)


# ----- the flags of commands without recipes (validate, export, viz, bench, demo) ------------------------------------

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_option_flags(parser: Any, specs: Mapping[str, Opt]) -> None:
    """One ``--flag`` per option of ``specs`` (``img_size`` → ``--img-size``), its help from the :class:`Opt`. Values
    are read as YAML and left unchecked: :func:`checked_flags` checks them all, so that a bad one is a one-line
    error (exit 2) naming the flag rather than argparse's usage text."""
    import argparse

    from .options import parse_value
    for name, spec in specs.items():
        default = f"default {spec.default!r}" if spec.default is not None else ""
        help_ = "; ".join(t for t in (spec.help, default) if t)
        if spec.hint is bool:
            parser.add_argument(_flag(name), dest=name, action=argparse.BooleanOptionalAction, default=spec.default,
                                help=help_)
        elif typing.get_origin(spec.hint) is list or typing.get_origin(spec.hint) is List:
            parser.add_argument(_flag(name), dest=name, nargs="+", type=parse_value, default=spec.default,
                                help=help_)
        else:
            choices = spec.choice_list() if not callable(spec.choices) else None
            metavar = "{" + ",".join(map(str, choices)) + "}" if choices else None
            bare = {"nargs": "?", "const": spec.const} if spec.const is not None else {}  # ``--quantize`` alone
            parser.add_argument(_flag(name), dest=name, type=parse_value, default=spec.default, metavar=metavar,
                                help=help_, **bare)


def checked_flags(args: Any, specs: Mapping[str, Opt]) -> Dict[str, Any]:
    """The values of :func:`add_option_flags`' flags, each checked against its :class:`Opt` (a one-line ValueError
    naming the flag, the value and what is allowed)."""
    return {name: check_value(_flag(name), spec, getattr(args, name)) for name, spec in specs.items()}
