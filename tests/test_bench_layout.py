"""The bench's shape, read from its source with `ast` (nothing is imported): no import circles
inside latency_bench, one way in (`python -m latency_bench SUBCOMMAND`), one `Verdict`, and
a product that imports nothing of the bench."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "latency_bench"
PRODUCT = ("agent", "pipelines", "models", "knowledge", "workers", "transcription")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(package: str) -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted((ROOT / package).rglob("*.py"))}


def _imported(tree: ast.Module, known: set[str]) -> set[str]:
    """The modules of `known` that `tree` imports anywhere (at the top or inside a function).
    `from a import b` counts as importing a.b where a.b is a module, and a otherwise."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    return found & known


def import_graph(package: str = "latency_bench") -> dict[str, set[str]]:
    trees = _sources(package)
    known = set(trees)
    return {name: _imported(tree, known) - {name} for name, tree in trees.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of `graph`, each a set of nodes that reach one another."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert sorted(map(sorted, strongly_connected(graph))) == [["a", "b", "c"], ["d"]]


def test_no_import_circles_inside_the_bench():
    graph = import_graph()
    assert len(graph) > 50
    circles = [sorted(c) for c in strongly_connected(graph) if len(c) > 1]
    assert circles == []


def _own_flags() -> dict[str, tuple[str, str]]:
    """latency_bench.cli.OWN_FLAGS, read from the source."""
    for node in ast.parse((BENCH / "cli.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "OWN_FLAGS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("latency_bench/cli.py has no OWN_FLAGS table")


def _runs_as_main(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


def _defines_main(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)


def test_one_way_in():
    trees = _sources("latency_bench")
    # latency_bench/__main__.py is `python -m latency_bench`; no other module runs as a script.
    assert "latency_bench.__main__" in trees
    assert [name for name, tree in trees.items() if _runs_as_main(tree)] == []
    own_flags = {module for module, _what in _own_flags().values()}
    assert own_flags <= set(trees)
    assert all(_defines_main(trees[module]) for module in own_flags)
    # Every bench module with a main() of its own is a subcommand, none a way in apart.
    with_main = {name for name, tree in trees.items() if _defines_main(tree)} - {"latency_bench.cli"}
    assert with_main == own_flags


def test_the_product_imports_nothing_of_the_bench():
    for package in PRODUCT:
        trees = _sources(package)
        for name, tree in trees.items():
            imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
            imported |= {node.module for node in ast.walk(tree)
                         if isinstance(node, ast.ImportFrom) and node.module and not node.level}
            assert not {m for m in imported if m.split(".")[0] == "latency_bench"}, name


def test_one_verdict_for_every_chaos_scenario():
    trees = _sources("latency_bench")
    verdicts = [name for name, tree in trees.items()
                for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Verdict"]
    assert verdicts == ["latency_bench.chaos.verdict"]
    judges = {}
    for name, tree in trees.items():
        if name.startswith("latency_bench.chaos."):
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and node.name.startswith("judge"):
                    judges[f"{name}.{node.name}"] = ast.unparse(node.returns) if node.returns else None
    # the fifteen scenario modules; admission judges two scenarios (handshake, admission), network two (lossy, blackhole)
    assert len(judges) == 17
    assert {judge for judge, returns in judges.items() if returns != "Verdict"} == set()
    assert not [name for name in judges if name.startswith("latency_bench.chaos.suite.")]
