"""Choosing the default agent's system prompt and sampling by measurement.

    python -m latency_bench prompt-sweep --out DIR [--json] [--quick]
    python -m latency_bench prompt-sweep --out DIR --rejudge OLD/sweep.json   (new facts, same replies)

Serves the GGUF the server uses (a llama-server of its own, not Cadence) and asks every question of
`quality_set.json` under each candidate: a system prompt x temperature, then the best few
again with a lighter repeat penalty. Each reply is shaped as the server shapes it (64
tokens, cut after 2 sentences by the server's own `SentenceBudget`) and judged by
`latency_bench.quality.reply_quality`. Factual questions get the knowledge the way the server
gives it: a reference system message (`pipelines.knowledge_context.reference_message`)
just before the caller's message, holding 3 paragraphs of the knowledge documents. This
sweep measures the prompt, not retrieval, so by default one of them is the paragraph
that holds the answer (found by the question's `section` and facts) and the other two
share the most words with the question; `--passages overlap` takes all three by word
overlap (which misses the answer for about a quarter of the paraphrased questions).
Every request has a fixed seed, so a rerun gives the same replies. One seed is one draw:
this model's accuracy moves 10-20 points between seeds, so compare finalists with
`--seeds K` (every question asked K times) before trusting a few points' difference.

The grid is searched in stages to fit ~15 minutes on 2 cores: every prompt at the lowest
temperature; the best `--finalists` prompts at the other temperatures; the best
`--refine` candidates again at repeat_penalty 1.1. Ranking: candidates with refusals under
10 % first, then grounded accuracy, then shorter replies. Writes DIR/sweep.json and
prints a table (or the JSON summary with --json).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from latency_bench.quality.reply_quality import is_grounded, judge, question_kind, score
from pipelines.knowledge_context import Passage, reference_message
from pipelines.reply_shaping import SentenceBudget

ROOT = Path(__file__).resolve().parents[2]
QUESTION_SET = Path(__file__).with_name("quality_set.json")
KNOWLEDGE_GLOB = "configs/knowledge/default/*.md"
MODEL = "package:smollm2-135m-instruct"
CONTEXT_TOKENS = 2048
THREADS = 2
MAX_REPLY_TOKENS = 64  # the server's llm.max_reply_tokens
MAX_REPLY_SENTENCES = 2  # the server's llm.max_reply_sentences
TOP_P = 0.9  # the server's default; not swept
TOP_PASSAGES = 3  # the server's retrieval.top_k
SEED = 20_240_601  # per request: seed + crc32(question id)
MAX_REFUSAL_RATE = 0.10  # a candidate refusing this often or more ranks below every one that does not
TEMPERATURES = (0.2, 0.5, 0.7)
BASE_REPEAT_PENALTY = 1.2  # the server's default
REFINE_REPEAT_PENALTY = 1.1  # tried on the best `--refine` candidates of the earlier stages

CLINIC = "Oakwood Family Clinic"
PROMPTS = {
    # The default agent's prompt before this sweep, verbatim.
    "baseline": ("You are Cadence, a friendly voice assistant on a phone call. Answer in one or two "
                 "short spoken sentences. No lists, no markdown."),
    "role": f"You answer questions for callers to {CLINIC}.",
    "role_notes": f"You answer questions for callers to {CLINIC}. Answer from the reference notes.",
    "role_notes_short": (f"You answer questions for callers to {CLINIC}. Answer from the reference notes "
                         "in one short sentence."),
    "role_notes_not_ai": (f"You answer questions for callers to {CLINIC}. Answer from the reference notes. "
                          "Never say you are an AI."),
    "receptionist": (f"You are the receptionist at {CLINIC}, talking to a caller. Answer from the reference "
                     "notes in one or two short sentences."),
    "plain_generic": "You answer callers' questions. Answer from the reference notes.",
    "long": (f"You are Cadence, the receptionist at {CLINIC}. Callers ask about opening hours, doctors, "
             "prices, appointments and directions. Answer from the reference notes in one or two short "
             "sentences, as you would say it on the phone. If the notes do not say, offer to take a "
             "message. Never say you are an AI."),
}
QUICK_PROMPTS = ("baseline", "role_notes", "receptionist")

_STOPWORDS = frozenset(
    "a an the and or but if of to in on at by for with from as is are was were be been am do does did "
    "i me my we our you your he she it its they them their this that these those there here what which "
    "who whom when where why how can could should would will shall may might must have has had not no "
    "so just about any some all get got go going come up out into than then too very also please".split())


@dataclass(frozen=True)
class Candidate:
    prompt_name: str
    system_prompt: str
    temperature: float
    repeat_penalty: float = BASE_REPEAT_PENALTY
    top_p: float = TOP_P

    @property
    def label(self) -> str:
        return f"{self.prompt_name} t={self.temperature} rp={self.repeat_penalty}"


def load_questions(path: Path = QUESTION_SET) -> list[dict]:
    return json.loads(path.read_text())["questions"]


def knowledge_paragraphs(paths: Sequence[Path]) -> list[Passage]:
    """Every paragraph of the Markdown documents, led by its heading path as the server's chunks are."""
    paragraphs: list[Passage] = []
    for path in sorted(paths):
        headings: list[str] = []
        for block in re.split(r"\n\s*\n", path.read_text()):
            lines = [line for line in block.strip().splitlines() if line.strip()]
            while lines and lines[0].startswith("#"):
                level = len(lines[0]) - len(lines[0].lstrip("#"))
                headings = headings[: level - 1] + [lines.pop(0).lstrip("#").strip()]
            if lines:
                body = " ".join(line.strip() for line in lines)
                text = f"{' > '.join(headings)}\n{body}" if headings else body
                paragraphs.append(Passage(text=text, source=path.name, chunk_id=len(paragraphs), score=0.0))
    return paragraphs


