"""The caller's audio is counted once, where it enters the pipeline (pipelines/caller_audio.py)."""

from __future__ import annotations

import pytest
from pipecat.frames.frames import InputAudioRawFrame, OutputAudioRawFrame
from pipecat.observers.base_observer import FramePushed
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipelines.caller_audio import CallerAudioMeter


async def test_each_frame_from_the_input_counts_once_by_its_length():
    transport_input, vad, stt = (FrameProcessor(name=n) for n in ("input", "vad", "stt"))
    heard: list[float] = []
    meter = CallerAudioMeter(transport_input, heard.append)

    async def push(frame, source):
        await meter.on_push_frame(FramePushed(source=source, destination=stt, frame=frame,
                                              direction=FrameDirection.DOWNSTREAM, timestamp=0, first_push=True))

    twenty_ms = InputAudioRawFrame(audio=b"\0\0" * 320, sample_rate=16_000, num_channels=1)
    await push(twenty_ms, transport_input)
    await push(twenty_ms, vad)  # passed on: not the caller's audio again
    await push(InputAudioRawFrame(audio=b"\0\0" * 960 * 2, sample_rate=48_000, num_channels=2), transport_input)
    await push(OutputAudioRawFrame(audio=b"\0\0" * 320, sample_rate=16_000, num_channels=1), transport_input)
    assert heard == [pytest.approx(0.02), pytest.approx(0.02)]
