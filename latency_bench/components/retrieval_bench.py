"""Knowledge retrieval at scale: latency, ingestion throughput, store size, recall.

    python -m latency_bench retrieval-bench [--sizes 1000,10000,100000] [--json] [--repeats 3]

Per size N, one agent's index of N generated clinic/shop chunks (~100 words each) plus a
second agent's 1,000, and the needle set below, in a temporary SQLite file:
  latency       query embedding + hybrid search through `KnowledgeBase.search` (thread
                hops included), QUERIES distinct questions after warm-up; p50/p95 are the
                median over `repeats` rounds, by latency_bench.stats.percentile (interpolated);
                the same without embedding, per retriever, for the breakdown
  vectors       vec0 brute-force KNN of float32, int8 and bit vectors over the same N, and
                the recall@10 of bit + cosine re-scoring against exact float32 search
  store         bytes of the database file (WAL checkpointed) per 10,000 chunks
  recall@3      each needle question: is its note among the top 3? dense, lexical, hybrid
Vectors: the first `--real` filler chunks are embedded by the real embedder; the rest are
synthetic neighbours of those (a random mix of two real vectors plus noise, normalised),
so the vector index holds realistic directions without hours of embedding. Needles and
their 500 distractors are always embedded for real. Ingestion throughput is measured once,
end to end through `KnowledgeBase.ingest` on real generated documents and the real embedder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from knowledge.base import KnowledgeBase
from knowledge.chunking import Chunk
from knowledge.connection import connect
from knowledge.index import KnowledgeIndex
from knowledge.ranking import convex_fuse, rrf_fuse
from knowledge.options import KnowledgeOptions
from latency_bench.stats import percentile
from models.base import EmbeddingEngine
from models.embedding import EmbeddingOptions, build_embedder

SEED = 20_261_203
QUERIES = 200
WARM_UP = 20
DOC_CHUNKS = 1000  # filler chunks per stored document
OTHER_AGENT_CHUNKS = 1000
VECTOR_QUERIES = 30  # per vec0 layout: each float32 query takes ~0.1 s at 100k

PLACES = ("Harbor View", "Riverside", "Oak Park", "Hillcrest", "Maple Street", "Lakeside", "Old Town",
          "Westgate", "Northfield", "Elm Grove")
ROOMS = ("waiting", "x-ray", "consultation", "treatment", "staff", "supply", "recovery", "blood test",
         "meeting", "storage")
SUPPLIES = ("gloves", "bandages", "printer paper", "hand gel", "face masks", "syringes", "paper towels", "batteries")
ITEMS = ("spare chairs", "first aid kit", "wheeled trolley", "filing cabinet", "coffee machine",
         "blood pressure monitor", "fire extinguisher", "notice board")
LOANS = ("wheelchairs", "crutches", "walking frames", "umbrellas", "phone chargers", "reading glasses")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
TEMPLATES = (
    "The {room} room at the {place} clinic was cleaned on {day}.",
    "At {place}, the {room} room was restocked with {supply} on {day}.",
    "Staff at the {place} branch moved the {item} to the {room} room on {day}.",
    "The {room} room at {place} is closed for painting until {day}.",
    "{place} reception logged a delivery of {supply} on {day}.",
    "The {item} in the {room} room at {place} was checked on {day}.",
    "The {place} clinic lends {loan} from the cupboard beside the {room} room.",
    "Patients at {place} may borrow {loan} from reception until {day}.",
)
# The needle of the unit test: its place is named nowhere else, and the question shares
# little else with it; distractors lend the same things at other places.
NEEDLE = ("The Juniper Wharf clinic lends wheelchairs from the cupboard beside the ground-floor lift.",
          "My mother can't walk far, could we borrow a chair with wheels at Juniper Wharf?")
# Paraphrased questions about places the distractors name fifty times each.
PARAPHRASE_NEEDLES = (
    ("At the Riverside pharmacy counter, repeat prescriptions are ready two working days after the request.",
     "How long until my regular medication refill is ready at Riverside?"),
    ("The Oak Park branch has free parking for patients in the multi-storey behind the bakery.",
     "Where do I leave my car when I visit Oak Park?"),
    ("Hillcrest clinic offers flu jabs without an appointment every Thursday morning.",
     "Can I just walk in for an influenza vaccination at Hillcrest?"),
    ("The Maple Street shop accepts returns of unworn shoes within 30 days with a receipt.",
     "I bought trainers at Maple Street that don't fit, can I bring them back?"),
    ("Lakeside dental surgery's emergency line for toothache after hours is 0161 555 0199.",
     "Who do I ring at Lakeside if my tooth hurts at night?"),
    ("The Old Town store gift-wraps purchases for free at the customer service desk.",
     "Will the Old Town shop wrap a present for me?"),
    ("Westgate clinic's hearing tests are done by the audiologist in room 12 on Tuesdays.",
     "When can I get my ears checked at Westgate?"),
    ("At Northfield, children under five are seen by the nurse without waiting for a doctor.",
     "Does Northfield see toddlers quickly?"),
    ("The Elm Grove branch sells gift cards in amounts from 10 to 200 pounds.",
     "Can I buy a voucher for someone at Elm Grove?"),
    ("The Harbor View clinic keeps a quiet room for anxious patients next to the pharmacy.",
     "Is there somewhere calm to wait at Harbor View if I get nervous?"),
)
# Questions that hinge on a rare name, code or number.
NAME_NEEDLES = (
    NEEDLE,
    ("Dr. Okonkwo runs the allergy clinic at Riverside on alternate Fridays.", "When is Dr Okonkwo in?"),
    ("Order reference codes starting with ZX-44 are for click-and-collect parcels.",
     "What does ZX-44 mean on my order?"),
    ("Locker 317 in the Westgate changing area is reserved for the night nurse.", "Who uses locker 317?"),
    ("The Quillon Yard annex keeps the spare crutches for loan.", "Does Quillon Yard have crutches?"),
)
SHOP_SENTENCES = (
    "Orders placed before {hour} o'clock ship the same day from the {place} warehouse.",
    "The {place} shop restocks {supply} every {day} morning.",
    "Customers can collect parcels at the {place} counter from {hour} o'clock on {day}.",
    "Opening hours at {place} change on {day} for the holiday.",
)


def _fill(template: str, rng: random.Random) -> str:
    return template.format(place=rng.choice(PLACES), room=rng.choice(ROOMS), supply=rng.choice(SUPPLIES),
                           item=rng.choice(ITEMS), loan=rng.choice(LOANS), day=rng.choice(DAYS),
                           hour=rng.randint(8, 18))


def distractor_notes(count: int = 500, seed: int = SEED) -> list[str]:
    """Distinct one-sentence notes of one topic, deterministic for a seed."""
    rng = random.Random(seed)
    seen: dict[str, None] = {}
    while len(seen) < count:
        seen.setdefault(_fill(rng.choice(TEMPLATES), rng))
    return list(seen)


def needle_set(seed: int = SEED) -> tuple[list[str], list[tuple[str, int, str]]]:
    """(notes: distractors then needles, [(question, index of its note, kind)])."""
    notes = distractor_notes(seed=seed)
    cases = []
    for kind, needles in (("paraphrase", PARAPHRASE_NEEDLES), ("name", NAME_NEEDLES)):
        for note, question in needles:
            cases.append((question, len(notes), kind))
            notes.append(note)
    return notes, cases


def filler_chunks(count: int, seed: int = SEED, words: int = 100) -> list[str]:
    """~`words`-word passages of clinic and shop notes, like chunks of uploaded FAQs."""
    rng = random.Random(seed + 1)
    templates = TEMPLATES + SHOP_SENTENCES
    chunks = []
    for _ in range(count):
        sentences: list[str] = []
        while sum(len(s.split()) for s in sentences) < words:
            sentences.append(_fill(rng.choice(templates), rng))
        chunks.append(" ".join(sentences))
    return chunks


def latency_queries(count: int = QUERIES, seed: int = SEED) -> list[str]:
    rng = random.Random(seed + 2)
    forms = ("When is the {room} room at {place} cleaned?", "Can I borrow {loan} at {place}?",
             "Where is the {item} kept at {place}?", "Do you have {supply} in stock at {place}?",
             "Is the {place} clinic open on {day}?", "What time can I collect my parcel at {place} on {day}?")
    questions = [q for _, q in PARAPHRASE_NEEDLES + NAME_NEEDLES]
    while len(questions) < count:
        questions.append(_fill(rng.choice(forms), rng))
    return questions[:count]


def synthetic_vectors(real: np.ndarray, count: int, seed: int = SEED) -> np.ndarray:
    """`count` unit vectors near the directions of `real`: a*u + (1-a)*v + noise."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 1.0, size=(count, 1)).astype(np.float32)
    mixed = a * real[rng.integers(0, len(real), count)] + (1 - a) * real[rng.integers(0, len(real), count)]
    mixed += rng.normal(0, 0.02, size=mixed.shape).astype(np.float32)
    return (mixed / np.linalg.norm(mixed, axis=1, keepdims=True)).astype(np.float32)


