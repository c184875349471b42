"""`cadence ingest NAME PATH...`: uploads documents to a running server's agent.

Each file goes up in a request of its own, so one bad file does not hold back the rest;
folders are walked for the supported extensions. Large files become background jobs on
the server, followed here with a progress bar until they finish. One line per file says
`ok` or the server's error; the exit code is 1 if any file failed.
"""

from __future__ import annotations

import mimetypes
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

from knowledge.documents import EXTENSIONS

UPLOAD_TIMEOUT_S = 300.0  # a 10 MiB document embedded within its request takes minutes on 2 cores
POLL_INTERVAL_S = 0.5
JOB_TIMEOUT_S = 3600.0  # give up following a job after this long (it goes on on the server)


def collect(paths: Iterable[str | Path]) -> tuple[list[Path], list[str]]:
    """(supported files, in order, folders walked and sorted; paths that do not exist)."""
    files: list[Path] = []
    missing: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in EXTENSIONS))
        elif path.is_file():
            files.append(path)  # named explicitly: the server says if its type is unsupported
        else:
            missing.append(str(raw))
    return files, missing


def ingest(base_url: str, agent: str, paths: Sequence[str | Path], *, progress: bool = True,
           client: httpx.Client | None = None, poll_interval_s: float = POLL_INTERVAL_S,
           headers: dict[str, str] | None = None) -> int:
    """Uploads every file; returns the exit code (0: all stored, 1: any failed or none found)."""
    files, missing = collect(paths)
    for path in missing:
        print(f"failed  {path}: no such file or folder")
    if not files:
        if not missing:
            print(f"no documents found (supported: {' '.join(sorted(EXTENSIONS))})")
        return 1
    http = client or httpx.Client(base_url=base_url, timeout=UPLOAD_TIMEOUT_S, headers=headers)
    try:
        results = [_upload(http, agent, path, progress, poll_interval_s) for path in files]
    finally:
        if client is None:
            http.close()
    return 0 if all(results) and not missing else 1


def _upload(http: httpx.Client, agent: str, path: Path, progress: bool, poll_interval_s: float) -> bool:
    content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    try:
        with path.open("rb") as data:
            response = http.post(f"/api/agents/{agent}/knowledge", files={"file": (path.name, data, content_type)})
        if response.status_code == 202:
            return _follow(http, response.headers["location"], path, progress, poll_interval_s)
    except (httpx.HTTPError, OSError) as exc:
        print(f"failed  {path}: {exc.__class__.__name__}: {exc or 'no answer from the server'}")
        return False
    if response.status_code != 201:
        print(f"failed  {path}: {_error_text(response)}")
        return False
    _print_stored(path, response.json()["documents"][0])
    return True


def _follow(http: httpx.Client, location: str, path: Path, progress: bool, poll_interval_s: float) -> bool:
    bar = _Bar(path.name, progress)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    try:
        while True:
            response = http.get(location)
            if response.status_code != 200:
                print(f"failed  {path}: {_error_text(response)}")
                return False
            job = response.json()["job"]
            bar.update(job["chunks_done"], job["chunks_total"])
            if job["status"] in ("done", "failed"):
                break
            if time.monotonic() > deadline:
                print(f"failed  {path}: still ingesting after {JOB_TIMEOUT_S:.0f} s; see {location}")
                return False
            time.sleep(poll_interval_s)
    finally:
        bar.close()
    if job["status"] == "failed":
        print(f"failed  {path}: {job['error']}")
        return False
    _print_stored(path, job["files"][0]["document"])
    return True


def _print_stored(path: Path, document: dict[str, Any]) -> None:
    note = " (already stored)" if document.get("duplicate") else ""
    print(f"ok      {path}: {document['chunk_count']} chunks, id {document['id']}{note}")


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        message = body["error"] + (" (retry later)" if body.get("retryable") else "")
    except (ValueError, KeyError, TypeError):
        message = response.text[:200] or response.reason_phrase
    return f"{response.status_code} {message}"


class _Bar:
    """tqdm when it is installed (the bench extra) and wanted; otherwise nothing."""

    def __init__(self, name: str, enabled: bool) -> None:
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=0, unit="chunk", desc=name, file=sys.stderr, leave=False)

    def update(self, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.total = total
            self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
