"""The layers point one way: models <- pipelines <- agent. A model worker process imports
`models/` (and `workers/`) alone, so neither may pull in the web server or the pipeline."""

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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


def test_models_import_nothing_from_the_layers_above():
    # Every module of models/: the Orpheus token server stand-in that tests run (a web server by
    # design) lives in the bench (latency_bench/components/orpheus_standins/dev_server.py).
    modules = _modules("models")
    assert len(modules) > 15
    assert _imported_layers(modules) == set()


def test_workers_import_neither_the_web_server_nor_the_pipeline():
    if not (ROOT / "workers").is_dir():
        raise AssertionError("workers/ package missing")
    assert _imported_layers(_modules("workers")) == set()


def test_transcription_imports_neither_the_web_server_nor_the_pipeline():
    assert _imported_layers(_modules("transcription")) == set()