def _build(path: str, size: int, texts: list[str], vectors: np.ndarray, needles: tuple[list[str], np.ndarray],
           options: KnowledgeOptions) -> KnowledgeIndex:
    index = KnowledgeIndex(path, options)
    index.open()
    for start in range(0, size, DOC_CHUNKS):
        end = min(size, start + DOC_CHUNKS)
        chunks = [Chunk(texts[i % len(texts)], None, i - start, f"filler-{start}.txt") for i in range(start, end)]
        index.add_document("bench", f"filler-{start}.txt", "text", f"filler-{start}", 0, chunks, vectors[start:end])
    other = [Chunk(t, None, i, "other.txt") for i, t in enumerate(texts[:OTHER_AGENT_CHUNKS])]
    index.add_document("other", "other.txt", "text", "other", 0, other, vectors[:len(other)])
    notes, note_vectors = needles
    index.add_document("bench", "needles.txt", "text", "needles", 0,
                       [Chunk(t, None, i, "needles.txt") for i, t in enumerate(notes)], note_vectors)
    return index


def _ms(fn, runs) -> list[float]:
    out = []
    for item in runs:
        started = time.perf_counter()
        fn(item)
        out.append((time.perf_counter() - started) * 1000)
    return out


def _summary(samples: list[float]) -> dict:
    return {"p50_ms": round(percentile(samples, 50), 2), "p95_ms": round(percentile(samples, 95), 2)}


