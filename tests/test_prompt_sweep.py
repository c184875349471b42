"""The prompt sweep's pure parts: knowledge paragraphs, passages, reply cut, staged grid and ranking.
The model itself is faked: these tests check the sweep's bookkeeping, not SmolLM2."""

from __future__ import annotations

from latency_bench.quality import prompt_sweep as sweep_mod
from latency_bench.quality.prompt_sweep import (MAX_REFUSAL_RATE, PROMPTS, ROOT, KNOWLEDGE_GLOB, Candidate,
                                                answer_passages, first_sentences, knowledge_paragraphs, load_questions,
                                                messages_for, rank_key, sweep, table)
from latency_bench.quality.reply_quality import is_grounded
from pipelines.knowledge_context import REFERENCE_OPEN

PARAGRAPHS = knowledge_paragraphs(sorted(ROOT.glob(KNOWLEDGE_GLOB)))
QUESTIONS = load_questions()


def test_paragraphs_carry_their_heading_path() -> None:
    assert len(PARAGRAPHS) >= 20
    assert all("\n" in p.text and not p.text.startswith("#") for p in PARAGRAPHS)
    hours = [p for p in PARAGRAPHS if p.text.split("\n")[0].endswith("> Opening hours")]
    assert len(hours) == 1 and "Wednesday" in hours[0].text
    assert [p.chunk_id for p in PARAGRAPHS] == list(range(len(PARAGRAPHS)))


def test_knowledge_answers_every_factual_question_in_its_section() -> None:
    for question in (q for q in QUESTIONS if q.get("facts")):
        passages = answer_passages(question, PARAGRAPHS)
        assert len(passages) == 3 and len({p.chunk_id for p in passages}) == 3
        assert passages[0].text.split("\n")[0].endswith(question["section"]), question["id"]
        assert is_grounded(passages[0].text, question["facts"]), question["id"]


def test_references_sit_just_before_the_question() -> None:
    messages = messages_for("Be brief.", "When do you open?", PARAGRAPHS[:2])
    assert [m["role"] for m in messages] == ["system", "system", "user"]
    assert REFERENCE_OPEN in messages[1]["content"] and messages[2]["content"] == "When do you open?"
    assert len(messages_for("Be brief.", "Hi", [])) == 2


def test_reply_is_cut_after_two_sentences() -> None:
    assert first_sentences("Dr. Okafor sees kids. He works Mondays. He is nice.") == \
        "Dr. Okafor sees kids. He works Mondays."
    assert first_sentences("We open at 8 a.m. on weekdays") == "We open at 8 a.m. on weekdays"


def test_rank_puts_frequent_refusers_last_then_accuracy_then_brevity() -> None:
    def s(refusals: float, accuracy: float, words: float) -> dict:
        return {"refusal_rate": refusals, "accuracy": accuracy, "median_words": words}

    ranked = sorted([s(MAX_REFUSAL_RATE, 0.9, 5), s(0.0, 0.5, 30), s(0.05, 0.5, 12), s(0.0, 0.6, 40)], key=rank_key)
    assert ranked == [s(0.0, 0.6, 40), s(0.05, 0.5, 12), s(0.0, 0.5, 30), s(MAX_REFUSAL_RATE, 0.9, 5)]


def test_staged_grid_with_a_fake_model() -> None:
    asked: list[tuple[str, float, float, int]] = []

    def ask(candidate: Candidate, messages: list[dict], seed: int) -> str:
        asked.append((candidate.prompt_name, candidate.temperature, candidate.repeat_penalty, seed))
        if candidate.prompt_name == "baseline":
            return "I'm sorry, but as a text-based AI, I don't have that information."
        notes = messages[1]["content"] if len(messages) == 3 else ""
        return notes.split("[1] ", 1)[1].split("\n", 1)[1] if "[1] " in notes else "Hello, how can I help?"

    questions = [q for q in QUESTIONS if q.get("facts")][:4] + [q for q in QUESTIONS if not q.get("facts")][:3]
    prompts = {k: PROMPTS[k] for k in ("baseline", "role", "role_notes")}
    results = sweep(questions, PARAGRAPHS, ask, prompts=prompts, temperatures=(0.2, 0.5), finalists=2, refine=1)
    assert len(results) == 3 + 2 * 1 + 1
    assert len(asked) == len(results) * len(questions)
    assert results[-1]["candidate"]["prompt_name"] == "baseline"  # refuses every time
    assert results[-1]["summary"]["refusal_rate"] == 1.0
    assert results[0]["summary"]["accuracy"] > 0  # read out the answer paragraph's first two sentences
    seeds = {(name, t, rp): [s for n, tt, r, s in asked if (n, tt, r) == (name, t, rp)]
             for name, t, rp, _ in asked}
    assert len({tuple(v) for v in seeds.values()}) == 1  # the same seed per question for every candidate
    assert "baseline t=0.2" in table(results)
    assert sweep_mod.REFINE_REPEAT_PENALTY in {r["candidate"]["repeat_penalty"] for r in results}


def test_rejudge_scores_stored_replies_with_the_current_facts() -> None:
    question = next(q for q in QUESTIONS if q["id"] == "summit_direct")
    replies = [{"id": "summit_direct", "reply": "Yes, it works, with no extra charge.", "grounded": True},
               {"id": "summit_direct", "reply": "We don't accept Summit Direct plans.", "grounded": False},
               {"id": "dropped_from_the_set", "reply": "Hello."}]
    candidate = {"prompt_name": "role", "system_prompt": PROMPTS["role"], "temperature": 0.2,
                 "repeat_penalty": 1.2, "top_p": 0.9}
    report = {"ranked": [{"candidate": candidate, "label": "role", "summary": {}, "replies": replies}]}
    [result] = sweep_mod.rejudge(report, [question])
    assert [r["grounded"] for r in result["replies"]] == [False, True]
    assert result["summary"]["accuracy"] == 0.5 and result["summary"]["n"] == 2


def test_every_seed_asks_every_question_once() -> None:
    seen: list[int] = []

    def ask(candidate: Candidate, messages: list[dict], seed: int) -> str:
        seen.append(seed)
        return "We open at 8."

    questions = [q for q in QUESTIONS if q.get("facts")][:3]
    result = sweep_mod.evaluate(Candidate("role", PROMPTS["role"], 0.2), questions, PARAGRAPHS, ask, seeds=(1, 2))
    assert len(result["replies"]) == 6 and len(set(seen)) == 6
    assert [r["seed"] for r in result["replies"]] == [1, 1, 1, 2, 2, 2]
    assert result["summary"]["factual_n"] == 6
