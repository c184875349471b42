"""Servers the bench starts itself: Cadence, and the stock-pipecat baseline with its LLM server.

Each runs as a child process on a free loopback port, logs to a file in the output
folder, and is stopped (SIGTERM, then SIGKILL) when the `with` block ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import yaml

from agent.config import load_config
from models.assets import default_cache_dir, resolve_local
from workers.binaries import find_binary
from workers.ports import free_port

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "configs" / "default.yaml"
STOP_GRACE_S = 10.0


@contextlib.contextmanager
def child(argv: list[str], log_path: Path, ready_url: str, *, timeout_s: float = 300.0,
          environ: Mapping[str, str] | None = None) -> Iterator[str]:
    """Starts `argv`, waits until `ready_url` answers 200, yields it; always stops the process.
    `environ`: variables set for the child on top of this process's (secrets stay out of files)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **environ} if environ else None
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=env)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{argv[2] if len(argv) > 2 else argv[0]} exited with {process.returncode}; "
                                   f"see {log_path}")
            try:
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ready_url} not ready within {timeout_s:.0f} s; see {log_path}")
            time.sleep(0.5)
        yield ready_url
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL if it is still there STOP_GRACE_S later."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def write_bench_config(out: Path, config: Path, *, max_calls: int, deployment: str | None = None,
                       schedule: str | None = None, settings: Sequence[str] = ()) -> Path:
    """`config` with the bench's settings over it, written into `out` (see `cadence`).
    `settings`: KEY=VALUE pairs, dotted keys into the config, YAML values (asr.partial_every_s=0.5)."""
    data = yaml.safe_load(config.read_text()) or {}
    for setting in settings:
        key, sep, raw = setting.partition("=")
        if not sep or not key:
            raise ValueError(f"--set takes KEY=VALUE, not {setting!r}")
        *parents, leaf = key.split(".")
        section = data
        for name in parents:
            section = section.setdefault(name, {})
        section[leaf] = yaml.safe_load(raw)
    if deployment is not None:
        data["deployment"] = None if deployment == "none" else deployment
    data.setdefault("server", {})["max_concurrent_calls"] = max_calls
    if schedule is not None:
        data["server"]["schedule"] = schedule
    data.setdefault("store", {})["path"] = str(out / "cadence-bench.sqlite3")
    path = out / "cadence-bench.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@contextlib.contextmanager
def cadence(out: Path, *, max_calls: int, config: Path = DEFAULT_CONFIG, deployment: str | None = None,
            schedule: str | None = None, settings: Sequence[str] = (),
            agent_files: tuple[Path, ...] = (), log_level: str = "warning",
            environ: Mapping[str, str] | None = None, host: str = "127.0.0.1",
            insecure: bool = False) -> Iterator[str]:
    """Cadence's own server on `config`, admitting `max_calls` calls, with a store in `out`.
    `deployment`: a deployment file, or "none" for every model in-process (None: the config's).
    `schedule`: server.schedule (None: the config's). `settings`: KEY=VALUE overrides.
    `agent_files`: agents created through the API once it is ready (the bench's own agents).
    `log_level`: the server's, into out/cadence.log. `environ`: set for the server (API keys).
    `host`: the address it listens on (a caller network's host end: latency_bench/chaos/netns.py);
    `insecure`: serve it without API keys (the server refuses to otherwise, off loopback)."""
    out.mkdir(parents=True, exist_ok=True)
    bench_config = write_bench_config(out, config, max_calls=max_calls, deployment=deployment, schedule=schedule,
                                      settings=settings)
    port = free_port(host)
    base_url = f"http://{host}:{port}"
    with child([sys.executable, "-m", "agent.cli", "serve", "--config", str(bench_config), "--host", host,
                "--port", str(port), "--log-level", log_level, *(["--insecure"] if insecure else [])],
               out / "cadence.log",
               f"{base_url}/readyz", environ=environ):
        for agent_file in agent_files:
            spec = yaml.safe_load(Path(agent_file).read_text())
            created = httpx.post(f"{base_url}/api/agents", json=spec, timeout=30)
            if created.status_code == 409:  # left in the store by an earlier run into the same folder
                created = httpx.put(f"{base_url}/api/agents/{spec['name']}", json=spec, timeout=30)
            if created.status_code not in (200, 201):
                raise RuntimeError(f"agent {agent_file} was refused: {created.status_code} {created.text[:300]}")
        yield base_url


@contextlib.contextmanager
def stock_pipecat(out: Path, *, turn_stop: str = "smart-turn", stop_secs: float = 0.4) -> Iterator[str]:
    """llama.cpp's own OpenAI-compatible server on the same GGUF, as a user of stock pipecat
    would start it (one slot, the defaults otherwise), and the stock pipeline on it."""
    cadence_config = load_config(DEFAULT_CONFIG)
    gguf = resolve_local(cadence_config.llm.model, default_cache_dir())
    binary = find_binary("llama-server")
    if binary is None:
        raise RuntimeError("llama-server is not built; run `make llama-server`")
    out.mkdir(parents=True, exist_ok=True)
    llm_port, port = free_port(), free_port()
    llm_argv = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(llm_port),
                "-c", str(cadence_config.llm.context_tokens), "--threads", str(cadence_config.llm.threads),
                "--parallel", "1", "--alias", "smollm2", "--no-webui"]
    with child(llm_argv, out / "stock-llm.log", f"http://127.0.0.1:{llm_port}/v1/models"):
        with child([sys.executable, "-m", "latency_bench", "stock-pipecat", "--port", str(port),
                    "--llm-url", f"http://127.0.0.1:{llm_port}/v1", "--turn-stop", turn_stop,
                    "--stop-secs", str(stop_secs)], out / "stock-pipecat.log", f"http://127.0.0.1:{port}/readyz"):
            yield f"http://127.0.0.1:{port}"