async def _search_latency(path: str, embedder: EmbeddingEngine, options: KnowledgeOptions, queries: list[str],
                          repeats: int) -> dict:
    knowledge = KnowledgeBase(path, embedder, options)
    await knowledge.open()
    try:
        for query in queries[:WARM_UP]:
            await knowledge.search("bench", query, 5)
        rounds = []
        for _ in range(repeats):
            samples = []
            for query in queries:
                started = time.perf_counter()
                await knowledge.search("bench", query, 5)
                samples.append((time.perf_counter() - started) * 1000)
            rounds.append(_summary(samples))
    finally:
        await knowledge.close()
    return {key: round(statistics.median(r[key] for r in rounds), 2) for key in rounds[0]} | {"rounds": rounds}


def _breakdown(index: KnowledgeIndex, embedder: EmbeddingEngine, queries: list[str]) -> dict:
    vectors = embedder.embed_blocking(queries)
    pairs = list(zip(queries, vectors, strict=True))
    return {
        "embed": _summary(_ms(lambda q: embedder.embed_blocking([q]), queries)),
        "hybrid_search": _summary(_ms(lambda p: index.search("bench", p[0], p[1], 5), pairs)),
        "dense_search": _summary(_ms(lambda p: index.dense_ranking("bench", p[1], 50), pairs)),
        "lexical_search": _summary(_ms(lambda p: index.lexical_ranking("bench", p[0], 50), pairs)),
    }


