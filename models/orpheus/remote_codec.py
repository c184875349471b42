"""The SNAC codec as a worker at the other end of a WebSocket (see codec_wire for the format).

The Orpheus voice cannot tell it from the in-process decode service: the same `SnacCodec`
surface and the same errors as the other remote engines (models/remote.py):
  a full or still-loading worker, or one that refuses a request as retryable
                                   -> CapacityError: this sentence falls back or is shed
  refused or reset connections, no answer within `read_timeout_s`, a worker that dies
  mid-stream                      -> WorkerUnavailableError, naming the worker's URL
  any other refusal               -> CadenceError with the worker's message
A stream is one connection, opened at its first request; `release` closes it, and the
worker frees the stream's decoder state. With several replicas (models/replicas.py), each
new stream goes to the replica with the fewest of this client's streams open; one that
refuses the connection cools off, and the stream opens once more on another. A stream
never moves after its first request: its state is in that worker.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from models.errors import CadenceError, CapacityError, ConfigError, WorkerUnavailableError
from models.orpheus.codec_wire import (
    FINAL, FLUSH, PATH, STEP, TRY_AGAIN_LATER, WINDOW, CodecRequest, CodecWireError, decode_audio, encode_request)
from models.orpheus.tokens import SAMPLE_RATE
from models.remote import RemoteOptions, WorkerClient

_MAX_ANSWER_BYTES = 4 << 20  # the largest answer: a few seconds of float32 audio


@dataclass(frozen=True)
class RemoteCodecOptions:
    connect_timeout_s: float = 1.0  # a worker that does not take the connection by then counts as down
    read_timeout_s: float = 5.0  # one request's answer; a worker silent for longer counts as stuck
    ready_timeout_s: float = 2.0  # load(): how long /readyz may take

    def __post_init__(self) -> None:
        if min(self.connect_timeout_s, self.read_timeout_s, self.ready_timeout_s) <= 0:
            raise ValueError("codec client timeouts must be > 0")


@dataclass(eq=False)
class RemoteCodecStream:
    url: str  # the replica holding this stream's state
    next_sample: int = 0  # see models.orpheus.codec.CodecStream
    connection: ClientConnection | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class RemoteSnacCodec:
    def __init__(self, urls: str | Sequence[str], options: RemoteCodecOptions = RemoteCodecOptions()) -> None:
        # The HTTP side our other workers' clients use: URL checks, readiness, the replica choice.
        self._workers = WorkerClient(urls, "codec", RemoteOptions(connect_timeout_s=options.connect_timeout_s,
                                                                  ready_timeout_s=options.ready_timeout_s))
        self._replicas = self._workers.replicas
        self._urls = self._replicas.urls
        self._options = options
        self._facts: dict[str, float] | None = None
        self._streams: set[RemoteCodecStream] = set()
        self._closing: set[asyncio.Task] = set()
        self._requests = 0

    def load(self) -> RemoteSnacCodec:
        """Blocking: every replica must be a ready codec worker, and all of them must decode alike."""
        facts = [{key: body[key] for key in ("sample_rate", "delay_samples", "flush_frames")}
                 for body in self._workers.check_ready().values()]
        if any(f != facts[0] for f in facts):
            raise ConfigError(f"the codec replicas {', '.join(self._urls)} disagree on their stream facts {facts}")
        if facts[0]["sample_rate"] != SAMPLE_RATE:
            raise ConfigError(f"the codec at {self._urls[0]} decodes at {facts[0]['sample_rate']} Hz, not {SAMPLE_RATE}")
        self._facts = facts[0]
        return self

    @property
    def _stream_facts(self) -> dict[str, float]:
        if self._facts is None:
            raise RuntimeError("RemoteSnacCodec.load() was not called")
        return self._facts

    @property
    def delay_samples(self) -> int:
        return int(self._stream_facts["delay_samples"])

    @property
    def flush_frames(self) -> float:
        return float(self._stream_facts["flush_frames"])

    @property
    def queue_depth(self) -> int:
        return self._requests

    @property
    def batch_size(self) -> int | None:
        return None  # the worker's own /metrics shows its batches

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    async def start(self) -> None:
        return None

    def warm_up(self) -> None:
        return None  # the worker warmed its decoder before it said it was ready

    def open_stream(self) -> RemoteCodecStream:
        stream = RemoteCodecStream(url=self._replicas.pick())
        self._replicas.started(stream.url)
        self._streams.add(stream)
        return stream

    def release(self, stream: RemoteCodecStream) -> None:
        """Closes the stream's connection in the background: the worker then frees its state."""
        if stream in self._streams:
            self._streams.discard(stream)
            self._replicas.finished(stream.url)
        connection, stream.connection = stream.connection, None
        if connection is not None:
            task = asyncio.ensure_future(connection.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def decode(self, frames: np.ndarray, first_frame: int, *,
                     stream: RemoteCodecStream | None = None) -> np.ndarray:
        if stream is not None:
            return await self._exchange(stream, CodecRequest(WINDOW, np.asarray(frames), first_frame, stream.next_sample))
        own = self.open_stream()
        try:
            return await self._exchange(own, CodecRequest(WINDOW, np.asarray(frames), first_frame))
        finally:
            self.release(own)

    async def step(self, stream: RemoteCodecStream, frames: np.ndarray | None, *, final: bool = False) -> np.ndarray:
        kind = FLUSH if frames is None else FINAL if final else STEP
        return await self._exchange(stream, CodecRequest(kind, None if frames is None else np.asarray(frames),
                                                         0, stream.next_sample))

    async def _exchange(self, stream: RemoteCodecStream, request: CodecRequest) -> np.ndarray:
        async with stream.lock:
            self._requests += 1
            try:
                if stream.connection is None:
                    stream.connection = await self._open(stream)
                try:
                    async with asyncio.timeout(self._options.read_timeout_s):
                        await stream.connection.send(encode_request(request))
                        answer = await stream.connection.recv()
                except TimeoutError:
                    raise WorkerUnavailableError(f"codec worker at {stream.url} did not answer within "
                                                 f"{self._options.read_timeout_s:g} s") from None
                except ConnectionClosed as exc:
                    raise _closed_error(stream.url, exc) from None
            finally:
                self._requests -= 1
        if isinstance(answer, str):
            raise _refusal(stream.url, answer)
        try:
            return decode_audio(answer)
        except CodecWireError as exc:
            raise CadenceError(f"codec worker at {stream.url} answered badly: {exc}") from None

    async def _open(self, stream: RemoteCodecStream) -> ClientConnection:
        """The stream's connection; a replica that refuses it cools off, and the stream,
        which has no state anywhere yet, tries once more on another."""
        try:
            return await self._connect(stream.url)
        except WorkerUnavailableError:
            self._replicas.mark_down(stream.url)
            other = self._replicas.alternative(stream.url)
            if other is None or stream not in self._streams:
                raise
        self._replicas.finished(stream.url)
        self._replicas.started(other)
        stream.url = other
        return await self._connect(other)

    async def _connect(self, url: str) -> ClientConnection:
        address = ("ws" + url.removeprefix("http")) + PATH
        try:
            return await connect(address, open_timeout=self._options.connect_timeout_s, max_size=_MAX_ANSWER_BYTES,
                                 ping_interval=None, compression=None)
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise WorkerUnavailableError(f"codec worker at {url} cannot be reached ({type(exc).__name__}: "
                                         f"{exc or 'no detail'}); is it running?") from None

    async def close(self) -> None:
        for stream in list(self._streams):
            self.release(stream)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await self._workers.aclose()


def _refusal(url: str, text: str) -> CadenceError:
    try:
        body = json.loads(text)
    except ValueError:
        body = {"error": text[:200]}
    message = f"codec worker at {url}: {body.get('error')}"
    return CapacityError(f"{message}; retry later") if body.get("retryable") else CadenceError(message)


def _closed_error(url: str, exc: ConnectionClosed) -> CadenceError:
    if exc.rcvd is not None and exc.rcvd.code == TRY_AGAIN_LATER:
        return CapacityError(f"codec worker at {url} is full or not ready: {exc.rcvd.reason or 'try again later'}")
    return WorkerUnavailableError(f"codec worker at {url} closed the stream ({exc}); the supervisor restarts a "
                                  "worker that died")
