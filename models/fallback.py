"""What an engine with a second one behind it shares, whatever the model: both are loaded,
warmed up and closed together; the load and health an operator sees are the primary's, with
how often the fallback had to answer (models/fallback_voice.py, models/fallback_asr.py)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from models.base import Engine

E = TypeVar("E", bound=Engine)


class WithFallback(Generic[E]):
    """Listed before the engine's contract class, whose defaults it replaces."""

    def __init__(self, primary: E, fallback: E) -> None:
        self._primary, self._fallback = primary, fallback
        self.fallbacks = 0  # requests the fallback answered

    def load(self) -> None:
        self._primary.load()
        self._fallback.load()

    def warm_up(self) -> None:
        self._primary.warm_up()
        self._fallback.warm_up()

    @property
    def queue_depth(self) -> int:
        return self._primary.queue_depth

    @property
    def batch_size(self) -> int | None:
        return self._primary.batch_size

    def health(self) -> dict[str, Any]:
        return {**self._primary.health(), "fallbacks": self.fallbacks}

    async def close(self) -> None:
        await self._primary.close()
        await self._fallback.close()