def _needle_recall(index: KnowledgeIndex, cases: list[tuple[str, int, str]], question_vectors: np.ndarray,
                   first_needle_id: int, options: KnowledgeOptions, agent_vectors: np.ndarray,
                   note_vectors: np.ndarray) -> dict:
    """Rank of each needle (None: not in the top 50) per retriever and per fusion function;
    `dense_exact` is its rank by exact float32 cosine over all the agent's vectors, so a
    dense miss shows whether the model or the bit quantisation lost it."""
    modes = ("dense", "lexical", "hybrid_rrf", "hybrid_convex")
    ranks = []
    for (question, note, kind), vector in zip(cases, question_vectors, strict=True):
        own = float(note_vectors[note] @ vector)
        exact = int((agent_vectors @ vector > own).sum() + (note_vectors @ vector > own).sum()) + 1
        dense = index.dense_ranking("bench", vector, options.candidate_pool)
        lexical = index.lexical_ranking("bench", question, options.candidate_pool)
        lists = {"dense": dense, "lexical": lexical,
                 "hybrid_rrf": rrf_fuse([[i for i, _ in lexical], [i for i, _ in dense]], options.rrf_k),
                 "hybrid_convex": convex_fuse(dense, lexical, options.dense_weight)}
        row = {"question": question, "kind": kind, "dense_exact": exact}
        for mode in modes:
            ids = [i for i, _ in lists[mode]]
            row[mode] = ids.index(first_needle_id + note) + 1 if first_needle_id + note in ids else None
        ranks.append(row)
    recall = {}
    for kind in ("paraphrase", "name", "all"):
        rows = [r for r in ranks if kind in ("all", r["kind"])]
        recall[kind] = {mode: round(sum(1 for r in rows if r[mode] and r[mode] <= 3) / len(rows), 3) for mode in modes}
    return {"recall_at_3": recall, "ranks": ranks}


def _vector_layouts(vectors: np.ndarray, queries: np.ndarray, k: int, *, timing: bool = True) -> dict:
    """vec0 brute-force KNN per element type, in memory, over the same vectors; and the
    recall@10 of bit KNN + cosine re-scoring against exact float32 search. Synthetic vectors
    cluster tightly around the real ones, which makes that recall a lower bound."""
    db = connect(":memory:", timeout=1)
    dims = vectors.shape[1]
    scale = 127 / max(float(np.abs(vectors).max()), 1e-6)  # int8: the range the vectors use
    layouts = {"float32": (f"float[{dims}]", "?", lambda v: v.astype(np.float32).tobytes()),
               "int8": (f"int8[{dims}]", "vec_int8(?)", lambda v: np.round(v * scale).astype(np.int8).tobytes()),
               "bit": (f"bit[{dims}]", "vec_bit(?)", lambda v: np.packbits(v > 0).tobytes())}
    out = {}
    for name, (column, wrap, encode) in layouts.items():
        if not timing and name != "bit":
            continue
        metric = "" if name == "bit" else " distance_metric=cosine"
        db.execute(f"CREATE VIRTUAL TABLE v_{name} USING vec0(id INTEGER PRIMARY KEY, e {column}{metric})")
        db.execute("BEGIN")
        db.executemany(f"INSERT INTO v_{name} (id, e) VALUES (?, {wrap})",
                       [(i + 1, encode(v)) for i, v in enumerate(vectors)])
        db.execute("COMMIT")
        sql = f"SELECT id FROM v_{name} WHERE e MATCH {wrap} AND k = ?"
        if timing:
            out[name] = _summary(_ms(lambda q: db.execute(sql, (encode(q), k)).fetchall(), queries))
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    hits = 0
    for query, truth in zip(queries, exact, strict=True):
        ids = [row[0] - 1 for row in db.execute("SELECT id FROM v_bit WHERE e MATCH vec_bit(?) AND k = ?",
                                                (np.packbits(query > 0).tobytes(), k))]
        best = np.array(ids)[np.argsort(-(vectors[ids] @ query))[:10]]
        hits += len(set(best.tolist()) & set(truth.tolist()))
    db.close()
    out["bit_rescored_recall_at_10"] = round(hits / (10 * len(queries)), 3)
    return out


