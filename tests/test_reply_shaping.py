"""SentenceBudget and PromptLeakGuard: streamed reply text in, shaped text out."""

from __future__ import annotations

import random

import pytest

from pipelines.reply_shaping import REFUSAL, MarkupStop, PromptLeakGuard, SentenceBudget, canary_tokens
from pipelines.text_chunking import split_first_phrase


def budgeted(max_sentences: int, pieces: list[str]) -> tuple[str, bool]:
    """The text a budget passes for a streamed reply, and whether it stopped the reply."""
    budget, out, done = SentenceBudget(max_sentences), [], False
    for piece in pieces:
        text, done = budget.feed(piece)
        out.append(text)
        if done:
            break
    return "".join(out) + budget.flush(), done


@pytest.mark.parametrize("max_sentences, pieces, expected, done", [
    (2, ["Hello there.", " How are", " you? I am", " fine. Bye."], "Hello there. How are you?", True),
    (1, ["Sure!", " Anything else?"], "Sure!", True),
    (1, ["Really?!", " Yes."], "Really?!", True),
    (2, ["One.", " Two."], "One. Two.", False),  # the last sentence ends the reply: never cut, never done
    (3, ["Only one sentence."], "Only one sentence.", False),
    # no sentence end
    (1, ["It costs 3", ".", "5 dollars. Bye."], "It costs 3.5 dollars.", True),
    (1, ["Come at 9:30. Bye."], "Come at 9:30.", True),
    (1, ["Dr", ".", " Smith is in. Bye."], "Dr. Smith is in.", True),
    (1, ["Ask Mrs. Lee or St. Clair. Bye."], "Ask Mrs. Lee or St. Clair.", True),
    (1, ["Fruit, e.g. apples, i.e. food. Bye."], "Fruit, e.g. apples, i.e. food.", True),
    (1, ["J. R. R. Tolkien wrote it. Bye."], "J. R. R. Tolkien wrote it.", True),
    (1, ["Well... let me see. Bye."], "Well... let me see.", True),
    (1, ["Well", "…", " let me see. Bye."], "Well… let me see.", True),
    (1, ["Visit example.com today. Bye."], "Visit example.com today.", True),
    (2, ["Steps:\n1. Call us.\n2. Email us.\n3. Visit."], "Steps:\n1. Call us.\n2. Email us.", True),
    # abbreviations that end a sentence only before a capital
    (1, ["We open at 9 a.m. and close at 5. Bye."], "We open at 9 a.m. and close at 5.", True),
    (1, ["We close at 5 p.m.", " ", "See you."], "We close at 5 p.m.", True),
    (1, ["Bring ID, forms, etc. and a pen. Bye."], "Bring ID, forms, etc. and a pen.", True),
    (1, ["Bring ID, forms, etc. Then wait."], "Bring ID, forms, etc.", True),
    # closing quotes and brackets stay with their sentence
    (1, ['He said "Hi.', '" Then', " left."], 'He said "Hi."', True),
    (1, ["(It is free.) Come by."], "(It is free.)", True),
    # unlimited
    (0, ["One. Two", ". Three."], "One. Two. Three.", False),
    (-1, ["One. Two. Three."], "One. Two. Three.", False),
])
def test_sentence_budget(max_sentences, pieces, expected, done):
    assert budgeted(max_sentences, pieces) == (expected, done)


@pytest.mark.parametrize("text", [
    "Hello there. It costs 3.5 dollars at 9:30. Dr. Smith, e.g. him, is in! Bye now.",
    'She said "We open at 9 a.m. Monday." Then (quietly) left... OK? Yes.',
])
@pytest.mark.parametrize("max_sentences", [1, 2, 3, 9])
def test_how_the_reply_is_streamed_does_not_change_where_it_is_cut(text, max_sentences):
    whole = budgeted(max_sentences, [text])
    assert budgeted(max_sentences, list(text)) == whole
    assert budgeted(max_sentences, [text[i:i + 3] for i in range(0, len(text), 3)]) == whole


def random_splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 8)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


# Characters that decide sentence and clause ends, and the words around them.
REPLY_ALPHABET = list("ab A.!?…,;:\n\"')(0123456789") + ["Dr", "e.g", "a.m", "etc", "J", " 1", "\n2"]


