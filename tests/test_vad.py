"""Every call's Silero VAD on one shared ONNX session: the same verdicts as pipecat's own
analyzer, each call's recurrent state its own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADParams

from pipelines.vad import PauseAwareSileroVAD, SharedSessionSileroVAD, shared_silero_session

RATE = 16_000
WINDOW_BYTES = 512 * 2


@pytest.fixture(scope="module")
def utterances() -> list[bytes]:
    """Two different callers' audio: speech, then silence long enough for the model's resets."""
    from latency_bench.callers.audio import resample, speak

    spoken = []
    for text in ("Where is my package? It was due on Monday.", "I would like to change my booking, please."):
        samples, rate = speak(text)
        pcm = resample(samples, rate, RATE).tobytes()
        spoken.append(pcm + bytes(RATE * 2 * 3) + pcm)
    return spoken


def windows(pcm: bytes) -> list[bytes]:
    return [pcm[i : i + WINDOW_BYTES] for i in range(0, len(pcm) - WINDOW_BYTES + 1, WINDOW_BYTES)]


def analyzer(kind: type[SileroVADAnalyzer]) -> SileroVADAnalyzer:
    vad = kind(sample_rate=RATE, params=VADParams())
    vad.set_sample_rate(RATE)
    return vad


def confidences(vad: SileroVADAnalyzer, pcm: bytes) -> list[float]:
    return [float(np.ravel(vad.voice_confidence(window))[0]) for window in windows(pcm)]


def test_it_sets_what_pipecats_analyzer_sets():
    # Its __init__ stands in for pipecat's (which would load a session): a pipecat update that
    # adds state to the analyzer or its model wrapper must show up here, not in a call.
    ours, theirs = analyzer(SharedSessionSileroVAD), analyzer(SileroVADAnalyzer)
    assert set(vars(ours)) == set(vars(theirs))
    assert set(vars(ours._model)) == set(vars(theirs._model))


def test_every_call_runs_on_one_session():
    first, second = analyzer(SharedSessionSileroVAD), analyzer(SharedSessionSileroVAD)
    pause_aware = PauseAwareSileroVAD(sample_rate=RATE, pause_secs=0.2)
    assert first._model.session is second._model.session is pause_aware._model.session is shared_silero_session()
    assert first._model is not second._model  # the recurrent state is not shared


def test_its_confidences_are_pipecats(utterances):
    speech = utterances[0]
    expected = confidences(analyzer(SileroVADAnalyzer), speech)
    assert max(expected) > 0.9 and min(expected) < 0.1  # speech and silence both in it
    assert confidences(analyzer(SharedSessionSileroVAD), speech) == pytest.approx(expected, abs=1e-6)


def test_interleaved_calls_keep_their_own_state(utterances):
    alone = [confidences(analyzer(SileroVADAnalyzer), pcm) for pcm in utterances]
    calls = [analyzer(SharedSessionSileroVAD) for _ in utterances]
    interleaved: list[list[float]] = [[], []]
    for pair in zip(*(windows(pcm) for pcm in utterances)):
        for heard, vad, window in zip(interleaved, calls, pair):
            heard.append(float(np.ravel(vad.voice_confidence(window))[0]))
    for heard, expected in zip(interleaved, alone):
        assert heard == pytest.approx(expected[: len(heard)], abs=1e-6)


def test_calls_on_threads_at_once_match_calls_alone(utterances):
    # Each call's VAD runs on a thread of its own: the session serves them concurrently.
    alone = [confidences(analyzer(SileroVADAnalyzer), pcm) for pcm in utterances * 2]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(lambda pcm: confidences(analyzer(SharedSessionSileroVAD), pcm), utterances * 2))
    for heard, expected in zip(together, alone):
        assert np.allclose(heard, expected, atol=1e-6)
