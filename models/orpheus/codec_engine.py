"""The SNAC decoder as an engine a codec worker serves (workers/codec_routes.py): the same
decode service the Orpheus voice uses in-process, batched here across every stream of
every agent server that sends its codes to this worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from models.base import Engine
from models.orpheus.decode_service import DecodeServiceConfig, SnacDecodeService
from models.orpheus.snac_decoder import SnacDecoder
from models.orpheus.tokens import SAMPLE_RATE


class SnacCodecEngine(Engine):
    sample_rate = SAMPLE_RATE

    def __init__(self, load_decoder: Callable[[], SnacDecoder], config: DecodeServiceConfig = DecodeServiceConfig(),
                 *, batch_record: Any = None) -> None:
        """`batch_record`: anything with `record(size)`, told each forward pass's size (the
        worker's batch-size histogram reads it)."""
        self._load_decoder = load_decoder
        self._config = config
        self.batch_record = batch_record
        self._service: SnacDecodeService | None = None

    @property
    def service(self) -> SnacDecodeService:
        if self._service is None:
            raise RuntimeError("SnacCodecEngine.load() was not called")
        return self._service

    def load(self) -> None:
        on_batch = self.batch_record.record if self.batch_record is not None else None
        self._service = SnacDecodeService(self._load_decoder(), self._config, on_batch=on_batch)

    def warm_up(self) -> None:
        self.service.warm_up()

    @property
    def queue_depth(self) -> int:
        return self._service.queue_depth if self._service else 0

    @property
    def batch_size(self) -> int | None:
        return self._service.batch_size if self._service else None

    def stream_facts(self) -> dict[str, float | int]:
        """What a client needs to plan its streams (sent in /readyz)."""
        return {"sample_rate": self.sample_rate, "delay_samples": self.service.delay_samples,
                "flush_frames": self.service.flush_frames}

    async def close(self) -> None:
        if self._service is not None:
            await self._service.close()
