"""The one option mechanism: every option declared once, typed and range-checked, and everything made from it.

A task declares its options as one dataclass whose fields are :func:`option` fields (type, default, help text and
allowed values: a range, a list of choices, or a check such as timm's auto-augment parser) and :func:`section`
fields (a nested dataclass of the same kind, e.g. ``convert.transfer_lr``). The engine's options are
:class:`simattn.engine.config.EngineConfig`; every training task's schema extends it
(:class:`~simattn.classify.config.TrainConfig`, :class:`~simattn.convert.config.ConvertConfig`,
:class:`~simattn.ssl.config.SslConfig`, :class:`~simattn.detect.config.DetectConfig`), and may change the defaults
of the options it inherits (:func:`task_defaults`) but never their meaning.

From that one declaration come:

- the YAML recipe keys: :func:`load_recipe` reads defaults < a recipe file (a path or the name of a recipe shipped in
  ``simattn/configs``, which may start from another with ``base: NAME`` and names the command it is for with
  ``command: NAME``) < overrides, and checks every value;
- the command line (:func:`add_recipe_options`, :func:`recipe_from_args`): ``-c RECIPE``, ``--set key=value`` items
  (:func:`simattn.utils.values.parse_assignments`; dotted keys for sections) and one flag per option
  (``--grad-accum-steps 2``, ``--convert.transfer-lr 1e-3``), each flag the same as its ``--set`` form (of the
  two for one key, the later on the command line wins);
- ``--help``, the one-line errors (option, value, what is allowed) and the "did you mean" of unknown keys;
- recipes a user can bend (:func:`resolve_recipe`): an option declared ``belongs_to`` a choice (``data_dir`` to the
  datasets read from disk, ``model_kwargs`` to ``model``) is dropped with a note when a later layer replaces that
  choice, and is a one-line error when it was given for a choice it does not apply to; ``--print-config`` prints
  the result as a recipe annotated with where each value came from (:func:`config_yaml`);
- the ``config.yaml`` a run writes (:func:`recipe_to_save`): a recipe for a new run as it is. ``output``, ``resume``
  and ``overwrite`` say where a run goes, not what it does, and are left out.

Options whose default is an empty mapping (``model_kwargs``) are free-form keyword arguments for a library call;
overrides merge into them key by key and ``null`` or ``{}`` empties them. Commands without recipes (validate, export,
viz, bench, demo) declare :class:`Opt` mappings and use :func:`add_option_flags` and :func:`checked_flags`; their
option names become flags through :func:`flag_name`, the one place that does.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import functools
import os
import sys
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .help_text import plain_help, plain_subparsers
from .option_checks import (INTERPOLATIONS, PROB, SCHEDULES, check_auto_augment, check_device,  # noqa: F401
                            check_optimizer, check_path, maybe)
from .values import MAX_YAML_NODES, QUOTE_LIMIT, load_yaml, quoted  # noqa: F401 (part of this module's API)
from .values import NotOfType, as_type, numbers_in

__all__ = ["Opt", "option", "section", "task_defaults", "check_fields", "RUN_KEYS", "load_recipe", "merge_recipe",
           "resolve_recipe", "Resolved", "config_yaml", "print_config_if_asked", "find_recipe", "list_recipes",
           "recipe_to_save", "recipe_name", "option_paths", "check_value", "recipe_parser", "add_recipe_options",
           "recipe_overrides", "recipe_from_args", "check_optimizer", "check_device", "check_auto_augment",
           "check_path", "INTERPOLATIONS", "SCHEDULES", "PROB", "maybe", "add_option_flags", "checked_flags",
           "flag_name", "command_parser", "quoted", "load_yaml", "MAX_YAML_NODES"]

#: keys that say where a run writes, not what it does (never saved into a run's config.yaml)
RUN_KEYS = ("output", "resume", "overwrite")
#: the recipe key that names the command a recipe is for (``command: convert``; ``base:``'s recipe's when absent).
#: Not an option: a command that cannot read the recipe says which one can, instead of naming its first odd key.
COMMAND_KEY = "command"


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
    const: Any = None  # the value of a bare ``--flag`` (``--resume`` alone is ``auto``)
    flags: Tuple[str, ...] = ()  # more flag names besides the generated one (``--to`` for ``convert.to``)
    required: bool = False  # a command's flag that must be given (commands without recipes only)
    #: the choice this option belongs to: a sibling option's name, then the values it applies to (or one function
    #: returning them); with no values, the option belongs to whichever value the choice had when it was set.
    #: A recipe's value is dropped (with a note) when a later layer (the command line) replaces the choice.
    belongs_to: Tuple[Any, ...] = ()
    #: a free-form mapping whose item ``choice_key`` chooses what its other items apply to (a segmenter's
    #: ``backbone``): a later layer that changes it drops the items earlier layers set, but those it gives itself
    #: and ``keeps`` (names, or one function returning them: the options of the part that stays), with a note
    choice_key: Optional[str] = None
    keeps: Union[Sequence[str], Callable[[], Sequence[str]]] = ()

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


def check_value(name: str, spec: Opt, value: Any) -> Any:
    """``value`` for option ``name`` brought to its type and checked; a one-line ValueError otherwise."""
    def bad(extra: str = "") -> ValueError:
        return ValueError(f"option {name!r}: got {quoted(value)}; allowed: {spec.describe()}{extra}")

    try:
        out = as_type(spec.hint, value)
    except NotOfType:
        raise bad() from None
    if out is None:
        return None
    choices = spec.choice_list()
    if choices is not None and out not in choices:
        close = difflib.get_close_matches(str(out), [str(c) for c in choices], n=1)
        raise bad(f" (did you mean {quoted(close[0])}?)" if close else "")
    for v in numbers_in(out):
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


# ----- schemas: dataclasses of options --------------------------------------------------------------------------------

def option(default: Any = None, help: str = "", factory=None, **spec: Any):
    """A schema's field; its :class:`Opt` (help, range, choices) lives in the field's metadata."""
    opt = Opt(default=factory() if factory is not None else default, help=help, **spec)
    if factory is not None:
        return field(default_factory=factory, metadata={"opt": opt})
    return field(default=default, metadata={"opt": opt})


def section(cls: type):
    """A schema's field that is a nested section of options (a dataclass of :func:`option` fields)."""
    return field(default_factory=cls, metadata={"section": cls})