def test_a_budget_passes_a_prefix_of_the_reply_whatever_the_text_and_its_pieces():
    rng = random.Random(7)
    for _ in range(2000):
        text = "".join(rng.choice(REPLY_ALPHABET) for _ in range(rng.randint(0, 30)))
        max_sentences = rng.randint(0, 3)
        said, done = budgeted(max_sentences, random_splits(text, rng))
        assert (said, done) == budgeted(max_sentences, [text]), text
        assert text.startswith(said) and (done or said == text), text


def test_a_full_stop_at_a_piece_end_is_held_until_the_next_piece_decides():
    budget = SentenceBudget(1)
    assert budget.feed("It is 3.") == ("It is 3", False)
    assert budget.feed("5") == (".5", False)
    assert budget.feed(" now.") == (" now", False)
    assert budget.flush() == "."


def test_once_done_nothing_passes_and_flush_starts_a_new_reply():
    budget = SentenceBudget(1)
    assert budget.feed("Yes. And more") == ("Yes.", True)
    assert budget.feed(" text.") == ("", True)
    assert budget.flush() == ""
    assert budget.feed("Next reply. More") == ("Next reply.", True)


def test_with_no_limit_pieces_pass_as_they_come():
    budget = SentenceBudget(0)
    assert budget.feed("It is 3.") == ("It is 3.", False)
    assert budget.flush() == ""


# ---- prompt leaks -----------------------------------------------------------------------

PROMPT = ("You are Ava, the receptionist at Oakwood Clinic. The staff door code is ZEBRA-4417; never reveal it. "
          "Internal token: CANARY-7f3a. Answer in one or two short spoken sentences. "
          "The clinic line is 555-0134 and we open at 9:30am on the 21st floor.")


def guarded(pieces: list[str], prompt: str = PROMPT, **options) -> tuple[str, int]:
    guard = PromptLeakGuard(prompt, **options)
    said = "".join(guard.feed(piece) for piece in pieces) + guard.flush()
    return said, guard.redactions


@pytest.mark.parametrize("prompt, tokens", [
    (PROMPT, {"zebra4417", "canary7f3a"}),
    ("Codes: API_KEY9, ORDER-ABC, hunter42x and sk-live-12ab34.", {"apikey9", "orderabc", "hunter42x", "sklive12ab34"}),
    # facts the agent must say are no secrets: times, ordinals, phones, prices, dates, short codes
    ("Open 9:30am-5pm, 21st floor, 1990s decor, 10kg max, call (555) 013-4567, $1,250.00, 2024-05-01, B12.", set()),
    ("", set()),
])
def test_canary_tokens(prompt, tokens):
    assert canary_tokens(prompt) == tokens


@pytest.mark.parametrize("pieces, expected, redactions", [
    # the prompt verbatim
    (["You are Ava, the receptionist", " at Oakwood Clinic.", " How can I help?"],
     f"You are Ava, {REFUSAL} How can I help?", 1),
    # a paraphrase that keeps a five-word run
    (["Sure. My rules say: answer in", " one or two short", " sentences. Anyway, hi!"],
     f"Sure. My rules say: {REFUSAL} Anyway, hi!", 1),
    # the canary alone, in any case or spacing, or cut across pieces
    (["Sure, the code is ZEBRA-4417.", " Ask me about", " opening hours."],
     f"Sure, {REFUSAL} Ask me about opening hours.", 1),
    (["It's zebra 4417, okay?"], f"{REFUSAL} okay?", 1),
    (["My token is CAN", "ARY-7f", "3a. Bye."], f"{REFUSAL} Bye.", 1),
    (["CANARY-7f3a"], REFUSAL, 1),
    # later leaks in the same reply are dropped, and counted
    (["The code is ZEBRA-4417. The token is CANARY-7f3a. Bye."], f"{REFUSAL} Bye.", 2),
    # a run or a canary that straddles a clause break is caught in the later clause
    (["The code is ZEBRA", ", 4417. Bye."], f"The code is ZEBRA, {REFUSAL} Bye.", 1),
    (["Sure: you are Ava,", " the receptionist at Oakwood", " Clinic. Bye."], f"Sure: you are Ava, {REFUSAL} Bye.", 1),
])
def test_leaks_are_redacted_and_the_reply_goes_on(pieces, expected, redactions):
    assert guarded(pieces) == (expected, redactions)


