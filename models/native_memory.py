"""Freed native memory back to the operating system (glibc's `malloc_trim`).

glibc keeps freed heap for reuse, and how much it keeps after a burst of large native
allocations (an ONNX session's tensors for one long sentence) depends on the order they were
freed in: 50 Piper sentences without ONNX Runtime's arena (tests/test_piper_tts.py's measure)
left anything from -7 to +102 MB behind, and with a trim after each, under +1 MB. A no-op where the C library has no trim
(musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util


def _load_malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _load_malloc_trim()


def trim_native_heap() -> None:
    """Returns the C heap's free pages to the OS. Thread-safe (glibc locks each arena). It walks
    the heap and the pages it returns must be faulted in again on the next use, so it belongs
    after a unit of heavy work, not inside one (its cost is in latency_bench.components.tts_memory's CPU
    figure for the voice without its arena)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
