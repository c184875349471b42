"""The bench's shape, read from its source with `ast` (nothing is imported): one way in
(`python -m latency_bench SUBCOMMAND`) and one `Verdict`. That it has no import circles and
that the product imports nothing of it are tests/test_layering.py's checks, with every
package's."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "latency_bench"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(package: str) -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted((ROOT / package).rglob("*.py"))}


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
