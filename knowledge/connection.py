"""Opening the knowledge database with sqlite-vec loaded, on any Python build."""

from __future__ import annotations

import ctypes
import functools
import os
import sqlite3

from knowledge.errors import KnowledgeSchemaError


def connect(path: str, *, timeout: float) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit) with sqlite-vec loaded.

    Python built without loadable extensions (pyenv's default) has no
    `enable_load_extension`; then sqlite-vec is registered as an auto-extension of the
    libsqlite3 that `_sqlite3` itself uses. Never a second SQLite copy (pysqlite3): two
    copies in one process break each other's POSIX locks on the same file."""
    loadable = hasattr(sqlite3.Connection, "enable_load_extension")
    if not loadable:
        _register_sqlite_vec()
    db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    try:
        if loadable:
            import sqlite_vec

            db.enable_load_extension(True)
            try:
                sqlite_vec.load(db)
            finally:
                db.enable_load_extension(False)
        db.execute("SELECT vec_version()")
    except (sqlite3.Error, AttributeError) as exc:
        db.close()
        raise KnowledgeSchemaError(f"sqlite-vec could not be loaded ({exc}); reinstall sqlite-vec") from None
    return db


@functools.cache  # one registration per process: it applies to every later connection
def _register_sqlite_vec() -> None:
    import _sqlite3

    import sqlite_vec

    base = sqlite_vec.loadable_path()
    path = next((base + s for s in ("", ".so", ".dylib", ".dll") if os.path.isfile(base + s)), base)
    try:
        library = ctypes.CDLL(_sqlite3.__file__)  # its symbols resolve to the libsqlite3 it links
        init = ctypes.CDLL(path).sqlite3_vec_init
        code = library.sqlite3_auto_extension(ctypes.cast(init, ctypes.c_void_p))
    except (OSError, AttributeError) as exc:
        raise KnowledgeSchemaError(f"sqlite-vec could not be registered ({exc}); use a Python whose "
                                   "sqlite3 can load extensions") from None
    if code != 0:
        raise KnowledgeSchemaError(f"sqlite3_auto_extension failed with code {code}")


