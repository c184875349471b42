"""Where the native servers a plan starts are found.

`make setup` builds llama.cpp's `llama-server` into a cache
(~/.cache/cadence/bin/llama-server-<version>), so it survives `rm -rf .venv` and fresh
clones. An operator may point at their own build instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def bin_cache() -> Path:
    return Path(os.environ.get("CADENCE_BIN_CACHE") or Path.home() / ".cache" / "cadence" / "bin")


def find_binary(name: str) -> str | None:
    """`CADENCE_<NAME>` (e.g. CADENCE_LLAMA_SERVER=/opt/llama-server), then the newest cached
    build of `name`, then PATH. None when there is none."""
    override = os.environ.get("CADENCE_" + name.upper().replace("-", "_"))
    if override:
        return override if os.access(override, os.X_OK) else None
    cached = sorted(bin_cache().glob(f"{name}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in cached:
        if path.is_file() and os.access(path, os.X_OK) and not path.name.endswith(".tmp"):
            return str(path)
    return shutil.which(name)