def task_defaults(**defaults: Any):
    """Class decorator (under ``@dataclass``): a task's own defaults for options it inherits, which keep their one
    declaration (type, range, help) in the parent schema."""
    def apply(cls: type) -> type:
        parent = cls.__mro__[1]
        fields, hints = {f.name: f for f in dataclasses.fields(parent)}, typing.get_type_hints(parent)
        cls.__annotations__ = annotations = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in defaults.items():
            annotations[name] = hints[name]  # a KeyError here is a typo in the task's schema
            metadata = fields[name].metadata
            setattr(cls, name, field(default_factory=lambda v=value: copy.deepcopy(v), metadata=metadata)
                    if isinstance(value, (list, dict)) else field(default=value, metadata=metadata))
        return cls
    return apply


@functools.lru_cache(maxsize=None)
def _specs(cls: type) -> Dict[str, Any]:
    """``{name: Opt}`` of a schema's options (each with the default this schema gives it) and ``{name: cls}`` of its
    sections."""
    hints = typing.get_type_hints(cls)
    out: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if "section" in f.metadata:
            out[f.name] = f.metadata["section"]
        elif "opt" in f.metadata:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out[f.name] = dataclasses.replace(f.metadata["opt"], type=hints[f.name], default=default)
    return out


def _is_section(spec: Any) -> bool:
    return isinstance(spec, type)


def _is_free(spec: Any) -> bool:
    return isinstance(spec, Opt) and isinstance(spec.default, dict)


def option_paths(schema: type, where: str = "") -> Dict[str, Opt]:
    """Every option of ``schema`` by its dotted name (``epochs``, ``convert.transfer_lr``)."""
    out: Dict[str, Opt] = {}
    for name, spec in _specs(schema).items():
        if _is_section(spec):
            out.update(option_paths(spec, f"{where}{name}."))
        else:
            out[f"{where}{name}"] = spec
    return out


def check_fields(config: Any, where: str = "") -> None:
    """Check (and coerce) every option of a schema instance, its sections' too, whichever way it was made (recipe,
    flags, Python); a section given as a mapping becomes its dataclass."""
    for name, spec in _specs(type(config)).items():
        value = getattr(config, name)
        if _is_section(spec):
            if isinstance(value, Mapping):
                value = _build(spec, _merge(dataclasses.asdict(spec()), value, spec, f"{where}{name}."))
            elif not isinstance(value, spec):
                raise ValueError(f"recipe: {where}{name!r} must be a mapping of options, got {quoted(value)}")
            check_fields(value, f"{where}{name}.")
            setattr(config, name, value)
        else:
            setattr(config, name, check_value(f"{where}{name}", spec, value))


def _build(schema: type, values: Mapping[str, Any]) -> Any:
    """An instance of ``schema`` from nested values (unchecked: the root's ``__post_init__`` checks)."""
    kwargs = {}
    for name, spec in _specs(schema).items():
        if name in values:
            value = values[name]
            kwargs[name] = _build(spec, value) if _is_section(spec) and isinstance(value, Mapping) else value
    return schema(**kwargs)


