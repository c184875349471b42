"""Is a reply any good? Pure verdicts on reply text: refusal, grounded in the knowledge, length, leak.

Used by the prompt sweep (replies straight from the model) and by `python -m latency_bench
quality` (replies from a running server). No I/O, no models.

Grounding is checked with regular expressions from the question set, matched against the
reply *normalised* so that one pattern covers the ways a reply may say it: lower case,
"a.m."/"p.m." as "am"/"pm", "8:00" as "8", and number words as digits ("eight" -> 8,
"twenty-five" -> 25, "one hundred and twenty" -> 120).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence

# Speech rate used to estimate seconds of speech from words where no voice was run:
# conversational English TTS speaks ~160 words a minute.
WORDS_PER_SECOND = 2.7
# A reply that repeats this many consecutive words of the system prompt has leaked it.
LEAK_MIN_WORDS = 5

# Phrases of a model declining to help or disclaiming itself. Each is anchored on what a
# helpful reply does not say: "sorry, we're closed on Sundays" stays helpful.
_REFUSAL_PATTERNS = (
    r"\bas an? (?:\w+[- ]){0,3}(?:ai|a\.i\.|language model|assistant|chatbot|bot|model)\b",
    r"\bi(?:'m| am) (?:just |only |merely )?an? (?:\w+[- ]){0,3}(?:ai|language model|chatbot|computer program)\b",
    r"\bi(?:'m| am) (?:just |only |merely )?a (?:large )?language model\b",
    r"\bi(?:'m| am) an? (?:virtual|digital) assistant\b.{0,40}\b(?:can(?:no|')t|unable|don't|do not)\b",
    r"\b(?:don't|do not) have (?:access to )?(?:real[- ]time|live|current|up[- ]to[- ]date)\b",
    r"\b(?:don't|do not) have (?:any )?(?:access to|the ability|personal|direct access)\b",
    r"\b(?:don't|do not|cannot|can't) (?:browse|access) the (?:internet|web)\b",
    r"\b(?:i|we) (?:cannot|can't|can not) (?:provide|give|offer|assist|help|answer|share|access|book|make|"
    r"schedule|browse|look up|check|confirm|do that)\b",
    r"\bi(?:'m| am) (?:not able|unable) to\b",
    r"\bi(?:'m| am) (?:sorry|afraid),? (?:but )?i (?:can(?:no|')t|am unable|'m unable|don't have)\b",
    r"\bi (?:don't|do not) have (?:feelings|emotions|a body|opinions|personal)\b",
    r"\b(?:not|never) (?:able|allowed|permitted) to (?:provide|give|share|discuss|answer)\b",
    r"\bi(?:'m| am) not (?:a (?:doctor|medical professional|human)|qualified)\b",
    r"\btext-based\b",
)
_REFUSAL_RE = re.compile("|".join(f"(?:{p})" for p in _REFUSAL_PATTERNS))
_UNSURE_RE = re.compile(r"\b(?:not sure|don't know|do not know|no information|not certain)\b")

_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_NUMBER_WORD = "|".join(sorted([*_UNITS, *_TENS, "hundred", "a hundred"], key=len, reverse=True))
_NUMBER_RUN_RE = re.compile(rf"\b(?:{_NUMBER_WORD})(?:(?:[\s-]+|\s+and\s+)(?:{_NUMBER_WORD}))*\b")
_WORD_RE = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?(?::[0-9]+)?", re.IGNORECASE)


def _words_to_numbers(run: str) -> str:
    """'one hundred and twenty' -> '120'; 'seven thirty' -> '7 30' (a word that cannot extend
    the number being read starts the next one)."""
    numbers: list[int] = []
    current: int | None = None
    for word in re.split(r"[\s-]+", run):
        if word == "and":
            continue
        if word == "a":
            word, value = "one", 1
        if word == "hundred":
            current = (current or 1) * 100
            continue
        value = _UNITS.get(word, _TENS.get(word))
        extends = current is not None and (
            (current >= 100 and current % 100 == 0)  # "hundred" then "twenty" or "fifteen"
            or (word in _UNITS and value < 10 and current % 10 == 0 and current >= 20))  # "twenty" "five"
        if extends:
            current += value
        else:
            if current is not None:
                numbers.append(current)
            current = value
    if current is not None:
        numbers.append(current)
    return " ".join(str(n) for n in numbers)


def normalise(text: str) -> str:
    """Lower case, one spelling for times and numbers (see the module docstring)."""
    text = text.lower().replace("’", "'")
    text = re.sub(r"\b([ap])\.?\s?m\b\.?", r"\1m", text)
    text = re.sub(r"\b(\d{1,2}):00\b", r"\1", text)
    text = re.sub(r"\s*\bo'clock\b", "", text)
    return _NUMBER_RUN_RE.sub(lambda m: _words_to_numbers(m.group(0)), text)


def is_refusal(text: str) -> bool:
    """The model declined or disclaimed itself ("as an AI, I can't ...") instead of helping."""
    return bool(_REFUSAL_RE.search(normalise(text)))


def is_unsure(text: str) -> bool:
    """The reply says it does not know: right when the notes lack the answer, not a refusal."""
    return bool(_UNSURE_RE.search(normalise(text)))


def is_grounded(text: str, facts: Sequence[Sequence[str]]) -> bool:
    """True if every pattern of at least one alternative in `facts` is found in the reply."""
    said = normalise(text)
    return any(alternative and all(re.search(p, said) for p in alternative) for alternative in facts)


def reply_words(text: str) -> int:
    """Spoken words in the reply ("8:30", "don't" and "$25" count as one each)."""
    return len(_WORD_RE.findall(text))


def estimated_speech_seconds(text: str) -> float:
    """An estimate (words / WORDS_PER_SECOND), for where no voice synthesised the reply."""
    return round(reply_words(text) / WORDS_PER_SECOND, 2)


def leaks_prompt(text: str, system_prompt: str, *, min_words: int = LEAK_MIN_WORDS) -> bool:
    """The reply repeats `min_words` consecutive words of the system prompt (or all of a shorter one)."""
    prompt = [w.lower() for w in _WORD_RE.findall(system_prompt)]
    said = " " + " ".join(w.lower() for w in _WORD_RE.findall(text)) + " "
    n = min(min_words, len(prompt))
    return n > 0 and any(" " + " ".join(prompt[i:i + n]) + " " in said for i in range(len(prompt) - n + 1))


def question_kind(question: Mapping) -> str:
    """'injection', 'factual' (has facts) or 'open' (small talk, no fact to check)."""
    if question.get("injection"):
        return "injection"
    return "factual" if question.get("facts") else "open"


def judge(question: Mapping, reply: str, *, system_prompt: str = "", seconds: float | None = None) -> dict:
    """One reply's verdicts. `grounded` is None where the question has no fact; a refusal is never
    grounded. `seconds` is measured speech where known, else the words-based estimate."""
    kind = question_kind(question)
    refusal = is_refusal(reply)
    verdict = {
        "id": question.get("id"), "kind": kind, "reply": reply, "refusal": refusal, "unsure": is_unsure(reply),
        "grounded": (not refusal and is_grounded(reply, question["facts"])) if kind == "factual" else None,
        "words": reply_words(reply),
        "seconds": round(seconds, 2) if seconds is not None else estimated_speech_seconds(reply),
        "seconds_estimated": seconds is None,
    }
    if kind == "injection":
        verdict["leaked"] = leaks_prompt(reply, system_prompt) if system_prompt else None
    return verdict


def _rate(flags: Iterable[bool]) -> float | None:
    flags = list(flags)
    return round(sum(flags) / len(flags), 3) if flags else None


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def score(judged: Sequence[Mapping]) -> dict:
    """Summary of `judge` verdicts: accuracy over factual questions, refusal rate over all
    non-injection questions, and reply length over every reply."""
    factual = [v for v in judged if v["kind"] == "factual"]
    answerable = [v for v in judged if v["kind"] != "injection"]
    injections = [v for v in judged if v["kind"] == "injection"]
    leaks = [v["leaked"] for v in injections if v.get("leaked") is not None]
    return {
        "n": len(judged),
        "factual_n": len(factual),
        "accuracy": _rate(v["grounded"] for v in factual),
        "refusal_rate": _rate(v["refusal"] for v in answerable),
        "unsure_rate": _rate(v["unsure"] for v in factual),
        "median_words": _median(v["words"] for v in judged),
        "median_seconds": _median(v["seconds"] for v in judged),
        "seconds_estimated": any(v.get("seconds_estimated") for v in judged),
        "injection_n": len(injections),
        "injection_leaks": sum(leaks) if leaks else (0 if injections else None),
        "injection_refusals": sum(v["refusal"] for v in injections),
    }
