"""LLM on llama.cpp (llama-cpp-python): the embedded CPU default.

Chosen over transformers' GGUF loading because llama.cpp runs the Q4_1 weights as they
are (transformers dequantises to fp32) and keeps the prompt's KV cache between turns,
so on 2 cores first-token latency stays near 0.1 s for this model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from dataclasses import dataclass

from models.errors import ModelAssetError
from models.assets import resolve_local
from models.base import ChatMessage, LLMEngine, Sampling
from models.runner import ModelRunner, RunnerLoad

log = logging.getLogger(__name__)

HF_PREFIX = "hf:"


@dataclass(frozen=True)
class LlamaCppOptions:
    # "package:<name>", a local GGUF path, or "hf:<repo_id>/<filename>".
    model: str = "package:smollm2-135m-instruct"
    # The KV cache: system prompt + passages + history + reply. 4096 holds an agent prompt of
    # agents.max_prompt_chars (8,000) with the dialogue (pipelines/prompt_budget.py).
    context_tokens: int = 4096
    temperature: float = 0.3  # defaults; an agent's own sampling overrides them per request
    top_p: float = 0.9
    # Small models loop ("and the ocean, and the ocean, ..."); this keeps replies short and sane.
    repeat_penalty: float = 1.2
    threads: int = 2  # llama.cpp compute threads; more than the cores only adds contention

    @property
    def default_sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, repeat_penalty=self.repeat_penalty)


class LlamaCppLLMEngine(RunnerLoad, LLMEngine):
    def __init__(self, config: LlamaCppOptions, *, max_waiting: int = 16) -> None:
        self._config = config
        self.context_tokens = config.context_tokens
        self._llama = None
        self._runner = ModelRunner("llm", max_waiting=max_waiting)

    def load(self) -> None:
        from llama_cpp import Llama

        common = dict(n_ctx=self._config.context_tokens, n_threads=self._config.threads, verbose=False)
        reference = self._config.model
        if reference.startswith(HF_PREFIX):
            repo_id, _, filename = reference[len(HF_PREFIX) :].rpartition("/")
            if not repo_id or not filename:
                raise ModelAssetError(f"llm.model {reference!r} must look like hf:<org>/<repo>/<file.gguf>")
            self._llama = Llama.from_pretrained(repo_id=repo_id, filename=filename, **common)
            return
        path = resolve_local(reference)
        if path is None:
            raise ModelAssetError(f"llm.model {reference!r}: no such file; use a path, package:<name> or hf:<repo>/<file>")
        log.info("loading llama.cpp model %s", path)
        self._llama = Llama(model_path=str(path), **common)

    def warm_up(self) -> None:
        for _ in self._generate([{"role": "user", "content": "Hi"}], 2, threading.Event(), Sampling()):
            pass

    def stream_chat(self, messages: Sequence[ChatMessage], *, max_tokens: int,
                    sampling: Sampling | None = None) -> AsyncIterator[str]:
        snapshot = [dict(m) for m in messages]  # the context may change while we generate
        return self._runner.stream(lambda stop: self._generate(snapshot, max_tokens, stop, sampling or Sampling()))

    async def warm_prefix(self, messages: Sequence[ChatMessage], *,
                          on_progress: Callable[[], None] | None = None) -> None:  # no reports: not called
        snapshot = [dict(m) for m in messages]
        # One generated token evaluates the whole prefix; llama-cpp-python keeps its KV cache
        # and reuses the longest common token prefix on the next call.
        await self._runner.run(lambda: self._llama.create_chat_completion(messages=snapshot, max_tokens=1))

    def _generate(self, messages: list[ChatMessage], max_tokens: int, stop: threading.Event,
                  sampling: Sampling) -> Iterator[str]:
        if self._llama is None:
            raise RuntimeError("LlamaCppLLMEngine.load() was not called")
        chosen = sampling.over(self._config.default_sampling)
        chunks = self._llama.create_chat_completion(
            messages=messages,
            max_tokens=max_tokens,
            temperature=chosen.temperature,
            top_p=chosen.top_p,
            repeat_penalty=chosen.repeat_penalty,
            stream=True,
        )
        try:
            for chunk in chunks:
                if stop.is_set():
                    break
                piece = chunk["choices"][0]["delta"].get("content")
                if piece:
                    yield piece
        finally:
            chunks.close()  # stops llama.cpp's sampling loop now, not at max_tokens

    async def close(self) -> None:
        self._runner.shutdown()
        self._llama = None