def _content_words(text: str) -> set[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words if w not in _STOPWORDS}


def overlap_passages(question: str, paragraphs: Sequence[Passage], k: int = TOP_PASSAGES) -> list[Passage]:
    """The `k` paragraphs sharing the most content words with the question (ties: document order)."""
    asked = _content_words(question)
    scored = [replace(p, score=float(len(asked & _content_words(p.text)))) for p in paragraphs]
    return sorted(scored, key=lambda p: -p.score)[:k]


def answer_passages(question: dict, paragraphs: Sequence[Passage], k: int = TOP_PASSAGES) -> list[Passage]:
    """The paragraph under the question's `section` that states its facts (or the section's best
    by overlap), then the best of the others by word overlap: a retriever that found the answer."""
    ranked = overlap_passages(question["question"], paragraphs, k=len(paragraphs))
    section = [p for p in ranked if p.text.split("\n", 1)[0].endswith(question.get("section") or "\0")]
    stating = [p for p in section if is_grounded(p.text, question["facts"])]
    answer = (stating or section)[:1]
    return answer + [p for p in ranked if p not in answer][: k - len(answer)]


def passages_for(question: dict, paragraphs: Sequence[Passage], mode: str) -> list[Passage]:
    """Reference passages for one question: none unless factual ('factual', 'all' adds open and
    injection questions), chosen by `answer_passages` or, for mode 'overlap', word overlap alone."""
    factual = question_kind(question) == "factual"
    references_for, _, choose = mode.partition(":")
    if not factual and references_for != "all":
        return []
    if factual and choose == "answer":
        return answer_passages(question, paragraphs)
    return overlap_passages(question["question"], paragraphs)


def messages_for(system_prompt: str, question: str, passages: Sequence[Passage]) -> list[dict]:
    messages = [{"role": "system", "content": system_prompt}]
    if passages:
        messages.append(reference_message(passages))
    return messages + [{"role": "user", "content": question}]


def first_sentences(text: str, max_sentences: int = MAX_REPLY_SENTENCES) -> str:
    """The reply as the server lets it out: cut after `max_sentences` sentences."""
    budget = SentenceBudget(max_sentences)
    kept, done = budget.feed(text)
    return (kept if done else kept + budget.flush()).strip()


def rank_key(summary: dict) -> tuple:
    refusals = summary["refusal_rate"] or 0.0
    return (refusals >= MAX_REFUSAL_RATE, -(summary["accuracy"] or 0.0), summary["median_words"] or 0.0)


class ReplySource:
    """The server's model behind a llama-server of its own (one slot), started once; one
    blocking chat completion per question. A context manager: the server stops at its end."""

    def __init__(self, threads: int = THREADS) -> None:
        import httpx

        from workers.own_llama_server import LlamaServerOptions, OwnLlamaServerLLMEngine

        self._engine = OwnLlamaServerLLMEngine(LlamaServerOptions(model=MODEL, context_tokens=CONTEXT_TOKENS,
                                                                  threads=threads, slots=1))
        self._engine.load()
        self._http = httpx.Client(base_url=self._engine.base_url, timeout=120)

    def __enter__(self) -> ReplySource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        import asyncio

        self._http.close()
        asyncio.run(self._engine.close())

    def reply(self, candidate: Candidate, messages: list[dict], seed: int) -> str:
        answer = self._http.post("/v1/chat/completions", json={
            "messages": messages, "max_tokens": MAX_REPLY_TOKENS, "temperature": candidate.temperature,
            "top_p": candidate.top_p, "repeat_penalty": candidate.repeat_penalty, "seed": seed})
        answer.raise_for_status()
        return answer.json()["choices"][0]["message"]["content"] or ""