def _unknown(name: str, value: Any, specs: Mapping[str, Any], root: type) -> ValueError:
    """A one-line error for an unknown key: the close match here, or the option of that name elsewhere in the
    schema (a key that moved, e.g. ``train.epochs`` → ``epochs``), or the schema's own ``renamed`` entry."""
    leaf = name.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, list(specs), n=1)
    paths = option_paths(root)
    meant = getattr(root, "renamed", {}).get(name) or (close[0] if close else None)
    if meant is None and isinstance(value, Mapping) and value:  # an unknown section: name its first key
        key = next(iter(value))
        return _unknown(f"{name}.{key}", value[key], {}, root)
    if meant is None:  # the option of that name elsewhere, or a close one
        meant = next((p for p in paths if p.rsplit(".", 1)[-1] == leaf and p != name), None) or \
            next(iter(difflib.get_close_matches(leaf, list(paths), n=1)), None)
    hint = f" (did you mean {meant!r}?)" if meant else ""
    known = (f"known keys here: {', '.join(sorted(specs))}" if 0 < len(specs) <= 25 else
             "--help lists every option")
    return ValueError(f"recipe: unknown key {quoted(name)}{hint}; {known}")


class Replacing(dict):
    """A free-form mapping given after its ``null`` on the command line (``--set model_kwargs=null
    --model-kwargs a=1``): it replaces the recipe's items instead of merging into them."""


def _merge(values: Dict[str, Any], update: Mapping[str, Any], schema: type, where: str = "",
           root: Optional[type] = None) -> Dict[str, Any]:
    """``values`` (nested, as ``dataclasses.asdict`` gives them) updated with ``update``; unknown keys refused, sections
    merged key by key, free-form mappings merged key by key (``null`` empties them); values checked later."""
    root = root or schema
    specs = _specs(schema)
    out = copy.deepcopy(values)
    for key, value in update.items():
        name = f"{where}{key}"
        if key not in specs:
            raise _unknown(name, value, specs, root)
        spec = specs[key]
        if _is_section(spec):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ValueError(f"recipe: {name!r} must be a mapping of options, got {quoted(value)}")
            out[key] = _merge(out.get(key) or {}, value, spec, f"{name}.", root)
        elif _is_free(spec):
            if value is None or (isinstance(value, Mapping) and not value):  # null and {} empty it
                out[key] = {}
            elif isinstance(value, Replacing):
                out[key] = dict(value)
            elif not isinstance(value, Mapping):
                raise ValueError(f"option {name!r}: got {quoted(value)}; allowed: a mapping (KEY=VALUE items)")
            else:
                out[key] = {**(out.get(key) or {}), **value}
        else:
            out[key] = value
    return out


def merge_recipe(config: Any, update: Mapping[str, Any]) -> Any:
    """A copy of the schema instance ``config`` with the nested ``update`` applied, every value checked."""
    schema = type(config)
    return _build(schema, _merge(dataclasses.asdict(config), update, schema)).validate()


# ----- recipe files -------------------------------------------------------------------------------------------------

def _recipe_dir():
    # package data (pyproject: simattn = ["configs/*.yaml"]); repo-root configs/ links to the same files
    return resources.files("simattn") / "configs"


def _fits(data: Mapping[str, Any], schema: type) -> bool:
    """Whether every key of ``data`` (and of its sections) is one of the schema's."""
    specs = _specs(schema)
    for key, value in data.items():
        if key in ("base", COMMAND_KEY):
            continue
        if key not in specs:
            return False
        if _is_section(specs[key]) and not (isinstance(value, Mapping) and _fits(value, specs[key])):
            return False
    return True


@functools.lru_cache(maxsize=1)
def _shipped_recipes() -> Dict[str, Mapping[str, Any]]:
    """The shipped recipe files' top-level mappings by name, read once per process (package data); a file that is
    not a YAML mapping is left out."""
    files = {}
    for entry in _recipe_dir().iterdir():
        if not entry.name.endswith(".yaml"):
            continue
        try:
            data = load_yaml(entry.read_text(), entry.name)
        except ValueError:
            continue
        if isinstance(data, Mapping):
            files[entry.name[:-5]] = data
    return files


def list_recipes(schema: Optional[type] = None) -> List[str]:
    """Names of the recipes shipped in the package (``--config NAME``); with ``schema``, only those for that task
    (whose keys the schema knows)."""
    files = _shipped_recipes()

    def fits(name: str, chain: Tuple[str, ...] = ()) -> bool:
        # a recipe's own keys and those of its shipped base: chain (a variant that only changes the data source
        # belongs to its base's task)
        data = files[name]
        if not _fits(data, schema):
            return False
        base = data.get("base")
        base = str(base)[:-5] if str(base).endswith(".yaml") else str(base)
        return base not in files or base in chain or fits(base, chain + (name,))

    return sorted(name for name in files if schema is None or fits(name))


def find_recipe(recipe: str, schema: Optional[type] = None) -> Path:
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


