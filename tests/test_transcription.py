"""Long recordings: espeak-ng reads known sentences with pauses; the real Whisper (base,
int8) in worker processes transcribes them. Bad files, the guard and the CLI too."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tracemalloc
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from latency_bench.callers import recordings
from latency_bench.quality.wer import word_error_rate
from transcription.audio_file import AudioReader
from transcription.errors import AudioTooLong, EmptyAudio, UnreadableAudio
from transcription.guard import rejection
from transcription.options import TranscriptionOptions
from transcription.pool import WhisperPool
from transcription.result import Piece
from transcription.transcriber import Transcriber

ROOT = Path(__file__).resolve().parent.parent
WER_BOUND = 0.12  # Whisper base on clean synthetic speech; measured ~0.0x here

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_minutes(tmp_path_factory) -> tuple[Path, recordings.Recording]:
    recording = recordings.build(120)
    return recordings.write(recording, tmp_path_factory.mktemp("rec") / "two-minutes.wav"), recording


@pytest.fixture(scope="module")
def pools():
    made: dict[int, WhisperPool] = {}

    def pool(workers: int) -> WhisperPool:
        if workers not in made:
            made[workers] = WhisperPool(replace(TranscriptionOptions(), workers=workers))
        return made[workers]
    yield pool
    for p in made.values():
        p.close()


@pytest.fixture(scope="module")
def results(two_minutes, pools):
    path, _ = two_minutes
    options = TranscriptionOptions()
    return {n: asyncio.run(Transcriber(replace(options, workers=n), pools(n)).transcribe(path)) for n in (2, 1)}


def test_a_two_minute_recording_is_transcribed_within_the_wer_bound(two_minutes, results):
    _, recording = two_minutes
    result = results[2]
    assert word_error_rate(recording.reference, result.text) < WER_BOUND, result.text
    assert result.audio_seconds == pytest.approx(recording.seconds, abs=0.1)
    assert 0 < result.speech_seconds < result.audio_seconds  # the silence was not transcribed
    assert result.rtf > 1 and not result.truncated


def test_timestamps_are_monotonic_and_cover_every_sentence(two_minutes, results):
    _, recording = two_minutes
    segments = results[2].segments
    assert all(p.start <= p.end for p in segments)
    assert all(a.end <= b.start for a, b in zip(segments, segments[1:]))
    for turn in recording.turns:
        overlapping = [p for p in segments if p.start < turn.end and p.end > turn.start]
        assert overlapping, f"nothing transcribed over {turn}"


def test_parallel_and_sequential_transcripts_agree(results):
    assert [(p.start, p.end, p.text) for p in results[2].segments] == \
           [(p.start, p.end, p.text) for p in results[1].segments]


def test_any_format_ffmpeg_reads_gives_the_same_words(two_minutes, pools, tmp_path):
    import av

    path, recording = two_minutes
    compressed = tmp_path / "two-minutes.mp3"  # 44.1 kHz stereo MP3: resampled and mixed down on reading
    with av.open(str(path)) as source, av.open(str(compressed), "w") as target:
        out = target.add_stream("libmp3lame", rate=44_100, layout="stereo")
        resampler = av.AudioResampler(format="fltp", layout="stereo", rate=44_100)
        for frame in source.decode(audio=0):
            for resampled in resampler.resample(frame):
                for packet in out.encode(resampled):
                    target.mux(packet)
        for packet in out.encode(None):
            target.mux(packet)
    result = asyncio.run(Transcriber(TranscriptionOptions(), pools(2)).transcribe(compressed))
    assert word_error_rate(recording.reference, result.text) < WER_BOUND


# --- bad files ------------------------------------------------------------------------------

def write_pcm(path: Path, samples: np.ndarray, rate: int = 16_000, *, declared_frames: int | None = None) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        if declared_frames is not None:
            out.setnframes(declared_frames)
        out.writeframes(samples.astype(np.int16).tobytes())
    return path


def test_files_that_are_not_audio_or_hold_none_are_refused_clearly(tmp_path, pools):
    transcriber = Transcriber(TranscriptionOptions(), pools(2))
    text = tmp_path / "notes.wav"
    text.write_text("these are not the samples you are looking for\n" * 20)
    with pytest.raises(UnreadableAudio, match="notes.wav"):
        asyncio.run(transcriber.transcribe(text))
    empty = write_pcm(tmp_path / "empty.wav", np.zeros(0))
    with pytest.raises((EmptyAudio, UnreadableAudio), match="empty.wav"):
        asyncio.run(transcriber.transcribe(empty))
    with pytest.raises(UnreadableAudio, match="missing.wav"):
        asyncio.run(transcriber.transcribe(tmp_path / "missing.wav"))


def test_a_truncated_file_gives_what_decoded(two_minutes, tmp_path, pools):
    path, recording = two_minutes
    cut = tmp_path / "cut.wav"
    raw = path.read_bytes()
    cut.write_bytes(raw[: len(raw) // 4 + 1])  # the header still says two minutes; an odd byte at the end
    result = asyncio.run(Transcriber(TranscriptionOptions(), pools(2)).transcribe(cut))
    assert 20 < result.audio_seconds < 40
    first_sentences = " ".join(t.text for t in recording.turns if t.end < result.audio_seconds - 1)
    assert word_error_rate(first_sentences, result.text) < 0.25


def test_a_recording_longer_than_allowed_is_refused_before_any_work(two_minutes, pools):
    path, _ = two_minutes
    transcriber = Transcriber(replace(TranscriptionOptions(), max_audio_seconds=60), pools(2))
    with pytest.raises(AudioTooLong, match="at most"):
        asyncio.run(transcriber.transcribe(path))


def test_a_long_file_is_read_in_bounded_memory(tmp_path, pools):
    # 20 minutes: 77 MB as float32 at 16 kHz if it were held whole.
    long = write_pcm(tmp_path / "long.wav", np.random.default_rng(0).normal(0, 30, 20 * 60 * 8000), rate=8000)
    transcriber = Transcriber(TranscriptionOptions(), pools(2))
    tracemalloc.start()
    try:
        result = asyncio.run(transcriber.transcribe(long))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.audio_seconds == pytest.approx(1200, abs=1)
    assert peak < 30 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_the_reader_yields_bounded_blocks(two_minutes):
    path, _ = two_minutes
    reader = AudioReader(path, block_s=5.0)
    sizes = [len(block) for block in reader]
    assert max(sizes) == 5 * 16_000 and sum(sizes) == reader.samples


# --- the hallucination guard ----------------------------------------------------------------

def test_the_guard_names_what_is_wrong():
    ok = [Piece(0, 4, "I would like to book an appointment with the dentist next week.", -0.2)]
    assert rejection(ok, 4.0) is None
    loop = [Piece(0, 10, "Thank you. " * 30, -0.1)]
    assert rejection(loop, 10.0) == "compression_ratio"
    fast = [Piece(0, 2, "one two three four five six seven eight nine ten eleven twelve thirteen fourteen", -0.2)]
    assert rejection(fast, 2.0) == "words_per_second"
    unsure = [Piece(0, 3, "maybe something about the weather", -1.6)]
    assert rejection(unsure, 3.0) == "avg_logprob"


class ScriptedPool:
    """The pool's interface; answers a loop until the temperature reaches `sane_from`."""

    workers = 1

    def __init__(self, sane_from: float) -> None:
        self.sane_from = sane_from
        self.calls: list[tuple[float, float]] = []

    async def transcribe(self, audio: np.ndarray, temperature: float = 0.0) -> list[Piece]:
        seconds = len(audio) / 16_000
        self.calls.append((round(seconds, 2), temperature))
        if temperature >= self.sane_from:
            return [Piece(0.0, seconds, "a sentence that was really said", -0.3)]
        return [Piece(0.0, seconds, "I'm sorry. " * 40, -0.1)]