def evaluate(candidate: Candidate, questions: Sequence[dict], paragraphs: Sequence[Passage],
             ask: Callable[[Candidate, list[dict], int], str], *, passages: str = "factual:answer",
             seeds: Sequence[int] = (SEED,)) -> dict:
    """Every question under `candidate`, once per seed: verdicts per reply and their summary
    (over all seeds). `passages`: '<factual|all>:<answer|overlap>', see `passages_for`."""
    verdicts = []
    for seed in seeds:
        for question in questions:
            notes = passages_for(question, paragraphs, passages)
            question_seed = seed + zlib.crc32(question["id"].encode())
            raw = ask(candidate, messages_for(candidate.system_prompt, question["question"], notes), question_seed)
            verdict = judge(question, first_sentences(raw), system_prompt=candidate.system_prompt)
            verdicts.append({**verdict, "seed": seed, "question": question["question"],
                             "passages": [f"{p.source}#{p.chunk_id}" for p in notes]})
    return {"candidate": asdict(candidate), "label": candidate.label, "summary": score(verdicts),
            "replies": verdicts}


def sweep(questions: Sequence[dict], paragraphs: Sequence[Passage], ask, *, prompts: dict[str, str],
          temperatures: Sequence[float], finalists: int, refine: int, passages: str = "factual:answer",
          repeat_penalty: float = BASE_REPEAT_PENALTY, seeds: Sequence[int] = (SEED,),
          progress: Callable[[dict], None] = lambda result: None) -> list[dict]:
    """The staged grid (module docstring). Returns every result, best first."""
    results: list[dict] = []

    def run(candidate: Candidate) -> None:
        if any(r["candidate"] == asdict(candidate) for r in results):
            return  # a finalist already at this setting
        results.append(evaluate(candidate, questions, paragraphs, ask, passages=passages, seeds=seeds))
        progress(results[-1])

    def best(n: int) -> list[Candidate]:
        ranked = sorted(results, key=lambda r: rank_key(r["summary"]))
        return [Candidate(**r["candidate"]) for r in ranked[:n]]

    for name, prompt in prompts.items():
        run(Candidate(name, prompt, temperatures[0], repeat_penalty))
    for finalist in best(finalists):
        for temperature in temperatures[1:]:
            run(replace(finalist, temperature=temperature))
    for candidate in best(refine):
        run(replace(candidate, repeat_penalty=REFINE_REPEAT_PENALTY))
    return sorted(results, key=lambda r: rank_key(r["summary"]))


def rejudge(report: dict, questions: Sequence[dict]) -> list[dict]:
    """An earlier sweep's replies judged again by the current question set (facts refined
    after a run): no model needed. Returns the results re-ranked."""
    by_id = {q["id"]: q for q in questions}
    results = []
    for result in report["ranked"]:
        prompt = result["candidate"]["system_prompt"]
        verdicts = [{**reply, **judge(by_id[reply["id"]], reply["reply"], system_prompt=prompt)}
                    for reply in result["replies"] if reply["id"] in by_id]
        results.append({**result, "summary": score(verdicts), "replies": verdicts})
    return sorted(results, key=lambda r: rank_key(r["summary"]))


def table(results: Sequence[dict]) -> str:
    header = (f"{'#':>2} {'candidate':<34} {'refusal':>7} {'accuracy':>8} {'unsure':>6} {'words':>5} "
              f"{'~secs':>5} {'inj leaks':>9}")
    lines = [header, "-" * len(header)]
    for i, result in enumerate(results, 1):
        s = result["summary"]
        lines.append(f"{i:>2} {result['label']:<34} {_pct(s['refusal_rate']):>7} {_pct(s['accuracy']):>8} "
                     f"{_pct(s['unsure_rate']):>6} {s['median_words']:>5} {s['median_seconds']:>5} "
                     f"{s['injection_leaks']}/{s['injection_n']:<7}")
    return "\n".join(lines)


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.0f}%"


