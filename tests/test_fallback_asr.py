"""An ASR worker's failure is covered by the in-process Whisper (models/fallback_asr.py):
the turn is transcribed rather than lost, at once rather than after the worker's restart."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest

from agent import engine_factory
from agent.model_plane import Endpoint
from models.base import Transcript
from models.fallback_asr import FallbackASREngine
from models.remote import RemoteASREngine, RemoteOptions
from models.scheduling import answer_within
from tests.fakes_workers import GatedASR
from tests.test_remote_waits import SlowLoadingASR, closed_port
from tests.test_worker_server import WAIT_S, _app, serving


class LocalWhisper(GatedASR):
    """Stands in for the in-process Whisper: says where its transcript came from."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_on = None  # it hears what broke the worker

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        return replace(await super().transcribe(pcm16, prompt=prompt), text="local")


async def test_a_failed_transcript_is_made_by_the_fallback_and_counted():
    primary, local = GatedASR(), LocalWhisper()
    engine = FallbackASREngine(primary, local)
    assert (await engine.transcribe(b"\x00\x01" * 2, prompt="earlier")).text == "2 samples"
    assert local.prompts == []  # a healthy primary answers alone
    assert (await engine.transcribe(primary.fail_on, prompt="earlier")).text == "local"
    assert local.prompts == ["earlier"] and engine.fallbacks == 1
    assert engine.health()["fallbacks"] == 1
    continued = await engine.transcribe_continuing(primary.fail_on, committed="the settled words", prompt=None)
    assert continued.text.startswith("the settled words") and engine.fallbacks == 2


async def test_a_cancelled_transcript_is_not_handed_to_the_fallback():
    primary, local = GatedASR(), LocalWhisper()
    primary.gate.clear()
    engine = FallbackASREngine(primary, local)
    asking = asyncio.create_task(engine.transcribe(b"\x00\x01"))
    await primary.entered.wait()
    asking.cancel()  # a barge-in or a hang-up
    with pytest.raises(asyncio.CancelledError):
        await asking
    assert primary.cancelled.is_set() and local.prompts == [] and engine.fallbacks == 0


async def test_a_dead_worker_is_not_waited_for_when_a_fallback_answers(caplog):
    # Within a turn's deadline a plain client waits for the worker to come back
    # (tests/test_remote_waits.py); in front of a fallback it asks the fallback at once.
    worker = RemoteASREngine([f"http://127.0.0.1:{closed_port()}"], options=RemoteOptions(wait_for_worker=False))
    local = LocalWhisper()
    engine = FallbackASREngine(worker, local)
    with caplog.at_level(logging.INFO, logger="models.remote"), answer_within(WAIT_S):
        assert (await engine.transcribe(b"\x00\x01")).text == "local"
    assert engine.fallbacks == 1
    assert not [r for r in caplog.records if "took no request" in r.getMessage()]  # no wait for the worker
    await engine.close()


async def test_a_deployments_asr_worker_gets_the_in_process_whisper_behind_it(default_config):
    endpoint = Endpoint("asr", "faster-whisper", ("http://127.0.0.1:9",), None, 8)
    covered = engine_factory.build_asr(default_config, endpoint)
    assert isinstance(covered, FallbackASREngine)
    assert type(covered._primary).__name__ == "RemoteASREngine" and not covered._primary._client._options.wait_for_worker
    assert type(covered._fallback).__name__ == "WhisperASREngine"
    alone = engine_factory.build_asr(replace(default_config, asr=replace(default_config.asr, worker_fallback=False)),
                                     endpoint)
    assert isinstance(alone, RemoteASREngine) and alone._client._options.wait_for_worker  # waits within the deadline
    await covered.close()
    await alone.close()


async def test_a_worker_that_answers_is_used_and_the_fallback_left_idle():
    local = LocalWhisper()
    async with serving(_app(GatedASR(), "asr")) as url:
        engine = FallbackASREngine(RemoteASREngine([url], options=RemoteOptions(wait_for_worker=False)), local)
        assert (await engine.transcribe(b"\x00\x01" * 5)).text == "5 samples"
        assert local.prompts == [] and engine.fallbacks == 0
        await engine.close()


async def test_a_worker_still_loading_or_full_is_passed_over_for_the_fallback():
    loading = SlowLoadingASR()  # answers 503, retryable, until it has loaded: as a full worker does
    local = LocalWhisper()
    async with serving(_app(loading, "asr", loaded=False)) as url:
        engine = FallbackASREngine(RemoteASREngine([url], options=RemoteOptions(wait_for_worker=False)), local)
        with answer_within(WAIT_S):
            assert (await engine.transcribe(b"\x00\x01")).text == "local"
        assert engine.fallbacks == 1
        loading.loaded.set()
        await engine.close()
