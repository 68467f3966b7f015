"""The package's layout holds: no import circle between modules, and imports only go down the layers
(attention → models → task packages → the command line)."""
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


def _imports(name: str, path: Path, is_package: bool, known) -> Set[str]:
    """The modules of ours that ``name`` imports anywhere in its file (lazy imports inside functions included)."""
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
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
             "attention": {"attention", "utils"},
             "models": {"attention", "models", "utils"},
             "data": {"data", "utils"},
             "deploy": {"deploy", "models", "utils"},
             "engine": {"engine", "data", "models", "attention", "utils"}}
    wrong = sorted(f"{name} imports {dep}" for name, deps in _graph().items() if _layer(name) in below
                   for dep in deps if dep.startswith("simattn.") and _layer(dep) not in below[_layer(name)])
    assert wrong == []


def _files_containing(text: str) -> List[str]:
    return sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if text in p.read_text())


def test_each_concern_has_one_home():
    from simattn.engine.core import Engine  # noqa: F401  DDP wrapping, AMP and loss scaling
    from simattn.engine.dist import init_distributed  # noqa: F401  process-group set-up
    from simattn.utils.recipe import load_recipe, command_parser, recipe_parser  # noqa: F401  recipes, parsers

    assert _files_containing("init_process_group(") == ["simattn/engine/dist.py"]
    assert _files_containing('"WORLD_SIZE"') == ["simattn/engine/dist.py"]
    assert _files_containing("DistributedDataParallel(") == ["simattn/engine/core.py"]
    assert _files_containing("GradScaler(") == ["simattn/engine/core.py"]
    assert _files_containing("argparse.ArgumentParser(") == ["simattn/utils/recipe.py"]
    assert set(_files_containing("yaml.safe_load(") + _files_containing("yaml.load(")) <= {
        "simattn/utils/values.py", "simattn/utils/recipe.py"}


def test_bench_model_is_a_package_of_short_modules():
    """``bench model``'s concerns each have a module (spec, runner, probes, workers, results, cli): no file over 900
    lines and no function over 80."""
    package = SRC / "simattn" / "bench" / "model"
    assert not (SRC / "simattn" / "bench" / "model.py").exists()
    assert {p.stem for p in package.glob("*.py")} == {"__init__", "spec", "runner", "probes", "workers", "results",
                                                      "cli"}
    long = []
    for path in package.glob("*.py"):
        text = path.read_text()
        if len(text.splitlines()) > 900:
            long.append(f"{path.name}: {len(text.splitlines())} lines")
        long += [f"{path.name}: {node.name} has {node.end_lineno - node.lineno + 1} lines"
                 for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.end_lineno - node.lineno + 1 > 80]
    assert long == []