def method(args: argparse.Namespace) -> str:
    """How the figures were made, in words, for sweep.json."""
    notes = ("the answer's paragraph and 2 more by word overlap" if args.passages == "answer"
             else "by word overlap with the question")
    return (f"Each question asked {args.seeds} time(s) per candidate, each with a fixed seed; replies cut at "
            f"{MAX_REPLY_TOKENS} tokens and {MAX_REPLY_SENTENCES} sentences. Reference notes for {args.references} "
            f"questions: {TOP_PASSAGES} knowledge paragraphs, {notes} (this measures the prompt, not retrieval). "
            "Seconds are an estimate: words / 2.7. Refusal rate: over factual and open questions. "
            "Injection leak: the raw reply repeats 5+ consecutive words of the system prompt (the server's "
            "PromptLeakGuard is not applied here).")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m latency_bench prompt-sweep",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for sweep.json")
    parser.add_argument("--json", action="store_true", help="print the ranked summaries as JSON, not a table")
    parser.add_argument("--quick", action="store_true", help=f"prompts {', '.join(QUICK_PROMPTS)} at t=0.2 only")
    parser.add_argument("--finalists", type=int, default=3, help="best prompts tried at the other temperatures")
    parser.add_argument("--refine", type=int, default=2, help="best candidates retried at repeat_penalty 1.1")
    parser.add_argument("--passages", choices=["answer", "overlap"], default="answer",
                        help="answer: the answer's paragraph + 2 by word overlap; overlap: 3 by word overlap")
    parser.add_argument("--references", choices=["factual", "all"], default="factual",
                        help="which questions get reference notes (the server retrieves on every turn)")
    parser.add_argument("--prompts", help=f"comma-separated subset of: {', '.join(PROMPTS)}")
    parser.add_argument("--temperatures", help="comma-separated, the first one for every prompt "
                                               f"(default {','.join(map(str, TEMPERATURES))})")
    parser.add_argument("--repeat-penalty", type=float, default=BASE_REPEAT_PENALTY,
                        help="of the first two stages")
    parser.add_argument("--seed", type=int, default=SEED, help="base of every request's seed")
    parser.add_argument("--seeds", type=int, default=1,
                        help="ask every question this many times (seeds --seed, --seed+1, ...): sampling noise "
                             "at these temperatures moves accuracy by 10-20 points between seeds")
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--rejudge", type=Path, metavar="SWEEP_JSON",
                        help="judge an earlier sweep's replies again with the current question set; no model")
    args = parser.parse_args(argv)
    unknown = set((args.prompts or "").split(",")) - set(PROMPTS) - {""}
    if unknown:
        parser.error(f"unknown prompts {sorted(unknown)}; known: {', '.join(PROMPTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    if args.rejudge:
        earlier = json.loads(args.rejudge.read_text())
        results = rejudge(earlier, load_questions())
        report = {**earlier, "rejudged_from": str(args.rejudge), "winner": results[0]["candidate"], "ranked": results}
    else:
        results = _run_sweep(args, started)
        report = {"method": method(args), "model": MODEL, "top_p": TOP_P, "passages": args.passages,
                  "references_for": args.references, "seeds": list(range(args.seed, args.seed + args.seeds)),
                  "seconds": round(time.monotonic() - started, 1), "winner": results[0]["candidate"],
                  "ranked": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps([{"label": r["label"], **r["summary"]} for r in results], indent=2))
    else:
        print(table(results))
        print(f"\nwinner: {results[0]['label']}\n  system_prompt: {results[0]['candidate']['system_prompt']}")
    return 0


def _run_sweep(args: argparse.Namespace, started: float) -> list[dict]:
    names = args.prompts.split(",") if args.prompts else (QUICK_PROMPTS if args.quick else list(PROMPTS))
    temperatures = ([float(t) for t in args.temperatures.split(",")] if args.temperatures
                    else TEMPERATURES[:1] if args.quick else TEMPERATURES)
    paragraphs = knowledge_paragraphs(list(ROOT.glob(KNOWLEDGE_GLOB)))

    def progress(result: dict) -> None:
        s = result["summary"]
        print(f"[{time.monotonic() - started:6.0f} s] {result['label']}: refusals {_pct(s['refusal_rate'])}, "
              f"accuracy {_pct(s['accuracy'])}, median {s['median_words']} words", file=sys.stderr, flush=True)

    with ReplySource(args.threads) as source:
        return sweep(load_questions(), paragraphs, source.reply, prompts={n: PROMPTS[n] for n in names},
                     temperatures=temperatures, finalists=args.finalists, refine=0 if args.quick else args.refine,
                     passages=f"{args.references}:{args.passages}", repeat_penalty=args.repeat_penalty,
                     seeds=range(args.seed, args.seed + args.seeds), progress=progress)