def _store_bytes(path: str) -> int:
    db = connect(path, timeout=10)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def _ingest_documents(count: int = 4, seed: int = SEED) -> list[tuple[str, bytes]]:
    """Markdown FAQs of ~40 chunks each: headings, paragraphs and lists, as people write them."""
    rng = random.Random(seed + 3)
    documents = []
    for n in range(count):
        lines = [f"# {PLACES[n]} handbook", ""]
        for section in range(8):
            lines += [f"## {rng.choice(ROOMS).title()} room, part {section + 1}", ""]
            lines += [" ".join(_fill(rng.choice(TEMPLATES), rng) for _ in range(25)), ""]
            lines += [f"- {_fill(rng.choice(SHOP_SENTENCES), rng)}" for _ in range(6)] + [""]
        documents.append((f"handbook-{n}.md", "\n".join(lines).encode()))
    return documents


async def _ingestion(folder: str, embedder: EmbeddingEngine, options: KnowledgeOptions) -> dict:
    knowledge = KnowledgeBase(str(Path(folder) / "ingest.sqlite3"), embedder, options)
    await knowledge.open()
    try:
        documents = _ingest_documents()
        started = time.perf_counter()
        stored = [await knowledge.ingest("bench", name, "text/markdown", data) for name, data in documents]
        elapsed = time.perf_counter() - started
    finally:
        await knowledge.close()
    chunks = sum(d.chunk_count for d in stored)
    return {"documents": len(stored), "chunks": chunks, "seconds": round(elapsed, 2),
            "chunks_per_s": round(chunks / elapsed, 1)}


def bench_size(folder: str, size: int, data: dict, embedder: EmbeddingEngine, options: KnowledgeOptions,
               repeats: int) -> dict:
    path = str(Path(folder) / f"knowledge-{size}.sqlite3")
    started = time.perf_counter()
    index = _build(path, size, data["texts"], data["vectors"], (data["notes"], data["note_vectors"]), options)
    build_s = time.perf_counter() - started
    try:
        first_needle = index.db.execute("SELECT MIN(c.id) FROM knowledge_chunks c JOIN knowledge_documents d "
                                        "ON d.id = c.doc_id WHERE d.sha256 = 'needles'").fetchone()[0]
        latency = asyncio.run(_search_latency(path, embedder, options, data["queries"], repeats))
        breakdown = _breakdown(index, embedder, data["queries"])
        needles = _needle_recall(index, data["cases"], data["question_vectors"], first_needle, options,
                                 data["vectors"][:size], data["note_vectors"])
    finally:
        index.close()
    vectors = _vector_layouts(data["vectors"][:size], data["query_vectors"][:VECTOR_QUERIES], options.binary_candidates)
    real = data["real"]
    vectors["bit_rescored_recall_at_10_real_only"] = _vector_layouts(
        data["vectors"][:min(size, real)], data["query_vectors"][:VECTOR_QUERIES], options.binary_candidates,
        timing=False)["bit_rescored_recall_at_10"]
    total = size + OTHER_AGENT_CHUNKS + len(data["notes"])
    store = _store_bytes(path)
    return {"chunks": size, "chunks_in_file": total, "build_s": round(build_s, 1), "search": latency,
            "breakdown": breakdown, "vec0_knn": vectors, "store_bytes": store,
            "bytes_per_10k_chunks": round(store / total * 10_000), "needles": needles}