def _read_yaml_mapping(path: Path) -> Dict[str, Any]:
    """A recipe file's top-level mapping (:func:`load_yaml`); an empty file is an empty mapping."""
    if not path.is_file():
        raise FileNotFoundError(f"recipe file not found: {path}")
    loaded = load_yaml(path.read_text(), f"recipe {path}") or {}
    if not isinstance(loaded, Mapping):
        raise ValueError(f"recipe {path} must hold a mapping of option: value, got {type(loaded).__name__}")
    return dict(loaded)


def _recipe_layers(recipe: str, schema: type, chain: Tuple[Path, ...] = ()
                   ) -> List[Tuple[Path, Dict[str, Any], Optional[str]]]:
    """A recipe's own mappings and the command each names, its ``base:`` recipe's (a shipped name or a path beside
    it) first; unchecked."""
    path = find_recipe(recipe, schema)
    if path.resolve() in chain:
        raise ValueError(f"recipe {path} inherits from itself (base: chain {' -> '.join(map(str, chain))})")
    loaded = _read_yaml_mapping(path)
    base, command = loaded.pop("base", None), loaded.pop(COMMAND_KEY, None)
    if command is not None and not (isinstance(command, str) and command.strip()):
        raise ValueError(f"recipe {path}: {COMMAND_KEY!r} names the command the recipe is for (e.g. "
                         f"{COMMAND_KEY}: train), got {quoted(command)}")
    layers: List[Tuple[Path, Dict[str, Any], Optional[str]]] = []
    if base is not None:
        name = str(base) if str(base).endswith(".yaml") else f"{base}.yaml"
        sibling = path.parent / name
        layers = _recipe_layers(str(sibling) if sibling.is_file() else str(base), schema, chain + (path.resolve(),))
    return layers + [(path, loaded, command)]


def _for_another_command(recipe: str, marked: Optional[str], running: Optional[str]) -> Optional[ValueError]:
    """The one-line error for a recipe whose options the running command does not take and whose ``command:`` key
    names another command (None when it names none, or this one)."""
    if not marked or not running or marked.split()[0] == running.split()[0]:
        return None
    path = find_recipe(recipe)
    shown = f"configs/{path.name}" if path.parent == Path(str(_recipe_dir())) else str(path)
    return ValueError(f"{shown} is a `simattn {marked}` recipe, not a `simattn {running}` one; run "
                      f"`simattn {marked} -c {recipe}`")


@dataclass
class Resolved:
    """A recipe resolved (:func:`resolve_recipe`): the nested ``values``, where each option's value came from
    (``origins``: dotted name → 'default', 'recipe NAME' or 'flag'; a free-form mapping may list several) and the
    ``notes`` on options dropped because they belonged to a choice that was replaced."""
    schema: type
    values: Dict[str, Any]
    origins: Dict[str, List[str]]
    notes: List[str]

    def config(self) -> Any:
        return _build(self.schema, self.values).validate()


def _leaf(values: Mapping[str, Any], path: str) -> Any:
    for part in path.split("."):
        values = values[part]
    return values


