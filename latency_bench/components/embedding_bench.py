"""The knowledge embedder on both runtimes: query latency, ingestion throughput, recall.

    python -m latency_bench embedding-bench [--json] [--repeats 3] [--threads 0] [--engines onnx ...]

Per runtime (models/embedding.py), loaded once, then measured `repeats` times; the
headline is the median of the repeats:
  query_p50_ms / query_p95_ms  one 12-word question through the async `embed()` a call
                               uses (thread hop included), QUERY_RUNS times after warm-up;
  ingest_texts_per_s           INGEST_CHUNKS chunks of ~80 words, at batch 32;
  recall_at_1 / recall_at_3    dense-only search over a synthetic library FAQ: 300 notes of
                               one topic that differ in branch, service and kind of fact, and
                               30 questions that paraphrase the service (and half the time
                               the branch); a hit is the question's own note among the k
                               nearest. Deterministic: a difference is the runtime's, not luck;
  same_top_3_fraction          questions whose 3 nearest notes, in order, match across runtimes.
Percentiles are latency_bench.stats.percentile (interpolated), as in the call bench.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time

import numpy as np

from latency_bench.stats import percentile
from models.embedding import ENGINES, EmbeddingOptions, build_embedder

QUESTION = "What time does the Riverside branch open its notary service on Saturdays?"
QUERY_RUNS = 200
QUERY_WARM_UP_RUNS = 20
INGEST_BATCH = 32
INGEST_CHUNKS = 256  # 8 batches: enough that one slow batch does not set the figure
CHUNK_WORDS = 80  # a retrieval chunk: ~110 word pieces, under MiniLM's 256
RECALL_K = 3
QUESTIONS = 30
SEED = 20_240_611

# (the name in the notes, how a caller might put it instead)
BRANCHES = (
    ("Maple Street", "the one on Maple"), ("Riverside", "the library down by the river"),
    ("Harbor View", "the branch near the harbour"), ("Oak Park", "the Oak Park library"),
    ("Hillcrest", "the branch up on the hill"), ("Lakeside", "the library next to the lake"),
    ("Old Town", "the old town library"), ("Westgate", "the west gate branch"),
    ("Northfield", "the branch out in Northfield"), ("Elm Grove", "the Elm Grove library"),
)
SERVICES = (
    ("passport photos", "getting pictures taken for my passport"),
    ("3D printing", "printing a plastic model"),
    ("notary service", "having a document notarised"),
    ("tax filing help", "someone to help me with my tax return"),
    ("children's story time", "reading sessions for little kids"),
    ("beginner computer classes", "lessons on how to use a laptop"),
    ("meeting room rental", "reserving a space for a group meeting"),
    ("museum pass lending", "borrowing free tickets to the museum"),
    ("the seed library", "taking home free seeds for my garden"),
    ("English conversation circles", "practising spoken English with other people"),
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
PAYMENTS = ("by card only", "in cash at the front desk", "with your library card balance")
BOOKINGS = ("call the front desk the week before", "fill in the form on our website",
            "ask at the information desk", "send an email to the branch librarian")
# kind of fact -> (note template, question templates: one is drawn per question)
FACTS = {
    "hours": ("At the {branch} branch, {service} is on {day}s from {start} to {end}.",
              ("When can I go for {asked} at {where}?", "Which day of the week is {asked} on at {where}?",
               "What times does {where} do {asked}?")),
    "cost": ("At the {branch} branch, the price of {service} is {price}, paid {payment}.",
             ("How much would I pay for {asked} at {where}?", "Is {asked} free at {where}, or is there a fee?",
              "What does {where} charge for {asked}, and can I pay cash?")),
    "booking": ("To book {service} at the {branch} branch, {booking}.",
                ("How do I sign up for {asked} at {where}?", "Do I need to reserve {asked} at {where}, and how?",
                 "Who do I contact about {asked} at {where}?")),
}


def retrieval_set(seed: int = SEED) -> tuple[list[str], list[str], list[int]]:
    """Notes, questions, and for each question the index of the note that answers it."""
    rng = random.Random(seed)
    notes: list[str] = []
    asks: list[str] = []
    for branch, alias in BRANCHES:
        for service, asked in SERVICES:
            for note, questions in FACTS.values():
                start = rng.randint(8, 14)
                values = {"branch": branch, "service": service, "asked": asked, "day": rng.choice(DAYS),
                          "start": f"{start}:00", "end": f"{start + rng.randint(1, 4)}:00",
                          "price": f"${rng.randint(1, 12)}", "payment": rng.choice(PAYMENTS),
                          "booking": rng.choice(BOOKINGS),
                          # half the callers name the branch, half describe it
                          "where": rng.choice((branch, alias))}
                notes.append(note.format(**values))
                asks.append(rng.choice(questions).format(**values))
    answers = sorted(rng.sample(range(len(notes)), QUESTIONS))
    return notes, [asks[i] for i in answers], answers


def ingestion_chunks(count: int = INGEST_CHUNKS, words: int = CHUNK_WORDS, seed: int = SEED) -> list[str]:
    """~`words`-word passages of same-topic notes, like chunks of an uploaded FAQ."""
    notes, _, _ = retrieval_set(seed)
    rng = random.Random(seed + 1)
    chunks = []
    for _ in range(count):
        chunk: list[str] = []
        while len(chunk) < words:
            chunk.extend(rng.choice(notes).split())
        chunks.append(" ".join(chunk[:words]))
    return chunks


async def _query_latencies_ms(embedder, runs: int) -> list[float]:
    for _ in range(QUERY_WARM_UP_RUNS):
        await embedder.embed([QUESTION])
    latencies = []
    for _ in range(runs):
        started = time.perf_counter()
        await embedder.embed([QUESTION])
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def nearest_notes(embedder, notes: list[str], questions: list[str], k: int = RECALL_K) -> list[list[int]]:
    """Dense-only search: for each question, the indexes of its k most similar notes, best first."""
    note_vectors = embedder.embed_blocking(notes)
    scores = embedder.embed_blocking(questions) @ note_vectors.T  # unit rows: cosine
    return np.argsort(-scores, axis=1, kind="stable")[:, :k].tolist()


def recall_at(k: int, nearest: list[list[int]], answers: list[int]) -> float:
    return sum(answer in row[:k] for answer, row in zip(answers, nearest, strict=True)) / len(answers)


def _measure_once(embedder, query_runs: int, chunks: list[str]) -> dict:
    latencies = asyncio.run(_query_latencies_ms(embedder, query_runs))
    started = time.perf_counter()
    embedder.embed_blocking(chunks)
    elapsed = time.perf_counter() - started
    return {"query_p50_ms": percentile(latencies, 50), "query_p95_ms": percentile(latencies, 95),
            "ingest_texts_per_s": len(chunks) / elapsed}


def bench_engine(engine: str, *, repeats: int, threads: int, query_runs: int) -> dict:
    embedder = build_embedder(EmbeddingOptions(engine=engine, threads=threads, batch_size=INGEST_BATCH))
    started = time.perf_counter()
    embedder.load()
    embedder.warm_up()
    load_s = time.perf_counter() - started
    try:
        chunks = ingestion_chunks()
        rounds = [_measure_once(embedder, query_runs, chunks) for _ in range(repeats)]
        notes, questions, answers = retrieval_set()
        nearest = nearest_notes(embedder, notes, questions)
    finally:
        asyncio.run(embedder.close())
    headline = {key: round(statistics.median(r[key] for r in rounds), 2) for key in rounds[0]}
    return {"engine": engine, "model": embedder.options.model_reference, "load_s": round(load_s, 2),
            **headline, "recall_at_1": round(recall_at(1, nearest, answers), 3),
            f"recall_at_{RECALL_K}": round(recall_at(RECALL_K, nearest, answers), 3),
            "rounds": [{key: round(value, 2) for key, value in r.items()} for r in rounds], "nearest": nearest}


def run(engines: tuple[str, ...] = ENGINES, *, repeats: int = 3, threads: int = 0,
        query_runs: int = QUERY_RUNS) -> dict:
    """Benchmarks each runtime in turn (never both at once: they would share the cores)."""
    notes, questions, _ = retrieval_set()
    results = {
        "setup": {"cpu_count": os.cpu_count(), "threads": threads or "runtime default", "repeats": repeats,
                  "query_runs": query_runs, "query_words": len(QUESTION.split()),
                  "ingest_chunks": INGEST_CHUNKS, "ingest_batch": INGEST_BATCH, "chunk_words": CHUNK_WORDS,
                  "recall_notes": len(notes), "recall_questions": len(questions)},
        "engines": [bench_engine(e, repeats=repeats, threads=threads, query_runs=query_runs) for e in engines],
    }
    if len(engines) == 2:
        # Equal recall could hide different hits; this says whether the searches agree.
        first, second = (e["nearest"] for e in results["engines"])
        results["same_top_3_fraction"] = round(
            sum(a == b for a, b in zip(first, second, strict=True)) / len(first), 3)
    return results


def _table(results: dict) -> str:
    columns = ("engine", "load_s", "query_p50_ms", "query_p95_ms", "ingest_texts_per_s",
               "recall_at_1", f"recall_at_{RECALL_K}")
    rows = [columns, *[tuple(str(e[c]) for c in columns) for e in results["engines"]]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    agreement = results.get("same_top_3_fraction")
    footer = [] if agreement is None else [f"questions whose {RECALL_K} nearest notes, in order, are the same on both: {agreement}"]
    return "\n".join([json.dumps(results["setup"]), *lines, *footer])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench embedding-bench", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the full results as JSON")
    parser.add_argument("--repeats", type=int, default=3, help="measurement rounds; figures are their median")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads; 0: the runtime's default")
    parser.add_argument("--query-runs", type=int, default=QUERY_RUNS)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    args = parser.parse_args(argv)
    results = run(tuple(args.engines), repeats=args.repeats, threads=args.threads, query_runs=args.query_runs)
    print(json.dumps(results, indent=2) if args.json else _table(results))
    return 0
