"""The package's layout holds: no import circle between modules, and imports only go down the layers
(kernels → attention → models → task packages → the command line); in attention/ and kernels/ no file takes a private
name of another file, and no attention kind imports another kind; no file over 900 lines and no function over 80 in src/
(model constructors aside); no runtime name tested outside deploy/."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> Dict[str, Tuple[Path, bool]]:
    """module name → (file, is a package's __init__)."""
    found = {"simattn_cli": (SRC / "simattn_cli.py", False)}
    for path in (SRC / "simattn").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found



def _imported_module(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The absolute module an ``from X import ...`` in module ``name`` reads (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))

def _imports(name: str, path: Path, is_package: bool, known) -> Set[str]:
    """The modules of ours that ``name`` imports anywhere in its file (lazy imports inside functions included)."""
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            prefix = _imported_module(node, name, is_package)
            out.add(prefix)
            out.update(f"{prefix}.{a.name}" for a in node.names)
    return {m for m in out if m in known and m != name}


def _graph() -> Dict[str, Set[str]]:
    known = _modules()
    return {name: _imports(name, path, pkg, known) for name, (path, pkg) in known.items()}


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_modules():
    known = _modules()
    # a package's __init__ re-exports its modules; an import of the package is not an import of each of them
    graph = {name: {m for m in deps if not known[m][1]} for name, deps in _graph().items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if module.startswith("simattn.") and len(parts) > 1 else module


def test_imports_only_go_down_the_layers():
    below = {"utils": {"utils"},
             "kernels": {"kernels", "utils"},
             "attention": {"attention", "kernels", "utils"},
             "models": {"attention", "kernels", "models", "utils"},
             "data": {"data", "utils"},
             "deploy": {"deploy", "models", "utils"},
             "engine": {"engine", "data", "models", "attention", "kernels", "utils"},
             "classify": {"classify", "engine", "data", "models", "attention", "kernels", "utils"}}
    wrong = sorted(f"{name} imports {dep}" for name, deps in _graph().items() if _layer(name) in below
                   for dep in deps if dep.startswith("simattn.") and _layer(dep) not in below[_layer(name)])
    assert wrong == []


def _imported_privates(name: str, path: Path, is_package: bool, known) -> List[str]:
    """The private names (a leading underscore, dunders aside) that ``name`` takes from other modules of ours:
    ``from m import _x`` and ``m._x`` where ``m`` is bound to one of our modules by an import."""
    out: List[str] = []
    modules: Dict[str, str] = {}  # local name → module of ours it is bound to
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.asname:
                    modules[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            prefix = _imported_module(node, name, is_package)
            if not prefix.startswith("simattn"):
                continue
            for a in node.names:
                if f"{prefix}.{a.name}" in known:
                    modules[a.asname or a.name] = f"{prefix}.{a.name}"
                elif a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{name} imports {prefix}.{a.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")
                and modules[node.value.id] != name):
            out.append(f"{name} uses {modules[node.value.id]}.{node.attr}")
    return sorted(set(out))


def _in_packages(*packages: str):
    known = _modules()
    return known, {name: entry for name, entry in known.items() if _layer(name) in packages}


def test_no_private_name_crosses_files_in_attention_and_kernels():
    """A file of attention/ or kernels/ uses only the public names of the other files of the project: what the
    kernel families share (plan cache, launch modes, dry_run, the tile helpers) is public in kernels/host.py and
    kernels/tiles.py."""
    known, files = _in_packages("attention", "kernels")
    assert "simattn.kernels.host" in files and "simattn.attention.sima" in files
    wrong = [use for name, (path, pkg) in sorted(files.items()) for use in _imported_privates(name, path, pkg, known)]
    assert wrong == []


def test_the_private_name_check_finds_imports_and_uses(tmp_path):
    known = {"simattn.a.b": None, "simattn.a.c": None, "simattn.a": None}
    path = tmp_path / "b.py"
    path.write_text("from . import c as C\nfrom .c import _x, y\nfrom .c import __all__\nimport simattn.a.c as D\n"
                    "C._z(); C.__file__; D._w; y._v\n")
    assert _imported_privates("simattn.a.b", path, False, known) == [
        "simattn.a.b imports simattn.a.c._x", "simattn.a.b uses simattn.a.c._w", "simattn.a.b uses simattn.a.c._z"]


def _private_attention_uses(name: str, path: Path, is_package: bool, private_methods: Set[str]) -> List[str]:
    """What module ``name`` takes of simattn.attention that is private: a module or a name with a leading
    underscore (dunders aside) in an import, or a private method of the attention bases (``self._attend``)."""
    out: List[str] = []
    private = lambda part: part.startswith("_") and not part.startswith("__")  # noqa: E731
    for node in ast.walk(ast.parse(path.read_text())):
        modules: List[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            prefix = _imported_module(node, name, is_package)
            modules = [f"{prefix}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute) and node.attr in private_methods:
            out.append(f"{name} uses {node.attr}")
        for module in modules:
            if module.startswith("simattn.attention.") and any(map(private, module.split(".")[2:])):
                out.append(f"{name} imports {module}")
    return sorted(set(out))


def _base_private_methods() -> Set[str]:
    tree = ast.parse((SRC / "simattn" / "attention" / "base.py").read_text())
    return {fn.name for cls in tree.body if isinstance(cls, ast.ClassDef) for fn in cls.body
            if isinstance(fn, ast.FunctionDef) and fn.name.startswith("_") and not fn.name.startswith("__")}


def test_models_use_only_public_names_of_attention():
    """The models reach the attention kinds through public names only: no private module or name of
    simattn.attention, no private method of its module bases (a pyramid stage overrides the public
    ``project_grid`` and ``check_call``)."""
    known, files = _in_packages("models")
    methods = _base_private_methods()
    assert {"_attend", "_output"} <= methods and "simattn.models.pvt" in files
    wrong = [use for name, (path, pkg) in sorted(files.items())
             for use in _private_attention_uses(name, path, pkg, methods)]
    assert wrong == []


def test_the_models_check_finds_private_modules_names_and_methods(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from ..attention._common import fx_tracing\nfrom ..attention import _x, y\n"
                    "import simattn.attention._registry\nfrom ..attention import base\n"
                    "self._attend(1); self.__dict__\n")
    assert _private_attention_uses("simattn.models.m", path, False, {"_attend"}) == [
        "simattn.models.m imports simattn.attention._common.fx_tracing",
        "simattn.models.m imports simattn.attention._registry", "simattn.models.m imports simattn.attention._x",
        "simattn.models.m uses _attend"]


#: the files of attention/ that are not kinds: shared checks and helpers, the registry, the backend chooser, the
#: module bases, the grid geometry and token↔image layouts, the grid-linear skeleton and the oracles
NOT_KINDS = {"__init__", "_common", "_registry", "backends", "base", "grid", "grid_linear", "reference"}
#: a kind that calls another kind's op, each with why; an entry that no longer applies is removed
KIND_IMPORTS = {
    ("linformer", "softmax"): "Linformer is softmax attention over projected keys and values",
}


def test_no_kind_imports_another_kind():
    """Each attention kind is a file of its own that imports no other kind's file (what several kinds share lives in
    the files of :data:`NOT_KINDS`)."""
    graph = _graph()
    kinds = {p.stem for p in (SRC / "simattn" / "attention").glob("*.py")} - NOT_KINDS
    assert {"sima", "soft", "agent", "linformer"} <= kinds
    found = {(name.split(".")[-1], dep.split(".")[-1]) for name, deps in graph.items()
             if name.startswith("simattn.attention.") and name.split(".")[-1] in kinds
             for dep in deps if dep.startswith("simattn.attention.") and dep.split(".")[-1] in kinds}
    assert found == set(KIND_IMPORTS)


#: the implementations a call can run on, and the names a ``backend`` option takes
BACKEND_NAMES = {"torch", "triton", "cpp"}
BACKEND_OPTIONS = BACKEND_NAMES | {"auto"}


def _own_nodes(fn: ast.AST):
    """The nodes of a function's body, without those of the functions it nests (each is judged on its own)."""
    for child in ast.iter_child_nodes(fn):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield child
            yield from _own_nodes(child)


def _names_backend(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "backend") or \
        (isinstance(node, ast.Attribute) and node.attr == "backend")


def _produced(value: ast.AST):
    """The literals an expression can evaluate to: itself, a conditional's branches, a tuple's or an ``or``'s items;
    not the operands of a comparison or a call (``choose(...) == "triton"`` acts on a choice, it makes none)."""
    if isinstance(value, ast.Constant):
        yield value.value
    elif isinstance(value, ast.IfExp):
        yield from _produced(value.body)
        yield from _produced(value.orelse)
    elif isinstance(value, (ast.Tuple, ast.List)):
        for element in value.elts:
            yield from _produced(element)
    elif isinstance(value, ast.BoolOp):
        for element in value.values:
            yield from _produced(element)


def _decides_a_backend(fn: ast.AST) -> bool:
    """Whether a function picks among the backends: it returns or assigns an implementation's name as a literal
    (``return "triton"``, ``path = "cpp"``, a lambda's value), compares a ``backend`` option with a backend's name, or
    reads the policy table."""
    for node in _own_nodes(fn):
        if isinstance(node, (ast.Return, ast.Assign, ast.AnnAssign, ast.Lambda)):
            value = node.body if isinstance(node, ast.Lambda) else node.value
            if value is not None and any(c in BACKEND_NAMES for c in _produced(value)):
                return True
        if isinstance(node, ast.Compare):
            sides = (node.left, *node.comparators)
            if any(_names_backend(s) for s in sides) and \
                    any(c in BACKEND_OPTIONS for s in sides for c in _string_constants(s)):
                return True
        if isinstance(node, ast.Name) and node.id == "POLICIES":
            return True
    return False


def _deciders(root: Path) -> List[str]:
    """``module:function`` of every function in attention/ and kernels/ under ``root`` that decides a backend."""
    return sorted(f"{path.parent.name}/{path.stem}:{name}"
                  for package in ("attention", "kernels") for path in sorted((root / package).rglob("*.py"))
                  for name, node in _functions(ast.parse(path.read_text())) if _decides_a_backend(node))


def test_one_function_decides_the_backend():
    """Torch, Triton or the CPU kernel is decided in one place: the chooser, from its policy table. Kinds pass their
    ``backend`` option to it and act on its answer; nothing else returns a backend's name, compares an option with
    one or reads the table, but the table's registry: ``register_policy`` (a kind's entry) and ``choices`` (the
    names a kind takes)."""
    assert _deciders(SRC / "simattn") == ["attention/backends:choices", "attention/backends:choose",
                                          "attention/backends:register_policy"]


def test_the_backend_decider_check_finds_each_way_of_deciding(tmp_path):
    (tmp_path / "attention").mkdir()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "attention" / "k.py").write_text(
        'def a(q):\n    return "triton" if q.is_cuda else "torch"\n'
        'def b(backend):\n    if backend in ("auto", "triton"):\n        pass\n'
        'def c(self):\n    return self.backend != "torch"\n'
        'def d(q):\n    f = lambda: "cpp"\n'
        'def e(kind):\n    return POLICIES[kind]\n'
        'def f(path):\n    if path == "triton":\n        return run(path, "torch")\n'
        'def f2(q):\n    triton = choose("k", q) == "triton"\n    return "kv_first" if triton else order\n')
    (tmp_path / "kernels" / "h.py").write_text('def g():\n    path = "cpp"\n    def inner():\n        pass\n')
    assert _deciders(tmp_path) == ["attention/k:a", "attention/k:b", "attention/k:c", "attention/k:d",
                                   "attention/k:e", "kernels/h:g"]


def test_convert_imports_nothing_from_train():
    """What train and convert share (classification options, data, evaluation, the task) is in classify/."""
    graph = _graph()
    wrong = sorted(f"{name} imports {dep}" for name, deps in graph.items() if _layer(name) == "convert"
                   for dep in deps if _layer(dep) == "train")
    assert wrong == []
    assert any(_layer(dep) == "classify" for name, deps in graph.items() if _layer(name) == "convert" for dep in deps)


def _files_containing(text: str) -> List[str]:
    return sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if text in p.read_text())


def test_each_concern_has_one_home():
    from simattn.engine.core import Engine  # noqa: F401  DDP wrapping
    from simattn.engine.amp import MixedPrecision  # noqa: F401  AMP and loss scaling
    from simattn.engine.dist import init_distributed  # noqa: F401  process-group set-up
    from simattn.utils.recipe import load_recipe, command_parser, recipe_parser  # noqa: F401  recipes, parsers

    assert _files_containing("init_process_group(") == ["simattn/engine/dist.py"]
    assert _files_containing('"WORLD_SIZE"') == ["simattn/engine/dist.py"]
    assert _files_containing("DistributedDataParallel(") == ["simattn/engine/core.py"]
    assert _files_containing("GradScaler(") == ["simattn/engine/amp.py"]
    assert _files_containing("argparse.ArgumentParser(") == ["simattn/utils/recipe.py"]
    assert set(_files_containing("yaml.safe_load(") + _files_containing("yaml.load(")) <= {
        "simattn/utils/values.py", "simattn/utils/recipe.py"}


def test_bench_model_is_a_package():
    """``bench model``'s concerns each have a module (spec, runner, probes, workers, results, cli); their lengths are
    held by the checks below, as every module's are."""
    package = SRC / "simattn" / "bench" / "model"
    assert not (SRC / "simattn" / "bench" / "model.py").exists()
    assert {p.stem for p in package.glob("*.py")} == {"__init__", "spec", "runner", "probes", "workers", "results",
                                                      "cli"}


MAX_FILE_LINES = 900
MAX_FUNCTION_LINES = 80


def _sources() -> List[Tuple[str, Path]]:
    """(path relative to src/, file) for every Python file of the package and the CLI."""
    return sorted((str(p.relative_to(SRC)), p) for p in SRC.rglob("*.py"))


def test_no_file_over_900_lines():
    long = [f"{name}: {n} lines" for name, path in _sources()
            if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES]
    assert long == []


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, def node) of every function, nested ones too (each counted on its own, with the lines of what
    it nests), e.g. ``Class.method`` and ``outer.inner``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if not isinstance(node, ast.ClassDef):
                yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _long_functions() -> Dict[str, int]:
    """``path:qualified.name`` → lines (``end_lineno - lineno + 1``, decorators not counted) of every function over
    80 lines in src/."""
    return {f"{name}:{qualname}": node.end_lineno - node.lineno + 1 for name, path in _sources()
            for qualname, node in _functions(ast.parse(path.read_text()))
            if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}


#: Model constructors may run past 80 lines: an ``__init__`` of an ``nn.Module`` in models/ states every submodule
#: and its arguments in one place, as timm's do, and a reader sees the architecture there. Each is named here, and
#: checked below to be such a constructor.
MODEL_CONSTRUCTORS = {
    "simattn/models/sima_xcit.py:XCiTBackbone.__init__",  # patch embedding, positional encodings, blocks, heads
}

def test_no_function_over_80_lines():
    long = _long_functions()
    assert sorted(set(long) - MODEL_CONSTRUCTORS) == []
    # an exemption that no longer applies is removed, so it cannot cover a later long function
    assert sorted(MODEL_CONSTRUCTORS - set(long)) == []


def test_exempt_functions_are_model_constructors():
    import importlib

    from torch import nn

    for entry in MODEL_CONSTRUCTORS:
        path, qualname = entry.split(":")
        *owner, method = qualname.split(".")
        assert path.startswith("simattn/models/") and method == "__init__" and len(owner) == 1, entry
        module = importlib.import_module(path[:-len(".py")].replace("/", "."))
        assert issubclass(getattr(module, owner[0]), nn.Module), entry


def test_the_length_check_finds_nested_and_method_functions():
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n\n"
                     "async def h():\n    pass\n")
    assert [(name, node.end_lineno - node.lineno + 1) for name, node in _functions(tree)] == [
        ("A.f", 3), ("A.f.g", 2), ("h", 2)]


def _runtime_names() -> Set[str]:
    """Every deploy format's name and runtime name, from the registry (lower case)."""
    from simattn import deploy
    return {n.lower() for fmt in deploy.formats().values() for n in (fmt.name, fmt.runtime)}


def _string_constants(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _string_constants(element)


def _runtime_name_tests(source: str, names: Set[str]) -> List[Tuple[int, str]]:
    """(line, code) of each comparison (``==``, ``!=``, ``in``, ``not in``, ``is``...) with a runtime name as a string
    constant on either side, alone or in a tuple/list/set literal; case-insensitive."""
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
            and any(c.lower() in names for side in (node.left, *node.comparators) for c in _string_constants(side))]


def test_no_runtime_name_tested_outside_deploy():
    """Which runtime runs a file is the deploy registry's business: code elsewhere asks a Format, it does not
    compare names."""
    names = _runtime_names()
    assert {"onnx", "onnxruntime", "executorch"} <= names
    found = {name: {code for _, code in tests} for name, path in _sources()
             if not name.startswith("simattn/deploy/") and (tests := _runtime_name_tests(path.read_text(), names))}
    assert found == {}


def test_the_runtime_name_check_finds_comparisons():
    names = {"onnx", "onnxruntime"}
    source = ('if fmt.name == "onnx" or r in ("cpu", "OnnxRuntime") or r != "torch":\n    pass\n'
              'x = {"onnx": 1}["onnx"]\n')
    assert _runtime_name_tests(source, names) == [(1, "fmt.name == 'onnx'"), (1, "r in ('cpu', 'OnnxRuntime')")]