def _set_leaf(values: Dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        values = values[part]
    values[last] = value


def _named(update: Mapping[str, Any], schema: type, where: str = "") -> List[str]:
    """The dotted option names an update sets (a section's ``null`` sets none)."""
    out: List[str] = []
    specs = _specs(schema)
    for key, value in update.items():
        spec = specs.get(key)
        if _is_section(spec):
            out += _named(value, spec, f"{where}{key}.") if isinstance(value, Mapping) else []
        else:
            out.append(f"{where}{key}")
    return out


def _choice(path: str, spec: Opt) -> Tuple[str, Optional[List[Any]]]:
    """The dotted name of the choice an option belongs to (a sibling option) and the values it applies to (None:
    whichever value the choice had when the option was set)."""
    where = path.rsplit(".", 1)[0] + "." if "." in path else ""
    rest = spec.belongs_to[1:]
    values = list(rest[0]()) if len(rest) == 1 and callable(rest[0]) else list(rest) or None
    return where + spec.belongs_to[0], values


def _given(path: str, value: Any, source: str) -> str:
    """How the user wrote an option: ``--dataset digits`` on the command line, ``dataset 'digits' (recipe X)``."""
    if source == "flag":
        return f"{flag_name(path)} {value if isinstance(value, str) else quoted(value)}"
    return f"{path} {quoted(value)} ({source})"


def _drop_replaced(schema: type, defaults: Dict[str, Any], before: Dict[str, Any], values: Dict[str, Any],
                   update: Mapping[str, Any], origins: Dict[str, List[str]], source: str) -> List[str]:
    """Reset to their defaults the options of a choice this layer replaced that the new value does not take and
    that this layer did not set; a free-form mapping this layer added items to keeps only those. Returns one note
    per replaced choice naming what was dropped."""
    named = set(_named(update, schema))
    dropped: Dict[str, List[str]] = {}
    for path, spec in option_paths(schema).items():
        if not spec.belongs_to:
            continue
        choice, applies = _choice(path, spec)
        new = _leaf(values, choice)
        if _leaf(before, choice) == new or (applies is not None and new in applies):
            continue
        old, default = _leaf(before, path), _leaf(defaults, path)
        if old == default or (path in named and not (_is_free(spec) and _leaf(update, path))):
            continue
        where = " + ".join(origins[path])
        if path in named:  # the items this layer gives, on the default
            _set_leaf(values, path, {**default, **(_leaf(update, path) or {})})
        else:
            _set_leaf(values, path, copy.deepcopy(default))
            origins[path] = ["default"]
        dropped.setdefault(choice, []).append(f"{path} {quoted(old)} ({where})")
    return [f"{_given(choice, _leaf(values, choice), source)} replaces "
            f"{_given(choice, _leaf(before, choice), origins[choice][-1])}; dropped what belonged to that: "
            f"{', '.join(names)}" for choice, names in dropped.items()]


def _drop_replaced_items(schema: type, before: Dict[str, Any], values: Dict[str, Any], update: Mapping[str, Any],
                         origins: Dict[str, List[str]], source: str) -> List[str]:
    """In each free-form mapping with a ``choice_key`` this layer changed, drop the items earlier layers set for the
    old choice (not those this layer gives, nor the option's ``keeps``). Returns one note per mapping."""
    notes = []
    for path, spec in option_paths(schema).items():
        key = spec.choice_key
        if not (_is_free(spec) and key and _leaf_or(update, path) is not None):
            continue
        given, old, new = _leaf(update, path) or {}, (_leaf(before, path) or {}).get(key), _leaf(values, path).get(key)
        if key not in given or old is None or old == new:
            continue
        keeps, items = {key, *given, *(spec.keeps() if callable(spec.keeps) else spec.keeps)}, _leaf(values, path)
        dropped = [k for k in items if k not in keeps]
        if not dropped:
            continue
        _set_leaf(values, path, {k: v for k, v in items.items() if k not in dropped})
        where = " + ".join(s for s in origins[path] if s != source)
        now = f"{flag_name(path)} {key}={new}" if source == "flag" else f"{path}.{key} {quoted(new)} ({source})"
        notes.append(f"{now} replaces {path}.{key} {quoted(old)} ({where}); dropped its options: "
                     f"{', '.join(f'{k}={quoted(items[k])}' for k in dropped)}")
    return notes


def _check_belonging(schema: type, defaults: Dict[str, Any], values: Mapping[str, Any],
                     origins: Mapping[str, List[str]]) -> None:
    """A one-line ValueError for an option set (away from its default) for a choice it does not apply to."""
    for path, spec in option_paths(schema).items():
        if not spec.belongs_to:
            continue
        choice, applies = _choice(path, spec)
        value, chosen = _leaf(values, path), _leaf(values, choice)
        if applies is None or chosen in applies or value == _leaf(defaults, path):
            continue
        raise ValueError(f"{_given(path, value, origins[path][-1])} does not apply to "
                         f"{_given(choice, chosen, origins[choice][-1])}: it belongs to {choice} "
                         f"{', '.join(map(str, applies))}; drop it or choose one of those")


def resolve_recipe(schema: type, recipe: Optional[str] = None,
                   overrides: Union[Mapping[str, Any], Iterable[str], None] = None,
                   command: Optional[str] = None) -> Resolved:
    """Defaults < the recipe ``recipe`` (its ``base:`` chain first) < ``overrides`` (the command line: a nested
    mapping or ``key=value`` items), each layer merged in turn. A layer that changes a choice drops what earlier
    layers set for the replaced value (options declared with ``Opt.belongs_to``), with a note; an option that does
    not apply to the final choice is a one-line ValueError naming where it was set. A recipe that ``command`` (the
    running one, e.g. ``train``) cannot read and that names another command (``command:``) is refused naming it."""
    from .values import parse_assignments
    defaults = dataclasses.asdict(schema())
    paths = option_paths(schema)
    values, origins = defaults, {path: ["default"] for path in paths}
    layers: List[Tuple[str, Optional[Path], Mapping[str, Any]]] = []
    marked = None  # the command the recipe is for: its own command: key, else its nearest base's
    for path, data, named in _recipe_layers(str(recipe), schema) if recipe is not None else ():
        layers.append((f"recipe {recipe_name(str(path))}", path, data))
        marked = named or marked
    if overrides:
        update = overrides if isinstance(overrides, Mapping) else parse_assignments(overrides, what="--set item")
        layers.append(("flag", None, update))
    notes: List[str] = []
    for source, path, update in layers:
        before = values
        try:
            values = _merge(values, update, schema)
        except ValueError as e:
            if path is None:
                raise ValueError(str(e)) from None
            other = _for_another_command(str(recipe), marked, command)
            raise other or ValueError(f"{e} (in recipe {path})") from None
        notes += _drop_replaced(schema, defaults, before, values, update, origins, source)
        notes += _drop_replaced_items(schema, before, values, update, origins, source)
        for name in _named(update, schema):  # a free-form mapping given items keeps the others it had
            kept = _is_free(paths[name]) and set(_leaf(values, name)) - set(_leaf(update, name) or {})
            origins[name] = [*(s for s in origins[name] if s != source), source] if kept else [source]
    if recipe is not None and "recipe" in _specs(schema):
        values["recipe"] = str(recipe)
    _check_belonging(schema, defaults, values, origins)
    return Resolved(schema, values, origins, notes)


def load_recipe(schema: type, recipe: Optional[str] = None,
                overrides: Union[Mapping[str, Any], Iterable[str], None] = None, command: Optional[str] = None) -> Any:
    """Defaults, then the recipe file ``recipe`` (a path or shipped name), then ``overrides`` (a nested mapping or
    ``key=value`` items), every value checked (:func:`resolve_recipe`; its notes go to stderr); an instance of
    ``schema`` with ``recipe`` set to the recipe given. ``command``: the command running, to name the right one for a
    recipe of another."""
    resolved = resolve_recipe(schema, recipe, overrides, command)
    config = resolved.config()
    if resolved.notes and int(os.environ.get("RANK", "0")) == 0:
        for note in resolved.notes:
            print(f"note: {note}", file=sys.stderr, flush=True)
    return config


def recipe_to_save(config: Any) -> Dict[str, Any]:
    """A run's recipe as it is saved to ``config.yaml``: every option except :data:`RUN_KEYS`, so the file is a
    recipe for a new run (``--config run/config.yaml``) that writes to its own folder."""
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in RUN_KEYS and k != "recipe"}