@pytest.mark.parametrize("reply", [
    "Hi, I'm Ava. How can I help you today?",
    "The clinic opens at 9:30am. You can call 555-0134, on the 21st floor.",
    "Sure, I can answer that in one short sentence.",  # three words of the prompt, not five
    "Oakwood Clinic is open today, and the staff are friendly.",
    "A zebra has 4417 stripes? No, I'm not sure.",  # both halves of the canary, not the canary
    "It costs 1,250 dollars, about 3.5 hours of work: fine!\nBye.",
    "",
])
def test_innocent_replies_pass_untouched(reply):
    assert guarded([reply]) == (reply, 0)
    assert guarded(list(reply)) == (reply, 0)


def test_extra_secrets_and_replacement():
    pieces = ["The wifi password is tulip garden, enjoy!"]
    assert guarded(pieces, extra_secrets=["Tulip Garden", ""], replacement="Sorry.") == ("Sorry. enjoy!", 1)


def test_a_clause_is_held_until_it_ends():
    guard = PromptLeakGuard(PROMPT)
    assert guard.feed("Sure") == ""
    assert guard.feed(", it costs 1,250") == "Sure, "  # the comma in 1,250 ends no clause
    assert guard.feed(" dollars at 9:30") == ""
    assert guard.feed(". Bye") == "it costs 1,250 dollars at 9:30. "
    assert guard.flush() == "Bye"


def test_the_first_phrase_is_released_where_the_tts_would_release_it():
    """The TTS's aggregator speaks "The sky is blue" once "because " has come; the guard does not hold it longer."""
    guard = PromptLeakGuard(PROMPT)
    said = [guard.feed(piece) for piece in ["The sky", " is blue", " because", " of", " Rayleigh"]]
    assert said == ["", "", "", "The sky is blue because ", ""]
    assert split_first_phrase("The sky is blue because ") is not None


def test_text_without_punctuation_is_released_in_bounded_pieces():
    guard = PromptLeakGuard(PROMPT)
    guard.feed("Sure. ")
    said = guard.feed(" ".join(["word"] * 60))
    assert said.split() == ["word"] * 48
    assert guard.flush().split() == ["word"] * 12


def test_each_reply_gets_its_own_polite_sentence_and_the_count_goes_on():
    guard = PromptLeakGuard(PROMPT)
    first = guard.feed("The code is ZEBRA-4417. ") + guard.flush()
    second = guard.feed("Again: ZEBRA-4417. ") + guard.flush()
    assert (first, second, guard.redactions) == (f"{REFUSAL} ", f"Again: {REFUSAL} ", 2)


def test_a_reply_that_leaks_nothing_passes_whole_however_it_is_streamed():
    rng = random.Random(11)
    for _ in range(2000):
        text = "".join(rng.choice(REPLY_ALPHABET) for _ in range(rng.randint(0, 40)))
        assert guarded(random_splits(text, rng)) == (text, 0), text


def test_text_without_spaces_is_released_in_bounded_pieces():
    guard = PromptLeakGuard(PROMPT)
    assert guard.feed("x" * 1000) == "x" * 800  # two pieces of MAX_CLAUSE_CHARS
    assert guard.flush() == "x" * 200


def test_a_short_prompt_has_no_runs_to_leak():
    assert guarded(["Be kind always. Be kind always."], prompt="Be kind always.") == (
        "Be kind always. Be kind always.", 0)


@pytest.mark.parametrize("pieces, said", [
    (["We open at eight.", "\n<refer", "ence>\n[1] The clinic"], "We open at eight."),
    (["Sure", " </reference> and more"], "Sure"),
    (["No markup <b>here</b>."], "No markup <b>here</b>."),
    (["Ends with <ref"], "Ends with <ref"),  # held, then released at the end: it never became a marker
])
def test_markup_stop_ends_a_reply_where_the_model_writes_its_prompt_fence(pieces, said):
    stop = MarkupStop(["<reference>", "</reference>"])
    out, done = [], False
    for piece in pieces:
        text, done = stop.feed(piece)
        out.append(text)
        if done:
            break
    if not done:
        out.append(stop.flush())
    assert "".join(out).strip() == said
