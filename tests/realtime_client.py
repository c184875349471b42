"""A Realtime session as a test drives it: the official `openai` SDK's connection, every server
event collected in order, and caller speech sent at real-time pace."""

from __future__ import annotations

import asyncio
import base64
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import numpy as np

from latency_bench.callers.audio import resample
from latency_bench.callers.speech import Voice, speak_as

PROTOCOL_RATE = 24_000
CHUNK_MS = 20


@dataclass
class Session:
    connection: object  # openai's AsyncRealtimeConnection
    events: list = field(default_factory=list)
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def next(self, event_type: str, *, after: int = 0, timeout_s: float = 30.0):
        """The first event of this type at index >= `after` (waits for it)."""
        async with asyncio.timeout(timeout_s):
            async with self._arrived:
                while True:
                    for event in self.events[after:]:
                        if event.type == event_type:
                            return event
                    await self._arrived.wait()

    def index_of(self, event) -> int:
        return next(i for i, e in enumerate(self.events) if e is event)

    def of_type(self, event_type: str, *, after: int = 0) -> list:
        return [e for e in self.events[after:] if e.type == event_type]

    async def _collect(self) -> None:
        async for event in self.connection:
            async with self._arrived:
                self.events.append(event)
                self._arrived.notify_all()

    async def send_pcm(self, pcm16: np.ndarray) -> None:
        """24 kHz int16 audio, 20 ms per append, at the pace a microphone makes it."""
        step = PROTOCOL_RATE * CHUNK_MS // 1000
        loop = asyncio.get_running_loop()
        start = loop.time()
        for n, offset in enumerate(range(0, len(pcm16), step)):
            chunk = pcm16[offset:offset + step].astype("<i2").tobytes()
            await self.connection.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            await asyncio.sleep(max(0.0, start + (n + 1) * CHUNK_MS / 1000 - loop.time()))


def utterance(text: str, *, voice: Voice = Voice("espeak-ng", "en-us"), trailing_silence_s: float = 1.2) -> np.ndarray:
    samples, rate = speak_as(text, voice)
    speech = resample(samples, rate, PROTOCOL_RATE)
    return np.concatenate([np.zeros(PROTOCOL_RATE // 5, dtype=np.int16), speech,
                           np.zeros(int(PROTOCOL_RATE * trailing_silence_s), dtype=np.int16)])


@asynccontextmanager
async def realtime_session(base_url: str, *, api_key: str = "no-keys-on-this-server", model: str = "default",
                           **connect_options):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=api_key, base_url=f"{base_url}/v1")
    async with client.realtime.connect(model=model, **connect_options) as connection:
        session = Session(connection)
        collector = asyncio.create_task(session._collect())
        try:
            yield session
        finally:
            collector.cancel()
            await asyncio.gather(collector, return_exceptions=True)


def audio_ms(deltas: list) -> float:
    return sum(len(base64.b64decode(d.delta)) for d in deltas) / (PROTOCOL_RATE * 2 / 1000)
