"""Where Orpheus audio tokens come from: an OpenAI-compatible streaming completions server.

vLLM, TensorRT-LLM's `trtllm-serve` and other OpenAI-compatible servers stream the
completion as text; Orpheus' audio tokens are added tokens named `<custom_token_N>`
(id 128256 + N), which appear in that text when special tokens are not skipped.

The prompt goes as token ids (`prompt_format="token_ids"`, vLLM and trtllm-serve), so no
tokenizer runs here and none can disagree with the server's. Servers whose completions
endpoint takes only text (llama.cpp's, LM Studio) get `prompt_format="text"`: the same
ids rendered back to text, control tokens by name (`<custom_token_3>`, `<|eot_id|>`),
which such servers tokenize back into the same ids; they add the BOS themselves.
Closing the stream (barge-in) closes the HTTP response; the servers above abort a
request whose client went away, freeing its batch slot.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

from models.errors import CadenceError
from models.http_send import send_detached
from models.orpheus.tokens import CUSTOM_TOKEN_BASE, END_OF_SPEECH

BEGIN_OF_TEXT = 128000
_LLAMA3_CONTROL_TEXT = {128001: "<|end_of_text|>", 128009: "<|eot_id|>"}
PROMPT_FORMATS = ("token_ids", "text")
_TAG = re.compile(r"<custom_token_(\d+)>")
_MAX_PARTIAL_TAG = len("<custom_token_1000000>")


@dataclass(frozen=True)
class OrpheusSampling:
    """Orpheus' published sampling defaults; repetition penalty >= 1.1 keeps it from looping."""

    temperature: float = 0.6
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    # 2048 tokens = 292 frames = 25 s of audio: a sentence request never reaches the ~30 s
    # where Orpheus' quality falls, and a runaway generation ends.
    max_tokens: int = 2048

    def __post_init__(self) -> None:
        if not (0 < self.temperature <= 2 and 0 < self.top_p <= 1 and 1 <= self.repetition_penalty <= 2
                and 7 <= self.max_tokens <= 8192):
            raise ValueError(f"sampling parameters out of range: {self}")


class TokenSourceError(CadenceError):
    """The token server failed or answered with something that is not a completion stream."""


class CustomTokenParser:
    """Streamed completion text -> token ids, across chunk boundaries that split a tag."""

    def __init__(self) -> None:
        self._rest = ""
        self.ignored_chars = 0  # text that was not an audio token (whitespace, stray words)

    def feed(self, text: str) -> list[int]:
        text = self._rest + text
        ids, end = [], 0
        for match in _TAG.finditer(text):
            self.ignored_chars += len(text[end : match.start()].strip())
            ids.append(CUSTOM_TOKEN_BASE + int(match.group(1)))
            end = match.end()
        tail = text[end:]
        cut = tail.rfind("<")
        if cut >= 0 and len(tail) - cut < _MAX_PARTIAL_TAG and ">" not in tail[cut:]:
            self.ignored_chars += len(tail[:cut].strip())
            self._rest = tail[cut:]  # maybe the start of a tag: wait for the next chunk
        else:
            self.ignored_chars += len(tail.strip())
            self._rest = ""
        return ids


def prompt_as_text(prompt_ids: list[int], decode: Callable[[list[int]], str]) -> str:
    """Prompt ids as text a text-prompt server tokenizes back into them: control tokens by
    name, runs of ordinary ids through `decode`, and no BOS (the server adds its own)."""
    pieces, run = [], []
    for token in prompt_ids:
        name = f"<custom_token_{token - CUSTOM_TOKEN_BASE}>" if token >= CUSTOM_TOKEN_BASE \
            else _LLAMA3_CONTROL_TEXT.get(token)
        if name is None and token != BEGIN_OF_TEXT:
            run.append(token)
            continue
        if run:
            pieces.append(decode(run))
            run = []
        if name is not None:
            pieces.append(name)
    if run:
        pieces.append(decode(run))
    return "".join(pieces)


class OpenAICompletionsTokenSource:
    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, connect_timeout_s: float = 5.0,
                 read_timeout_s: float = 30.0, client: httpx.AsyncClient | None = None,
                 prompt_format: str = "token_ids", decode: Callable[[list[int]], str] | None = None) -> None:
        """`decode` (ordinary token ids -> text) is needed for prompt_format="text"."""
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format {prompt_format!r}: use one of {PROMPT_FORMATS}")
        if prompt_format == "text" and decode is None:
            raise ValueError('prompt_format="text" needs the tokenizer\'s decode')
        self._url = base_url.rstrip("/") + "/completions"
        self._model = model
        self._prompt_format = prompt_format
        self._decode = decode
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s))

    def request_body(self, prompt_ids: list[int], sampling: OrpheusSampling) -> dict:
        prompt = prompt_ids if self._prompt_format == "token_ids" else prompt_as_text(prompt_ids, self._decode)
        return {
            "model": self._model, "prompt": prompt, "stream": True, "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "repetition_penalty": sampling.repetition_penalty,  # vLLM/TRT-LLM extension; llama.cpp: repeat_penalty
            "repeat_penalty": sampling.repetition_penalty,
            "stop_token_ids": [END_OF_SPEECH], "skip_special_tokens": False,
        }

    async def stream(self, prompt_ids: list[int], sampling: OrpheusSampling = OrpheusSampling()
                     ) -> AsyncIterator[list[int]]:
        """Token ids as the server generates them; ends at end of speech or the server's end."""
        parser = CustomTokenParser()
        try:
            request = self._client.build_request("POST", self._url, json=self.request_body(prompt_ids, sampling),
                                                 headers=self._headers)
            response = await send_detached(self._client, request, stream=True)  # a barge-in leaks no connection
            try:
                if response.status_code != 200:
                    body = (await response.aread())[:300].decode(errors="replace")
                    raise TokenSourceError(f"token server answered {response.status_code}: {body}")
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    ids = parser.feed(_choice_text(data))
                    if ids:
                        yield ids
            finally:
                await response.aclose()
        except httpx.HTTPError as exc:
            raise TokenSourceError(f"token server at {self._url} failed: {exc.__class__.__name__}: {exc}") from exc

    async def close(self) -> None:
        await self._client.aclose()


def _choice_text(data: str) -> str:
    try:
        event = json.loads(data)
        return event["choices"][0].get("text") or ""
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise TokenSourceError(f"not a completions stream event: {data[:200]!r}") from exc
