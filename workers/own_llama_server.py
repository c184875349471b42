"""The LLM without a deployment: a llama.cpp `llama-server` of this process's own.

Where no deployment places the LLM (`llm.engine: llama-server`, the tests' embedded engines,
the bench's one-process runs), the engine starts llama.cpp's server on a free loopback port
in `load()`, talks to it as any deployment's LLM worker (models/openai_chat.py) and stops it
in `close()`. One llama.cpp build serves every path (`make setup` builds the server alone):
the same continuous batching, per-slot prompt cache and progress reports as the deployed
worker, with the same flags (workers/launch.py).

Unlike a deployment's worker it is not restarted when it dies: the calls then hear the
LLM's apology at their deadlines, and /api/health shows the server refusing connections.
Production runs the LLM under the supervisor (configs/deployments/cpu.yaml).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from models.base import ChatMessage, LLMEngine, Sampling
from models.errors import ConfigError, ModelAssetError, WorkerUnavailableError
from models.openai_chat import OpenAIChatLLMEngine, OpenAIChatOptions
from workers.binaries import find_binary
from workers.deployment import Precision, WorkerSpec
from workers.launch import LaunchSite, build_launch
from workers.ports import free_port
from workers.supervisor import die_with_parent

log = logging.getLogger(__name__)

HF_PREFIX = "hf:"
LOOPBACK = "127.0.0.1"
# The server reads the GGUF and warms itself up before /health answers 200: ~1 s for
# SmolLM2-135M here, tens of seconds for a 7B model read from a cold disk.
READY_TIMEOUT_S = 120.0
READY_POLL_S = 0.05
STOP_GRACE_S = 5.0
LOG_TAIL_CHARS = 2000  # of the server's own output, in the error when it fails to start


@dataclass(frozen=True)
class LlamaServerOptions:
    # "package:<name>", a local GGUF path, or "hf:<repo_id>/<filename>" (fetched once into the
    # Hugging Face cache; needs the hub, so never on an offline host).
    model: str = "package:smollm2-135m-instruct"
    # The KV cache per slot: system prompt + passages + history + reply. 4096 holds an agent
    # prompt of agents.max_prompt_chars (8,000) with the dialogue (pipelines/prompt_budget.py).
    context_tokens: int = 4096
    temperature: float = 0.3  # defaults; an agent's own sampling overrides them per request
    top_p: float = 0.9
    # Small models loop ("and the ocean, and the ocean, ..."); this keeps replies short and sane.
    repeat_penalty: float = 1.2
    threads: int = 2  # llama.cpp compute threads; more than the cores only adds contention
    # Conversations the server decodes side by side (llama-server --parallel), each with a
    # slot of context_tokens; past them a reply waits at the server for a free slot.
    slots: int = 4

    @property
    def default_sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, repeat_penalty=self.repeat_penalty)


def resolve_gguf(reference: str) -> Path:
    """The GGUF file `reference` names; ModelAssetError saying how to name one otherwise."""
    from models.assets import resolve_local

    if reference.startswith(HF_PREFIX):
        repo_id, _, filename = reference[len(HF_PREFIX):].rpartition("/")
        if not repo_id or not filename:
            raise ModelAssetError(f"llm.model {reference!r} must look like hf:<org>/<repo>/<file.gguf>")
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id=repo_id, filename=filename))
    path = resolve_local(reference)
    if path is None:
        raise ModelAssetError(f"llm.model {reference!r}: no such file; use a path, package:<name> or hf:<repo>/<file>")
    return path


def server_argv(options: LlamaServerOptions, gguf: Path, port: int) -> tuple[str, ...]:
    """The same command line a deployment's llama-server worker gets (workers/launch.py)."""
    spec = WorkerSpec(name="llm", role="llm", engine="llama-server", model=str(gguf), threads=options.threads,
                      max_streams=options.slots, context_tokens_per_stream=options.context_tokens,
                      precision=Precision(kv_cache="f16"))
    site = LaunchSite(spec=spec, name="llm", device="cpu", device_memory_gb=None, env={}, host=LOOPBACK, port=port,
                      deployment_source="")
    return build_launch(site, find_binary=find_binary, resolve_model=lambda model: Path(model)).argv


class OwnLlamaServerLLMEngine(LLMEngine):
    """An LLMEngine whose llama-server is a child of this process (see the module's docstring)."""

    reports_prompt_progress = True  # llama-server's `return_progress`

    def __init__(self, options: LlamaServerOptions, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.context_tokens = options.context_tokens
        self._clock = clock
        self._process: subprocess.Popen | None = None
        self._log_dir: Path | None = None
        self._client: OpenAIChatLLMEngine | None = None

    @property
    def base_url(self) -> str | None:
        return None if self._client is None else self._client.options.base_url

    @property
    def queue_depth(self) -> int:
        return 0 if self._client is None else self._client.queue_depth

    @property
    def batch_size(self) -> int | None:
        return None if self._client is None else self._client.batch_size

    def health(self) -> dict[str, Any]:
        return super().health() if self._client is None else self._client.health()

    def load(self) -> None:
        """Starts the server and returns once it answers /health (blocking)."""
        if self._client is not None:
            return
        port = free_port(LOOPBACK)
        argv = server_argv(self.options, resolve_gguf(self.options.model), port)
        self._log_dir = Path(tempfile.mkdtemp(prefix="cadence-llama-server-"))
        with open(self._log_dir / "llama-server.log", "wb") as output:
            self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                                             start_new_session=True, preexec_fn=die_with_parent)
        base_url = f"http://{LOOPBACK}:{port}"
        log.info("llama-server started (pid %d) at %s", self._process.pid, base_url)
        try:
            self._wait_ready(base_url)
        except BaseException:
            self._stop_process()
            raise
        self._client = OpenAIChatLLMEngine(OpenAIChatOptions(
            base_url=base_url, dialect="llama-server", default_sampling=self.options.default_sampling,
            context_tokens=self.options.context_tokens))
        self._client.load()

    def _wait_ready(self, base_url: str) -> None:
        deadline = self._clock() + READY_TIMEOUT_S
        while self._clock() < deadline:
            if self._process.poll() is not None:
                raise WorkerUnavailableError(f"llama-server exited with {self._process.returncode} before it was "
                                             f"ready: {self._log_tail()}")
            try:
                if httpx.get(f"{base_url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(READY_POLL_S)
        raise WorkerUnavailableError(f"llama-server was not ready within {READY_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        if self._log_dir is None:
            return ""
        text = (self._log_dir / "llama-server.log").read_text(errors="replace")
        return text[-LOG_TAIL_CHARS:].strip() or "(it printed nothing)"

    def stream_chat(self, messages: Sequence[ChatMessage], *, max_tokens: int,
                    sampling: Sampling | None = None) -> AsyncIterator[str]:
        return self._loaded().stream_chat(messages, max_tokens=max_tokens, sampling=sampling)

    async def warm_prefix(self, messages: Sequence[ChatMessage], *,
                          on_progress: Callable[[], None] | None = None) -> None:
        await self._loaded().warm_prefix(messages, on_progress=on_progress)

    def _loaded(self) -> OpenAIChatLLMEngine:
        if self._client is None:
            raise RuntimeError("OwnLlamaServerLLMEngine.load() was not called")
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        await asyncio.to_thread(self._stop_process)

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("llama-server (pid %d) ignored SIGTERM; killing it", process.pid)
                process.kill()
                process.wait()
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