def run(sizes: list[int], *, repeats: int = 3, real: int = 2000, query_count: int = QUERIES) -> dict:
    embedder = build_embedder(EmbeddingOptions())
    embedder.load()
    embedder.warm_up()
    options = KnowledgeOptions()
    texts = filler_chunks(max(*sizes, OTHER_AGENT_CHUNKS))
    real = min(real, len(texts))
    started = time.perf_counter()
    real_vectors = embedder.embed_blocking(texts[:real])
    embed_s = time.perf_counter() - started
    vectors = np.concatenate([real_vectors, synthetic_vectors(real_vectors, len(texts) - real)])
    notes, cases = needle_set()
    queries = latency_queries(query_count)
    data = {"texts": texts, "vectors": vectors, "real": real, "notes": notes, "cases": cases, "queries": queries,
            "note_vectors": embedder.embed_blocking(notes),
            "question_vectors": embedder.embed_blocking([question for question, _, _ in cases]),
            "query_vectors": embedder.embed_blocking(queries[:VECTOR_QUERIES])}
    try:
        with tempfile.TemporaryDirectory(prefix="retrieval-bench-") as folder:
            levels = [bench_size(folder, size, data, embedder, options, repeats) for size in sizes]
            ingestion = asyncio.run(_ingestion(folder, embedder, options))
    finally:
        asyncio.run(embedder.close())
    return {"setup": {"cpu_count": os.cpu_count(), "embedder": embedder.options.model_reference,
                      "queries": len(queries), "repeats": repeats, "chunk_words": 100,
                      "real_vectors": real, "real_embedding_s": round(embed_s, 1),
                      "vectors": f"first {real} filler chunks embedded; the rest synthetic neighbours of those",
                      "binary_candidates": options.binary_candidates, "candidate_pool": options.candidate_pool,
                      "needles": len(cases), "distractors": len(notes) - len(cases)},
            "levels": levels, "ingestion": ingestion}


def _table(results: dict) -> str:
    lines = [json.dumps(results["setup"])]
    header = ("chunks", "p50_ms", "p95_ms", "embed_p50", "hybrid_p50", "dense_p50", "lexical_p50",
              "knn_f32_p50", "knn_i8_p50", "knn_bit_p50", "bit_recall10", "bit_recall10_real", "B/10k",
              "r3_dense", "r3_lexical", "r3_rrf", "r3_convex")
    rows = [header]
    for level in results["levels"]:
        b, v, r = level["breakdown"], level["vec0_knn"], level["needles"]["recall_at_3"]["all"]
        rows.append(tuple(str(x) for x in (
            level["chunks"], level["search"]["p50_ms"], level["search"]["p95_ms"], b["embed"]["p50_ms"],
            b["hybrid_search"]["p50_ms"], b["dense_search"]["p50_ms"], b["lexical_search"]["p50_ms"],
            v["float32"]["p50_ms"], v["int8"]["p50_ms"], v["bit"]["p50_ms"], v["bit_rescored_recall_at_10"],
            v["bit_rescored_recall_at_10_real_only"], level["bytes_per_10k_chunks"],
            r["dense"], r["lexical"], r["hybrid_rrf"], r["hybrid_convex"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    for level in results["levels"]:
        lines.append(f"needle ranks at {level['chunks']} chunks "
                     "(exact float dense / dense / lexical / hybrid rrf / hybrid convex):")
        lines += [f"  {r['kind']:<10} " + " ".join(f"{str(r[m]):>4}" for m in ("dense_exact", "dense", "lexical",
                                                                              "hybrid_rrf", "hybrid_convex"))
                  + f"  {r['question']}"
                  for r in level["needles"]["ranks"]]
    lines.append(f"ingestion: {json.dumps(results['ingestion'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench retrieval-bench", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated chunk counts")
    parser.add_argument("--repeats", type=int, default=3, help="latency rounds; p50/p95 are their median")
    parser.add_argument("--real", type=int, default=2000, help="filler chunks embedded for real")
    parser.add_argument("--queries", type=int, default=QUERIES)
    parser.add_argument("--json", action="store_true", help="print the full results as JSON")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    results = run(sizes, repeats=args.repeats, real=args.real, query_count=args.queries)
    print(json.dumps(results, indent=2) if args.json else _table(results))
    return 0
