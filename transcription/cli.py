"""`cadence transcribe FILE... [--json] [--workers N] [--diarize [--speakers N]]`: long recordings to text on this machine.

Prints each file's transcript with times (or one JSON object per file with --json), a
progress bar on stderr while it works, and the real-time factor (audio seconds per
processing second; model loading excluded and shown apart). Exit status 1 if any file
could not be transcribed (each says why), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from transcription.diarization import Diarizer
from transcription.errors import TranscriptionError
from transcription.options import TranscriptionOptions
from transcription.pool import WhisperPool
from transcription.result import TranscriptionResult
from transcription.transcriber import Transcriber

BAR_WIDTH = 30


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cadence transcribe", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="any format ffmpeg reads (wav, mp3, m4a, ogg, flac, ...)")
    parser.add_argument("--json", action="store_true", help="one JSON object per file on stdout")
    parser.add_argument("--workers", type=int, default=TranscriptionOptions.workers,
                        help=f"worker processes, one Whisper each (default {TranscriptionOptions.workers})")
    parser.add_argument("--threads", type=int, default=TranscriptionOptions.threads_per_worker,
                        help="CPU threads per worker")
    parser.add_argument("--model", default=TranscriptionOptions.model, help="Whisper: package:<name>, a folder or a hub id")
    parser.add_argument("--language", default="en", help="language code, or 'auto' to detect per segment")
    parser.add_argument("--diarize", action="store_true",
                        help="label who spoke: per channel for a stereo call, by voice for mono")
    parser.add_argument("--speakers", type=int, help="with --diarize: how many speakers (default: estimated)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def progress_bar(name: str, stream=sys.stderr):
    def show(done_s: float, total_s: float | None) -> None:
        if total_s:
            filled = min(BAR_WIDTH, int(BAR_WIDTH * done_s / total_s))
            stream.write(f"\r{name}: [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                         f"{min(100.0, 100 * done_s / total_s):5.1f}% {done_s:7.1f}/{total_s:.1f} s")
        else:
            stream.write(f"\r{name}: {done_s:7.1f} s read")
        stream.flush()
    return show


def render(name: str, result: TranscriptionResult) -> str:
    lines = [f"== {name}"]
    for piece in result.segments:
        who = f" {piece.speaker}:" if piece.speaker else ""
        flag = " [suspect]" if piece.suspect else ""
        lines.append(f"[{piece.start:8.2f} - {piece.end:8.2f}]{who} {piece.text}{flag}")
    lines.append(f"-- {result.audio_seconds:.1f} s of audio in {result.processing_seconds:.1f} s: "
                 f"RTF {result.rtf:.1f}x real time" + (" (the file is truncated: what decoded is above)"
                                                       if result.truncated else ""))
    if result.speakers is not None:
        lines.append(f"-- {result.speakers} speaker(s); labelling them took {result.diarization_seconds:.1f} s")
    if result.guard_triggers:
        lines.append(f"-- hallucination guard: {result.guard_triggers}")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    options = replace(TranscriptionOptions(), workers=args.workers, threads_per_worker=args.threads,
                      model=args.model, language=None if args.language == "auto" else args.language)
    loading = time.perf_counter()
    pool = WhisperPool(options)
    failed = 0
    try:
        await asyncio.to_thread(pool.warm_up)
        loaded_s = time.perf_counter() - loading
        if not args.quiet:
            print(f"{options.workers} worker(s) loaded in {loaded_s:.1f} s", file=sys.stderr)
        transcriber = Transcriber(options, pool)
        diarizer = None
        if args.diarize:
            diarizer = Diarizer()
            await asyncio.to_thread(diarizer.load)
        for path in args.files:
            try:
                result = await transcriber.transcribe(path, progress=None if args.quiet else progress_bar(path),
                                                      diarizer=diarizer, speakers=args.speakers)
            except (TranscriptionError, OSError) as exc:
                failed += 1
                print(f"\n{path}: {exc}" if not args.quiet else f"{path}: {exc}", file=sys.stderr)
                continue
            if not args.quiet:
                print(file=sys.stderr)
            print(json.dumps({"file": path, **result.to_json()}) if args.json else render(path, result), flush=True)
    finally:
        pool.close()
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.workers < 1 or args.threads < 1 or (args.speakers is not None and args.speakers < 1):
        print("cadence transcribe: --workers, --threads and --speakers must be >= 1", file=sys.stderr)
        return 2
    if args.speakers is not None and not args.diarize:
        print("cadence transcribe: --speakers goes with --diarize", file=sys.stderr)
        return 2
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
