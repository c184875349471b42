"""How much of the caller's audio reached the pipeline (the VAD, then the ASR): what a lossy
network costs a call is the audio that never arrived (issue 13, scenario 10)."""

from __future__ import annotations

from collections.abc import Callable

from pipecat.frames.frames import InputAudioRawFrame
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.processors.frame_processor import FrameProcessor

BYTES_PER_SAMPLE = 2  # pipecat's raw audio is 16-bit PCM


class CallerAudioMeter(BaseObserver):
    """Calls `on_audio(seconds)` for each frame of caller audio the transport's input hands on:
    once per frame, where it enters the pipeline, not again at every processor it passes."""

    def __init__(self, input_transport: FrameProcessor, on_audio: Callable[[float], None]) -> None:
        super().__init__()
        self._input = input_transport
        self._on_audio = on_audio

    async def on_push_frame(self, data: FramePushed) -> None:
        frame = data.frame
        if data.source is self._input and isinstance(frame, InputAudioRawFrame) and frame.sample_rate > 0:
            self._on_audio(len(frame.audio) / (BYTES_PER_SAMPLE * max(1, frame.num_channels) * frame.sample_rate))
