"""The framework baseline for `latency_bench compare`: a stock pipecat phone agent.

Built the way pipecat's own examples build one, from pipecat's own services and
defaults, on the same weights Cadence's default agent uses:

    Twilio media WebSocket -> WhisperSTTService (segmented faster-whisper, whisper-base int8)
    -> user turn (Silero VAD + pipecat's default turn stop: smart-turn v3)
    -> OpenAILLMService (SmolLM2-135M Q4 behind llama-cpp-python's OpenAI-compatible server)
    -> PiperTTSService (the joe voice) -> Twilio media WebSocket

For the bench's final-transcript latency the baseline keeps, per call, when each of its
final transcripts came (an observer, no change to the pipeline) and serves them in the
shape of Cadence's /api/calls, so the bench joins them to the caller's turns alike.

The LLM is capped at the same reply length and system prompt as Cadence's, so both
speak comparable replies. `--turn-stop vad` swaps smart-turn for a plain VAD silence
timeout (`--stop-secs`, Cadence's own 0.4 s by default) to compare pipelines with the
turn-taking policy held equal.

    python -m latency_bench stock-pipecat --port 8100 --llm-url http://127.0.0.1:8101/v1
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

import uvicorn
from fastapi import FastAPI, WebSocket
from fastapi.responses import JSONResponse

from agent.agent_registry import load_agent_files
from agent.config import load_config
from models.assets import default_cache_dir, resolve_local

log = logging.getLogger("stock_pipecat")
MAX_CALLS_KEPT = 200  # transcript times are kept for this many recent calls


def transcript_observer(turns: list[dict]):
    """A pipecat observer that appends {end_of_speech_at, stage_ms: {asr_final}} to `turns`:
    the end of speech as the VAD saw it (its stop decision less stop_secs) and when the
    final transcript of that stretch of speech came, both wall clock."""
    import time

    from pipecat.frames.frames import TranscriptionFrame, VADUserStoppedSpeakingFrame
    from pipecat.observers.base_observer import BaseObserver
    from pipecat.processors.frame_processor import FrameDirection

    class TranscriptTimes(BaseObserver):
        async def on_push_frame(self, data) -> None:
            if not data.first_push:
                return
            frame = data.frame
            # The user aggregator broadcasts the VAD's stop both ways: count the downstream copy.
            if isinstance(frame, VADUserStoppedSpeakingFrame) and data.direction == FrameDirection.DOWNSTREAM:
                turns.append({"index": len(turns), "end_of_speech_at": time.time() - frame.stop_secs,
                              "stage_ms": {}})
            elif isinstance(frame, TranscriptionFrame) and turns:
                turn = turns[-1]
                turn["user_text"] = frame.text
                turn["stage_ms"]["asr_final"] = round((time.time() - turn["end_of_speech_at"]) * 1000, 1)

    return TranscriptTimes()


def create_app(llm_url: str, *, turn_stop: str, stop_secs: float) -> FastAPI:
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (
        LLMContextAggregatorPair,
        LLMUserAggregatorParams,
    )
    from pipecat.runner.utils import parse_telephony_websocket
    from pipecat.serializers.twilio import TwilioFrameSerializer
    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.services.whisper.stt import WhisperSTTService
    from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport
    from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import SpeechTimeoutUserTurnStopStrategy
    from pipecat.turns.user_turn_strategies import UserTurnStrategies
    from pipecat.workers.runner import WorkerRunner

    cadence = load_config(Path(__file__).resolve().parents[2] / "configs" / "default.yaml")
    whisper_dir = resolve_local(cadence.asr.model, default_cache_dir())
    piper_voice = resolve_local(cadence.tts.voice, default_cache_dir())
    ready = asyncio.Event()
    app = FastAPI(title="stock pipecat baseline")
    transcripts: dict[str, list[dict]] = {}  # call sid -> its turns' transcript times

    @app.get("/api/calls")
    async def calls(external_id: str = "") -> JSONResponse:
        return JSONResponse({"calls": [{"id": external_id}] if external_id in transcripts else []})

    @app.get("/api/calls/{call_id}")
    async def call(call_id: str) -> JSONResponse:
        if call_id not in transcripts:
            return JSONResponse({"error": f"no call {call_id}"}, status_code=404)
        return JSONResponse({"id": call_id, "turns": transcripts[call_id]})

    def build_services():
        stt = WhisperSTTService(settings=WhisperSTTService.Settings(model=str(whisper_dir)), device="cpu",
                                compute_type=cadence.asr.compute_type)
        llm = OpenAILLMService(base_url=llm_url, api_key="not-needed",
                               settings=OpenAILLMService.Settings(
                                   model="smollm2", max_tokens=cadence.llm.max_reply_tokens,
                                   temperature=cadence.llm.temperature, top_p=cadence.llm.top_p))
        tts = PiperTTSService(settings=PiperTTSService.Settings(voice=piper_voice.stem),
                              download_dir=piper_voice.parent)
        return stt, llm, tts

    @app.on_event("startup")
    async def _warm() -> None:
        # Load each model once so the first call does not pay for it (pipecat loads per service).
        await asyncio.to_thread(build_services)
        ready.set()

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        return JSONResponse({"status": "ready" if ready.is_set() else "loading"},
                            status_code=200 if ready.is_set() else 503)

    # The same words as Cadence's default agent (its knowledge is Cadence's, not the baseline's).
    system_prompt = load_agent_files(cadence)[cadence.agents.default].spec.system_prompt

    @app.websocket("/ws/twilio")
    async def twilio(websocket: WebSocket) -> None:
        await websocket.accept()
        _kind, call_data = await parse_telephony_websocket(websocket)
        serializer = TwilioFrameSerializer(call_data["stream_id"], call_data["call_id"],
                                           params=TwilioFrameSerializer.InputParams(auto_hang_up=False))
        transport = FastAPIWebsocketTransport(websocket, FastAPIWebsocketParams(
            audio_in_enabled=True, audio_out_enabled=True, add_wav_header=False, serializer=serializer))
        stt, llm, tts = await asyncio.to_thread(build_services)
        context = LLMContext(messages=[{"role": "system", "content": system_prompt}])
        if turn_stop == "vad":
            user_params = LLMUserAggregatorParams(
                vad_analyzer=SileroVADAnalyzer(params=VADParams(stop_secs=stop_secs)),
                user_turn_strategies=UserTurnStrategies(stop=[SpeechTimeoutUserTurnStopStrategy(0.0)]))
        else:
            user_params = LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer())
        aggregators = LLMContextAggregatorPair(context, user_params=user_params)
        pipeline = Pipeline([transport.input(), stt, aggregators.user(), llm, tts, transport.output(),
                             aggregators.assistant()])
        turns: list[dict] = []
        transcripts[call_data["call_id"]] = turns
        while len(transcripts) > MAX_CALLS_KEPT:
            transcripts.pop(next(iter(transcripts)))
        worker = PipelineWorker(pipeline, params=PipelineParams(audio_in_sample_rate=16_000,
                                                                audio_out_sample_rate=8000),
                                observers=[transcript_observer(turns)])

        @transport.event_handler("on_client_disconnected")
        async def _gone(_transport, _ws) -> None:
            await worker.cancel()

        runner = WorkerRunner(handle_sigint=False, handle_sigterm=False)
        await runner.add_workers(worker)
        await runner.run()

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench stock-pipecat")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--llm-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8101/v1")
    parser.add_argument("--turn-stop", choices=["smart-turn", "vad"], default="smart-turn")
    parser.add_argument("--stop-secs", type=float, default=0.4)
    args = parser.parse_args(argv)
    from loguru import logger

    logger.remove()  # as for Cadence's server: pipecat's DEBUG logging would cost CPU under load
    logger.add(sys.stderr, level="WARNING")
    app = create_app(args.llm_url, turn_stop=args.turn_stop, stop_secs=args.stop_secs)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
