"""Within a caller's deadline a request waits for a worker that is restarting or still loading
(models/remote.py, models.scheduling.answer_within): an ASR worker killed mid-turn is back in
seconds, inside the turn's transcript deadline, and the turn need not be lost."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from models.errors import CapacityError, WorkerUnavailableError
from models.remote import RemoteASREngine
from models.scheduling import ANSWER_DEADLINE, answer_within
from tests.fakes_workers import GatedASR
from tests.test_worker_server import WAIT_S, _app, serving, until


class SlowLoadingASR(GatedASR):
    def __init__(self) -> None:
        super().__init__()
        self.loaded = threading.Event()

    def load(self) -> None:  # in the worker's loading thread
        self.loaded.wait(WAIT_S)


def refused_503(app) -> bool:
    return 'status="503"' in app.state.worker.metrics.render().decode()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_worker_still_loading_is_waited_for_within_the_deadline_and_refused_without_one():
    engine = SlowLoadingASR()
    app = _app(engine, "asr", loaded=False)
    async with serving(app) as url:
        remote = RemoteASREngine([url])
        with pytest.raises(CapacityError, match="not ready"):
            await remote.transcribe(b"\x00\x01")  # no deadline: told at once
        with answer_within(WAIT_S):
            waiting = asyncio.create_task(remote.transcribe(b"\x00\x01" * 2))
        await until(lambda: waiting.done() or refused_503(app))
        assert not waiting.done()
        engine.loaded.set()
        assert (await asyncio.wait_for(waiting, WAIT_S)).text == "2 samples"
        await remote.close()


async def test_a_worker_that_refused_connections_is_waited_for_until_it_is_back():
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    remote = RemoteASREngine([url])
    with answer_within(WAIT_S):
        waiting = asyncio.create_task(remote.transcribe(b"\x00\x01" * 3))
    await until(lambda: waiting.done() or remote._client.replicas.is_down(url))  # refused once
    assert not waiting.done()
    async with serving(_app(GatedASR(), "asr"), port=port):  # the supervisor's restart, on its port
        assert (await asyncio.wait_for(waiting, WAIT_S)).text == "3 samples"
    await remote.close()


async def test_a_transcription_whose_worker_died_under_it_is_asked_again_once_it_is_back():
    port = closed_port()
    connections = asyncio.Event()

    async def die_mid_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the request has begun to arrive, then the worker is gone
        connections.set()
        writer.transport.abort()

    dying = await asyncio.start_server(die_mid_request, "127.0.0.1", port, reuse_address=True)
    remote = RemoteASREngine([f"http://127.0.0.1:{port}"])
    with answer_within(WAIT_S):
        waiting = asyncio.create_task(remote.transcribe(b"\x00\x01" * 4))
    await asyncio.wait_for(connections.wait(), WAIT_S)
    dying.close()
    await dying.wait_closed()
    async with serving(_app(GatedASR(), "asr"), port=port):
        assert (await asyncio.wait_for(waiting, WAIT_S)).text == "4 samples"
    await remote.close()


async def test_a_deadline_too_near_for_another_try_fails_with_the_workers_error_before_it_passes():
    remote = RemoteASREngine([f"http://127.0.0.1:{closed_port()}"])
    with answer_within(0.05):
        with pytest.raises(WorkerUnavailableError, match="cannot be reached"):
            await asyncio.wait_for(remote.transcribe(b"\x00\x01"), WAIT_S)
    assert ANSWER_DEADLINE.get() is None  # the deadline was the block's only
    await remote.close()
