"""Who spoke when, on two espeak-ng voices taking turns: by voice (Resemblyzer's real GE2E
weights) for mono, by channel for a stereo call recording. Pure clustering and scoring too."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from latency_bench.callers import recordings
from latency_bench.quality.der import diarization_error_rate
from transcription.diarization import Diarizer, cluster
from transcription.options import TranscriptionOptions
from transcription.pool import WhisperPool
from transcription.result import Piece
from transcription.transcriber import Transcriber

DER_BOUND = 0.10  # two clearly different voices, whole sentences each turn

pytestmark = pytest.mark.slow


def test_clusters_follow_the_voices_and_their_number_is_estimated():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 16))
    points = np.vstack([c + rng.normal(scale=0.05, size=(6, 16)) for c in centres])
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    labels = cluster(points, None)
    assert len(set(labels)) == 3 and [labels[i] for i in range(0, 18, 6)] == sorted(set(labels), key=labels.index)
    assert all(len({labels[i] for i in range(g, g + 6)}) == 1 for g in range(0, 18, 6))
    assert len(set(cluster(points, 2))) == 2
    one = centres[0] + rng.normal(scale=0.02, size=(8, 16))
    assert set(cluster(one / np.linalg.norm(one, axis=1, keepdims=True), None)) == {0}  # one voice: no split


def test_the_error_rate_names_speakers_by_their_best_match():
    reference = [(0, 2, "a"), (3, 5, "b"), (6, 8, "a")]
    assert diarization_error_rate(reference, [(0, 2, "x"), (3, 5, "y"), (6, 8, "x")]) == 0.0
    assert diarization_error_rate(reference, [(0, 2, "x"), (3, 5, "x"), (6, 8, "x")]) == pytest.approx(1.5 / 4.5, abs=0.02)  # 0.25 s collars


@pytest.fixture(scope="module")
def conversation(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two-voices")
    mono = recordings.build(60, speakers=2, pause_s=0.8)
    stereo = recordings.build(60, speakers=2, pause_s=0.8, stereo=True)
    return (recordings.write(mono, folder / "mono.wav"), mono, recordings.write(stereo, folder / "stereo.wav"), stereo)


@pytest.fixture(scope="module")
def transcribed(conversation):
    mono_path, _, stereo_path, _ = conversation
    options = replace(TranscriptionOptions(), workers=2)
    pool = WhisperPool(options)
    diarizer = Diarizer()
    try:
        transcriber = Transcriber(options, pool)
        yield {name: asyncio.run(transcriber.transcribe(path, diarizer=diarizer, speakers=speakers))
               for name, path, speakers in (("mono", mono_path, None), ("mono-given", mono_path, 2),
                                            ("stereo", stereo_path, None))}
    finally:
        pool.close()


def reference_of(recording: recordings.Recording) -> list[tuple[float, float, str]]:
    return [(t.start, t.end, f"spk{t.speaker}") for t in recording.turns]


def hypothesis_of(pieces: list[Piece]) -> list[tuple[float, float, str]]:
    return [(p.start, p.end, p.speaker) for p in pieces]


def test_two_voices_taking_turns_are_two_speakers_each_turn_labelled_right(conversation, transcribed):
    _, mono, _, _ = conversation
    for name in ("mono", "mono-given"):
        result = transcribed[name]
        assert result.speakers == 2, name
        der = diarization_error_rate(reference_of(mono), hypothesis_of(result.segments))
        assert der < DER_BOUND, f"{name}: DER {der:.3f}"
    assert transcribed["mono"].diarization_seconds > 0


def test_a_stereo_call_is_labelled_by_channel(conversation, transcribed):
    _, _, _, stereo = conversation
    result = transcribed["stereo"]
    assert {p.speaker for p in result.segments} == {"ch1", "ch2"}
    assert diarization_error_rate(reference_of(stereo), hypothesis_of(result.segments)) < DER_BOUND


def test_pieces_too_short_for_a_voice_take_their_neighbours_label(conversation):
    mono_path, mono, _, _ = conversation
    first, second = mono.turns[0], mono.turns[1]
    pieces = [Piece(first.start, first.end, first.text), Piece(first.end + 0.1, first.end + 0.4, "uh"),
              Piece(second.start, second.end, second.text)]
    labelled, count = Diarizer().label(mono_path, pieces, speakers=2)
    assert count == 2 and labelled[1].speaker == labelled[0].speaker != labelled[2].speaker
