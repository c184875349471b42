"""Long-file transcription on this machine: RTF with 1..N worker processes, and WER.

    python -m latency_bench transcribe-bench [--minutes 10] [--workers 1,2] [--runs 3]
        [--diarization-minutes 2] [--json]

Builds a recording of `--minutes` of sentences read by espeak-ng with pauses (the reference
text is known), then transcribes it `--runs` times per worker count with
`cadence transcribe`'s own code (workers loaded first: RTF counts the work, not loading).
Prints per worker count the median RTF (audio seconds / processing seconds), its runs,
and the WER against the reference. Then diarization: a recording of two voices taking turns
(`--diarization-minutes`, 0 to skip), transcribed with `--diarize` by the largest worker
count: the labelling's own RTF, its cost beside transcription's, and the diarization
error rate (DER, 0.25 s collar) against the known turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from latency_bench.callers import recordings
from latency_bench.quality.der import diarization_error_rate
from latency_bench.quality.wer import word_error_rate
from transcription.diarization import Diarizer
from transcription.options import TranscriptionOptions
from transcription.pool import WhisperPool
from transcription.transcriber import Transcriber


async def measure(path: Path, reference: str, workers: int, runs: int) -> dict:
    options = replace(TranscriptionOptions(), workers=workers)
    pool = WhisperPool(options)
    try:
        await asyncio.to_thread(pool.warm_up)
        results = [await Transcriber(options, pool).transcribe(path) for _ in range(runs)]
    finally:
        pool.close()
    return {"workers": workers, "rtf_median": round(statistics.median(r.rtf for r in results), 2),
            "rtf_runs": [round(r.rtf, 2) for r in results],
            "processing_s_runs": [round(r.processing_seconds, 1) for r in results],
            "audio_s": round(results[0].audio_seconds, 1), "speech_s": round(results[0].speech_seconds, 1),
            "wer": round(word_error_rate(reference, results[0].text), 4),
            "guard_triggers": results[0].guard_triggers}


async def measure_diarization(path: Path, recording: recordings.Recording, workers: int, runs: int) -> dict:
    options = replace(TranscriptionOptions(), workers=workers)
    pool, diarizer = WhisperPool(options), Diarizer()
    try:
        await asyncio.to_thread(pool.warm_up)
        await asyncio.to_thread(diarizer.load)
        results = [await Transcriber(options, pool).transcribe(path, diarizer=diarizer) for _ in range(runs)]
    finally:
        pool.close()
    reference = [(t.start, t.end, f"spk{t.speaker}") for t in recording.turns]
    best = results[0]
    transcription_s = statistics.median(r.processing_seconds - r.diarization_seconds for r in results)
    diarization_s = statistics.median(r.diarization_seconds for r in results)
    return {"workers": workers, "audio_s": round(best.audio_seconds, 1), "speakers_found": best.speakers,
            "der": round(diarization_error_rate(reference, [(p.start, p.end, p.speaker) for p in best.segments]), 4),
            "diarization_rtf": round(best.audio_seconds / diarization_s, 1),
            "transcription_rtf": round(best.audio_seconds / transcription_s, 1),
            "diarization_over_transcription": round(diarization_s / transcription_s, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench transcribe-bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--diarization-minutes", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    recording = recordings.build(args.minutes * 60)
    with tempfile.TemporaryDirectory() as folder:
        path = recordings.write(recording, Path(folder) / "recording.wav")
        report = [asyncio.run(measure(path, recording.reference, int(n), args.runs))
                  for n in args.workers.split(",")]
        diarization = None
        if args.diarization_minutes > 0:
            two = recordings.build(args.diarization_minutes * 60, speakers=2)
            two_path = recordings.write(two, Path(folder) / "two-voices.wav")
            diarization = asyncio.run(measure_diarization(two_path, two, max(int(n) for n in args.workers.split(",")),
                                                          args.runs))
    if args.json:
        print(json.dumps({"transcription": report, "diarization": diarization}))
        return 0
    for row in report:
        print(f"workers {row['workers']}: RTF {row['rtf_median']:.1f}x (runs {row['rtf_runs']}), "
              f"{row['audio_s']:.0f} s of audio ({row['speech_s']:.0f} s speech), WER {row['wer']:.3f}, "
              f"guard {row['guard_triggers']}")
    if diarization:
        print(f"diarization ({diarization['audio_s']:.0f} s, two voices, {diarization['workers']} workers): "
              f"DER {diarization['der']:.3f}, {diarization['speakers_found']} speakers found, "
              f"RTF {diarization['diarization_rtf']:.1f}x for the labelling alone "
              f"({diarization['diarization_over_transcription']:.2f}x the transcription's time; "
              f"transcription RTF {diarization['transcription_rtf']:.1f}x)")
    return 0