# ----- the command line: one flag per option ---------------------------------------------------------------------------

def flag_name(name: str) -> str:
    """The command-line flag of option ``name``: ``grad_accum_steps`` → ``--grad-accum-steps``,
    ``convert.transfer_lr`` → ``--convert.transfer-lr``."""
    return "--" + name.replace("_", "-")


def _is_list(spec: Opt) -> bool:
    hint = spec.hint
    if typing.get_origin(hint) is Union:  # Optional[List[...]]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else hint
    return typing.get_origin(hint) in (list, List) or hint is list


#: where a recipe command's parsed arguments list its flags and ``--set`` items in the order they were given
_GIVEN = "recipe_given"


def _note_given(namespace: Any, dest: str, value: Any) -> None:
    setattr(namespace, _GIVEN, [*(getattr(namespace, _GIVEN, None) or []), (dest, value)])


class _Given(argparse.Action):
    """A recipe command's flag or ``--set`` (``extend``: each use adds its items), noted in the order given so that
    the later of a flag and a ``--set`` item for the same key wins (:func:`recipe_overrides`)."""

    def __init__(self, *args: Any, extend: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.extend = extend

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        before = getattr(namespace, self.dest, None) if self.extend else None
        setattr(namespace, self.dest, [*(before or []), *values] if self.extend else values)
        _note_given(namespace, self.dest, values)


class _GivenSwitch(argparse.BooleanOptionalAction):
    """``--flag``/``--no-flag`` of a recipe command, noted in order as :class:`_Given`."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _note_given(namespace, self.dest, getattr(namespace, self.dest))


def _add_flag(parser: Any, name: str, spec: Opt, default: Any, noted: bool = False) -> None:
    """One ``--flag`` (and the option's extra ``flags``) for option ``name``, its help from the :class:`Opt`. Values
    are read as YAML (paths as typed: as YAML, '' would be null and 2024 a number) and left unchecked, so that a bad
    one is the one-line error of :func:`check_value` rather than argparse's usage text. ``noted``: a recipe
    command's flag, whose place among the ``--set`` items counts."""
    from .values import parse_value
    store: Dict[str, Any] = {"action": _Given} if noted else {}
    extend: Dict[str, Any] = {"action": _Given, "extend": True} if noted else {"action": "extend"}
    names = [flag_name(name), *spec.flags]
    shown = f" (default {spec.default!r})" if spec.default is not None else ""
    help_ = (spec.help + shown).strip()
    metavar = name.rsplit(".", 1)[-1].upper()
    if spec.required:
        parser.add_argument(*names, dest=name, type=str if spec.check is check_path else parse_value, required=True,
                            metavar=metavar, help=help_)
    elif spec.hint is bool:
        parser.add_argument(*names, dest=name, action=_GivenSwitch if noted else argparse.BooleanOptionalAction,
                            default=default, help=help_)
    elif _is_free(spec):
        merged = " (items merge into the recipe's; see --set for the values)" if default is argparse.SUPPRESS else ""
        parser.add_argument(*names, dest=name, nargs="+", default=default, metavar="KEY=VALUE",
                            help=f"{spec.help}{merged}".strip(), **extend)
    elif _is_list(spec):
        parser.add_argument(*names, dest=name, nargs="+", type=parse_value, default=default, metavar=metavar,
                            help=help_, **store)
    else:
        choices = spec.choice_list() if not callable(spec.choices) else None
        if choices:
            metavar = "{" + ",".join(map(str, choices)) + "}"
        bare = {"nargs": "?", "const": spec.const} if spec.const is not None else {}  # ``--resume`` alone
        parser.add_argument(*names, dest=name, type=str if spec.check is check_path else parse_value,
                            default=default, metavar=metavar, help=help_, **bare, **store)


def _flag_value(name: str, spec: Opt, value: Any) -> Any:
    """What a flag's text means: KEY=VALUE items as a mapping, one list literal (or null) as the list itself."""
    from .values import parse_assignments
    if _is_free(spec) and isinstance(value, list):
        return parse_assignments(value, what=f"{flag_name(name)} item")
    if _is_list(spec) and isinstance(value, list) and len(value) == 1 and (value[0] is None or
                                                                          isinstance(value[0], list)):
        return value[0]
    return value


def add_recipe_options(parser: Any, schema: type, example: str = "epochs=3", flags: bool = True) -> None:
    """The command line of a task driven by a recipe of ``schema``: ``-c RECIPE``, ``--set KEY=VALUE`` items and
    (with ``flags``; else ``--output`` alone) one flag per option, sections' as ``--section.key``, all defaulting
    to 'not given' so that the recipe's value stands. :func:`recipe_from_args` reads them back."""
    from .values import OPTIONS_HELP
    parser.add_argument("-c", "--config", metavar="RECIPE",
                        help=f"a YAML file or a shipped recipe name ({', '.join(list_recipes(schema))}); default: "
                             "the built-in defaults")
    parser.add_argument("--set", dest="set_items", action=_Given, extend=True, nargs="+", default=[],
                        metavar="KEY=VALUE",
                        help=f"recipe options to override ({OPTIONS_HELP}), e.g. --set {example} (repeatable); "
                             "each is also a flag; where a flag and a --set item give the same key, the later one "
                             "on the command line wins")
    # the command the parsed arguments are for (``train``, ``ssl train``): a recipe names the one it is for
    parser.set_defaults(recipe_command=parser.prog.split(" ", 1)[-1])
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved configuration as a recipe (YAML; each value's comment says where it "
                             "came from: default, recipe or flag) and exit without running")
    paths = option_paths(schema)
    if parser.usage is None:  # argparse's would list every flag
        parser.usage = f"{parser.prog} [-c RECIPE] [--set KEY=VALUE ...] [--OPTION VALUE ...] (-h lists them)"
    if not flags:
        _add_flag(parser, "output", paths["output"], argparse.SUPPRESS, noted=True)
        return
    groups: Dict[str, Any] = {}
    for name, spec in paths.items():
        where = name.rsplit(".", 1)[0] if "." in name else ""
        if where not in groups:
            groups[where] = parser.add_argument_group(
                f"section {where} (--set {where}.KEY=VALUE)" if where else "recipe options (override the recipe)")
        _add_flag(groups[where], name, spec, argparse.SUPPRESS, noted=True)


def recipe_parser(prog: str, description: str, schema: Optional[type] = None, example: str = "epochs=3",
                  **kwargs: Any) -> argparse.ArgumentParser:
    """The parser of a training command (``train``, ``convert``; ``ssl`` and ``detect`` hold one per action), with
    :func:`add_recipe_options` for ``schema`` when given."""
    parser = plain_subparsers(argparse.ArgumentParser(prog=prog, description=description, **plain_help(kwargs)))
    if schema is not None:
        add_recipe_options(parser, schema, example)
    return parser


def recipe_overrides(schema: type, args: Any) -> Dict[str, Any]:
    """What :func:`add_recipe_options`' arguments change in the recipe (nested): ``--set`` items and flags in the
    order they were given, so that of a flag and an item for the same key the later one wins, as a repeated flag
    does (arguments made without that order: the items, then the flags)."""
    from .values import deep_merge, parse_assignments
    paths = option_paths(schema)
    given = getattr(args, _GIVEN, None)
    if given is None:
        given = [("set_items", args.set_items), *((k, v) for k, v in vars(args).items() if k in paths)]
    overrides: Dict[str, Any] = {}
    emptied = set()  # free-form mappings a null or {} emptied: items given after it replace the recipe's
    for name, value in given:
        if name == "set_items":
            step = parse_assignments(value, what="--set item")
        elif name in paths:
            value = _flag_value(name, paths[name], value)
            for part in reversed(name.split(".")):
                value = {part: value}
            step = value
        else:
            continue
        overrides = deep_merge(overrides, step)
        for path, spec in paths.items():
            if not _is_free(spec):
                continue
            given_now, current = _leaf_or(step, path, ...), _leaf_or(overrides, path)
            if given_now is None or given_now == {}:
                emptied.add(path)
            elif path in emptied and isinstance(current, Mapping) and current:
                _set_leaf(overrides, path, Replacing(current))
    return overrides


def _leaf_or(values: Mapping[str, Any], path: str, missing: Any = None) -> Any:
    for part in path.split("."):
        if not isinstance(values, Mapping) or part not in values:
            return missing
        values = values[part]
    return values


def recipe_from_args(schema: type, args: Any, overrides: Optional[Mapping[str, Any]] = None) -> Any:
    """The checked recipe of :func:`add_recipe_options`' arguments: the recipe, then the ``--set`` items and flags
    (or ``overrides``, when the command took some of them for itself). What a run needs beyond that (a task's
    ``check_run()``: its model and data) the run checks first, as ``--print-config`` does."""
    return load_recipe(schema, args.config, recipe_overrides(schema, args) if overrides is None else overrides,
                       command=getattr(args, "recipe_command", None))


def config_yaml(resolved: Resolved) -> str:
    """A resolved configuration as YAML that is itself a recipe (every option but ``recipe``), each value followed
    by a comment saying where it came from: default, recipe NAME, or flag (the command line)."""
    import yaml
    lines = ["# resolved configuration (a recipe: pass it back with -c FILE); after each value, where it came from"]

    def walk(schema: type, values: Mapping[str, Any], where: str, indent: str) -> None:
        for name, spec in _specs(schema).items():
            path = f"{where}{name}"
            if path == "recipe":
                continue
            if _is_section(spec):
                lines.append(f"{indent}{name}:")
                walk(spec, values[name], f"{path}.", indent + "  ")
                continue
            text = yaml.safe_dump({name: values[name]}, default_flow_style=True, sort_keys=False, width=1 << 30,
                                  allow_unicode=True).strip()
            lines.append(f"{indent}{text[1:-1]}  # {' + '.join(resolved.origins[path])}")

    walk(resolved.schema, dataclasses.asdict(resolved.config()), "", "")
    return "\n".join(lines) + "\n"


def print_config_if_asked(schema: type, args: Any, overrides: Optional[Mapping[str, Any]] = None) -> bool:
    """With ``--print-config``: print the configuration :func:`recipe_from_args` would run (:func:`config_yaml`;
    notes to stderr) and return True, so the command exits 0 without running; False otherwise. The printed
    configuration passes the checks of the run (``validate()`` of the schema) first."""
    if not getattr(args, "print_config", False):
        return False
    resolved = resolve_recipe(schema, args.config, recipe_overrides(schema, args) if overrides is None else overrides,
                              getattr(args, "recipe_command", None))
    for note in resolved.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    config = resolved.config()
    if hasattr(config, "check_run"):  # what the run checks before it builds anything (a task's model and data)
        config.check_run()
    print(config_yaml(resolved), end="", flush=True)
    return True


# ----- the flags of commands without recipes (validate, export, viz, bench, demo) ------------------------------------

def command_parser(prog: str, description: str, specs: Optional[Mapping[str, Opt]] = None,
                   **kwargs: Any) -> argparse.ArgumentParser:
    """The parser of a command without a recipe, with one flag per option of ``specs`` (see
    :func:`add_option_flags`); ``kwargs`` go to ``argparse.ArgumentParser``."""
    parser = plain_subparsers(argparse.ArgumentParser(prog=prog, description=description, **plain_help(kwargs)))
    if specs is not None:
        add_option_flags(parser, specs)
    return parser


def add_option_flags(parser: Any, specs: Mapping[str, Opt]) -> None:
    """One ``--flag`` per option of ``specs`` (``img_size`` → ``--img-size``) at its default; :func:`checked_flags`
    checks them all."""
    for name, spec in specs.items():
        # KEY=VALUE items are collected in a list (argparse cannot extend a mapping default): None is "not given"
        _add_flag(parser, name, spec, None if _is_free(spec) else spec.default)


def checked_flags(args: Any, specs: Mapping[str, Opt]) -> Dict[str, Any]:
    """The values of :func:`add_option_flags`' flags, each checked against its :class:`Opt` (a one-line ValueError
    naming the flag, the value and what is allowed)."""
    def given(name: str, spec: Opt) -> Any:
        value = getattr(args, name)
        return copy.deepcopy(spec.default) if value is None and _is_free(spec) else value

    return {name: check_value(flag_name(name), spec, _flag_value(name, spec, given(name, spec)))
            for name, spec in specs.items()}
