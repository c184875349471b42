"""The layers point one way:

    models <- pipelines, workers, knowledge, transcription <- agent <- latency_bench

models/ imports none of the others; the four middle packages import models/ alone (not each
other); agent/ imports anything below it; the bench imports the product, and nothing in the
product imports the bench or the tests. A model worker process imports `models/` (and
`workers/`) alone, so neither may pull in the web server or the pipeline.

Checked twice: statically, from every module's own `import` statements (those inside
functions too, so a late import cannot hide an edge), and at run time, by importing a
package's modules in a fresh interpreter (which also catches an edge through a third party).
Inside the product and inside the bench, no two modules import each other, directly or round a
circle.
"""

import ast
import functools
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Each package and the packages of ours it may import.
BASE = {"models"}
MIDDLE = {"pipelines", "workers", "knowledge", "transcription"}
MAY_IMPORT = {
    "models": set(),
    **{package: BASE for package in MIDDLE},
    "agent": BASE | MIDDLE,
    "latency_bench": BASE | MIDDLE | {"agent"},
}
OURS = set(MAY_IMPORT) | {"tests"}
PRODUCT = ("models", "pipelines", "workers", "knowledge", "transcription", "agent")
CIRCLE_FREE = (*PRODUCT, "latency_bench")


def _module_files(packages) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `packages` (a package is its __init__)."""
    modules = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


@functools.cache
def _imported_names(module: str, path: Path) -> frozenset[str]:
    """Every dotted name `module` imports, wherever the import statement is: at the top, inside
    a function, under `if TYPE_CHECKING`. For `from a.b import c`, both `a.b` and `a.b.c`
    (c may be a submodule). Relative imports resolved."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(names)


def _module_graph(packages) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports."""
    modules = _module_files(packages)
    graph = {}
    for module, path in modules.items():
        targets = set()
        for name in _imported_names(module, path):
            while name and name not in modules:  # `a.b.c` where c is a name in module a.b
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, without recursion)."""
    index, low, on_stack, stack, circles = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def _a_cycle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One path round the circle, start to start, for the failure message."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back to the start
        following = []
        for node in frontier:
            for target in sorted(graph[node] & members):
                if target == start:
                    return paths[node] + [start]
                if target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    return component


def test_every_package_imports_only_the_layers_below_it():
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for module, path in _module_files([package]).items():
            for name in sorted(_imported_names(module, path)):
                top = name.split(".")[0]
                if top in OURS and top != package and top not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert sorted(set(wrong)) == []


def test_no_module_of_the_product_or_the_bench_imports_another_round_a_circle():
    graph = _module_graph(CIRCLE_FREE)
    assert len(graph) > 150  # the walk found the product and the bench
    assert [" -> ".join(_a_cycle_through(c, graph)) for c in _circles(graph)] == []


def test_the_import_checks_see_late_imports_and_name_a_circle(tmp_path):
    # The checks above pass on the tree as it is; this shows they would fail on a bad one.
    (tmp_path / "late.py").write_text("def f():\n    from agent.config import CadenceConfig\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from . import a\n")
    assert "agent.config" in _imported_names("late", tmp_path / "late.py")
    assert "pkg.a" in _imported_names("pkg", tmp_path / "pkg" / "__init__.py")
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _a_cycle_through(["a", "b", "c"], graph) == ["a", "b", "c", "a"]


def _modules(package: str) -> list[str]:
    names = [package]
    for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
        names.append(info.name)
    return names


def _imported_layers(modules: list[str]) -> set[str]:
    """Imports the modules in a fresh interpreter; returns the top-level packages above them."""
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'agent', 'pipelines', 'fastapi', 'pipecat'})))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


@pytest.mark.slow
def test_models_import_nothing_from_the_layers_above():
    # Every module of models/: the Orpheus token server stand-in that tests run (a web server by
    # design) lives in the bench (latency_bench/components/orpheus_standins/dev_server.py).
    modules = _modules("models")
    assert len(modules) > 15
    assert _imported_layers(modules) == set()


@pytest.mark.slow
def test_workers_import_neither_the_web_server_nor_the_pipeline():
    if not (ROOT / "workers").is_dir():
        raise AssertionError("workers/ package missing")
    assert _imported_layers(_modules("workers")) == set()


def test_transcription_imports_neither_the_web_server_nor_the_pipeline():
    assert _imported_layers(_modules("transcription")) == set()


@pytest.mark.slow  # imports pipecat and every stage: seconds
def test_pipelines_import_nothing_of_the_server():
    assert "agent" not in _imported_layers(_modules("pipelines"))