def test_a_planted_loop_is_retried_hotter_then_rechunked_and_counted(two_minutes):
    path, _ = two_minutes
    hotter = ScriptedPool(sane_from=0.4)
    result = asyncio.run(Transcriber(TranscriptionOptions(), hotter).transcribe(path))
    assert "I'm sorry" not in result.text and result.guard_triggers == {"compression_ratio": len(
        [c for c in hotter.calls if c[1] == 0.0])}
    never = ScriptedPool(sane_from=9.0)
    result = asyncio.run(Transcriber(TranscriptionOptions(), never).transcribe(path))
    assert result.guard_triggers["rechunk"] > 0
    assert all(p.suspect for p in result.segments)  # kept, but flagged: never passed on as checked


def test_a_rejected_segment_is_cut_at_its_quietest_point_into_halves_no_shorter_than_the_minimum():
    from collections import Counter

    from transcription.segmenter import FRAME_SECONDS

    never = ScriptedPool(sane_from=9.0)
    frames = 900  # 28.8 s of speech with a pause at 12 s
    probabilities = np.full(frames, 0.9, np.float32)
    dip = int(12 / FRAME_SECONDS)
    probabilities[dip] = 0.1
    audio = np.zeros(frames * 512, np.float32)
    triggers: Counter[str] = Counter()
    parts = asyncio.run(Transcriber(TranscriptionOptions(), never)._segment(100.0, probabilities, audio, triggers))
    starts = [start for start, _, _ in parts]
    assert starts[0] == 100.0 and any(abs(start - 112.0) < FRAME_SECONDS for start in starts)  # at the pause
    minimum = TranscriptionOptions().min_rechunk_s
    assert all(seconds >= minimum - FRAME_SECONDS for seconds, _ in never.calls)
    assert triggers["rechunk"] == len(parts) - 1 and triggers["compression_ratio"] > 0


# --- the command ----------------------------------------------------------------------------

def test_the_transcribe_command_prints_json_and_fails_clearly_on_a_bad_file(two_minutes, tmp_path):
    path, recording = two_minutes
    bad = tmp_path / "bad.mp3"
    bad.write_bytes(b"\x00" * 1000)
    done = subprocess.run([sys.executable, "-m", "agent.cli", "transcribe", str(path), str(bad), "--json",
                           "--workers", "1", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    (line,) = done.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["file"] == str(path) and report["rtf"] > 1
    assert word_error_rate(recording.reference, report["text"]) < WER_BOUND
    assert "bad.mp3" in done.stderr
