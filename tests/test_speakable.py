"""speakable: reply text -> words a TTS voice can say; and the voices that use it."""

from __future__ import annotations

import random

import pytest
from pipecat.frames.frames import TTSSpeakFrame, TTSTextFrame
from pipecat.tests.utils import run_test

from pipelines.speakable import digit_words, number_words, ordinal_words, speakable
from pipelines.frames import TTSSentenceTimingFrame
from pipelines.tts import EngineTTSService, OrpheusTTSService
from tests.fakes import ToneTTS


@pytest.mark.parametrize("n, words", [
    (0, "zero"), (7, "seven"), (13, "thirteen"), (20, "twenty"), (42, "forty-two"), (99, "ninety-nine"),
    (100, "one hundred"), (105, "one hundred five"), (1250, "one thousand two hundred fifty"),
    (1_000_000, "one million"), (2_000_017, "two million seventeen"),
    (10**12 + 1, "one trillion one"),
])
def test_number_words(n, words):
    assert number_words(n) == words


@pytest.mark.parametrize("n, words", [
    (1, "first"), (2, "second"), (3, "third"), (4, "fourth"), (5, "fifth"), (8, "eighth"), (9, "ninth"),
    (12, "twelfth"), (20, "twentieth"), (21, "twenty-first"), (100, "one hundredth"), (103, "one hundred third"),
])
def test_ordinal_words(n, words):
    assert ordinal_words(n) == words


def test_digit_words_skip_anything_but_ascii_digits():
    assert digit_words("0-13") == "zero one three"


SPOKEN = [
    # markdown
    ("## Opening hours", "Opening hours"),
    ("We are **open** on *weekdays* and __Saturdays__.", "We are open on weekdays and Saturdays."),
    ("Run `make setup` first.", "Run make setup first."),
    ("[Book here](https://example.com/book) today.", "Book here today."),
    ("- Cardiology\n- Dermatology", "Cardiology. Dermatology"),
    ("Options:\n1. Call us\n2) Email us", "Options: Call us. Email us"),
    ("> A quoted note.", "A quoted note."),
    ("| Day | Hours |\n|---|:---:|\n| Tue | 9-5 |", "Day, Hours. Tuesday, nine to five"),
    ("---", ""),
    ("```\nsay hi\n```", "say hi"),
    ("Answer [1] and [2, 3] differ.", "Answer and differ."),
    ("Press * then #.", "Press star then pound."),
    ("snake_case names", "snake case names"),
    # addresses
    ("Visit https://www.example.com/book.", "Visit example dot com slash book."),
    ("See http://Example.COM/Care-Team?x=1#top now", "See example dot com slash Care dash Team now"),
    ("Go to www.oakwood-clinic.com, then call.", "Go to oakwood dash clinic dot com, then call."),
    ("It's on example.org/faq", "It's on example dot org slash faq"),
    ("Write to front.desk@oakwood-clinic.com.", "Write to front dot desk at oakwood dash clinic dot com."),
    ("Mail j_smith+2@Mail.Example.com", "Mail j underscore smith plus two at mail dot example dot com"),
    ("Type https:// first", "Type first"),
    # numbers
    ("I have 42 apples.", "I have forty-two apples."),
    ("That's 1,250 people.", "That's one thousand two hundred fifty people."),
    ("About 3.5 hours.", "About three point five hours."),
    ("Take 0.25 of it", "Take zero point two five of it"),
    ("The 1st, 2nd, 3rd and 21st.", "The first, second, third and twenty-first."),
    ("Save 20%!", "Save twenty percent!"),
    ("Save 10-20% now", "Save ten to twenty percent now"),
    ("It's -5 outside", "It's minus five outside"),
    ("Room42 is free", "Room forty-two is free"),
    ("Order 48213 shipped", "Order four eight two one three shipped"),
    ("Agent 007", "Agent zero zero seven"),
    ("Built in 1990, rebuilt 2024.", "Built in nineteen ninety, rebuilt two thousand twenty-four."),
    ("In 1905 for 1500 guests", "In nineteen oh five for fifteen hundred guests"),
    ("Version 1.2.3", "Version one dot two dot three"),
    ("Ages 5-10 welcome", "Ages five to ten welcome"),
    ("a 50-50 chance", "a fifty fifty chance"),
    ("Open 24/7.", "Open twenty-four seven."),
    ("Dial 911.", "Dial nine one one."),
    ("It's 72°F.", "It's seventy-two degrees Fahrenheit."),
    ("Ask for No. 5 or #6", "Ask for Number five or number six"),  # "No." keeps its capital
    # phone numbers
    ("Call 555-0134.", "Call five five five, zero one three four."),
    ("Call (555) 013-4567 now", "Call five five five, zero one three, four five six seven now"),
    ("Call 555.013.4567", "Call five five five, zero one three, four five six seven"),
    ("Call +1 555 013 4567", "Call plus one, five five five, zero one three, four five six seven"),
    ("Call 1-800-555-0134", "Call one, eight zero zero, five five five, zero one three four"),
    # times
    ("Come at 9:30", "Come at nine thirty"),
    ("Come at 9:30am", "Come at nine thirty A M"),
    ("Come at 9:30 AM.", "Come at nine thirty A M."),
    ("Come at 9:00 AM", "Come at nine A M"),
    ("Come at 9 a.m.", "Come at nine A M."),
    ("Come at 9 a.m. or later", "Come at nine A M or later"),
    ("Come at 7pm.", "Come at seven P M."),
    ("Come at 9.30 a.m. daily", "Come at nine thirty A M daily"),
    ("Come at 9.30 daily", "Come at nine point three zero daily"),
    ("Come at 10:05", "Come at ten oh five"),
    ("Come at 14:00", "Come at two P M"),
    ("Come at 00:30", "Come at twelve thirty A M"),
    ("Come at 12:00", "Come at twelve o'clock"),
    ("Come at 9:00", "Come at nine o'clock"),
    ("Open 9am-5pm", "Open nine A M to five P M"),
    ("Open 9-5pm", "Open nine to five P M"),
    ("Open 9:00–17:30", "Open nine A M to five thirty P M"),
    ("Score 25:00 exactly", "Score twenty-five:zero zero exactly"),  # no time: read as numbers
    # money
    ("It's $45.", "It's forty-five dollars."),
    ("It's $1.", "It's one dollar."),
    ("It's $12.50 total", "It's twelve dollars and fifty cents total"),
    ("It's $12.5", "It's twelve dollars and fifty cents"),
    ("It's $0.99", "It's ninety-nine cents"),
    ("It's $1,250.00", "It's one thousand two hundred fifty dollars"),
    ("It's $25000", "It's twenty-five thousand dollars"),
    ("It's $2.5 million", "It's two point five million dollars"),
    ("It's $3k", "It's three thousand dollars"),
    ("It's €20", "It's twenty euros"),
    ("It's 20 €", "It's twenty euros"),
    ("It's £5.01", "It's five pounds and one penny"),
    ("It's £3.20", "It's three pounds and twenty pence"),
    ("It's $100-200", "It's one hundred to two hundred dollars"),
    ("It's $20/hr", "It's twenty dollars per hour"),
    # abbreviations
    ("Dr. Smith will see you.", "Doctor Smith will see you."),
    ("Ask Dr Patel", "Ask Doctor Patel"),
    ("Mr. and Mrs. Lee", "Mr. and Missus Lee"),  # "Mr." before "and" is no title
    ("Ms. Lee is in.", "Miz Lee is in."),
    ("We're at 12 Main St.", "We're at twelve Main Street."),
    ("We're at 12 Main St. Come by.", "We're at twelve Main Street. Come by."),
    ("Main St, Suite 4", "Main Street, Suite four"),
    ("It's on Oak Ave. near the park", "It's on Oak Avenue near the park"),
    ("Turn onto Elm Dr.", "Turn onto Elm Drive."),
    ("Visit St. Louis.", "Visit Saint Louis."),
    ("Fruit, e.g. apples, i.e. food, etc.", "Fruit, for example apples, that is food, et cetera."),
    ("E.g., pears.", "For example, pears."),
    ("It takes approx. 5 min", "It takes approximately five minutes"),
    ("It takes 1 min.", "It takes one minute."),
    ("It takes 2 hrs", "It takes two hours"),
    ("It takes 1 hr and 30 secs", "It takes one hour and thirty seconds"),
    ("Cats vs. dogs", "Cats versus dogs"),
    ("Open Mon-Fri 9-5", "Open Monday to Friday nine to five"),
    ("Open Mon – Fri", "Open Monday to Friday"),
    ("Open Tue through Thu", "Open Tuesday to Thursday"),
    ("Sat & Sun: 10-4", "Saturday and Sunday: ten to four"),
    ("Closed Sat, Sun", "Closed Saturday, Sunday"),
    ("Closed Sat/Sun.", "Closed Saturday and Sunday."),
    ("Sun 10am", "Sunday ten A M"),
    ("MON-FRI", "Monday to Friday"),
    ("I sat in the sun for 5 minutes", "I sat in the sun for five minutes"),
    # whitespace and punctuation
    ("Hello there. ", "Hello there. "),
    (" 42", " forty-two"),
    ("\n", "\n"),
    ("", ""),
    ("Is it 5?", "Is it five?"),
    ("Well... 3!", "Well... three!"),
]


@pytest.mark.parametrize("text, spoken", SPOKEN)
def test_speakable(text, spoken):
    assert speakable(text) == spoken


@pytest.mark.parametrize("text", [text for text, _ in SPOKEN])
def test_speaking_spoken_text_changes_nothing(text):
    once = speakable(text)
    assert speakable(once) == once


# Fragments a reply is made of, for the random replies below.
FRAGMENTS = ["https://", "www.", "example.com", "/book", "@", "front.desk", "9:30", "am", "p.m.", "$", "12.50", "1,250",
             "%", "555-0134", "(555) ", "Dr.", "St.", " ", " ", "Mon", "-", "Fri", "e.g.", "etc.", "**", "*", "_", "`",
             "[", "](", ")", "#", "\n", "- ", "1. ", "|", "21st", "3.5", "0", "007", "min", "hrs", "€", "£", "k",
             "million", "24/7", "/hr", "°F", "~", ".", ",", "Sat", "Sun", "A", "M", "14:00", "1990", "–", "2", "x",
             "Main", "Louis", "no.", "vs", "911", "é", "漢", "\u200b"]
# Any character at all, weighted towards the ones rules look at.
ALPHABET = "abcXYZ019 .,:;-–_*#`|~[]()<>@$€£%/\\+!?'\"\n\t°&^=™é漢\u200b\U0001F600\x00"


def random_replies(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    texts = ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 12))) for _ in range(count)]
    texts += ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40))) for _ in range(count)]
    texts += ["".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(0, 20))) for _ in range(count)]
    return texts


def test_any_text_is_spoken_without_error_and_speaking_it_again_changes_nothing():
    for text in random_replies(seed=1234, count=2000):
        once = speakable(text)
        assert isinstance(once, str)
        assert speakable(once) == once, text


@pytest.mark.parametrize("text", [
    "*a" * 3000, "_a" * 3000, "1," * 3000, "a@" * 3000, "a." * 3000, "[" * 3000 + "](" * 3000, "9:" * 3000,
    "1-" * 3000, "**a " * 3000, "x" * 6000 + ".com", "9" * 5000, "$" + "9" * 5000 + ".5", "9" * 5000 + "th", "-" * 6000,
])
def test_long_runs_are_spoken(text):
    """Huge numbers are read digit by digit (int() refuses over 4300 digits); nothing backtracks for ever."""
    assert isinstance(speakable(text), str)


def test_long_numbers_are_read_digit_by_digit():
    assert speakable("9" * 20) == " ".join(["nine"] * 20)


# ---- the voices -------------------------------------------------------------------------

async def test_the_engine_is_given_speakable_text_and_the_reply_keeps_what_the_llm_wrote():
    engine = ToneTTS(chunks=1)
    service = EngineTTSService(engine, voice="tone")
    said = "It's $45 at https://www.example.com/book."
    down, _ = await run_test(service, frames_to_send=[TTSSpeakFrame(said)])
    assert engine.sentences == ["It's forty-five dollars at example dot com slash book."]
    assert "".join(f.text for f in down if isinstance(f, TTSTextFrame)).strip() == said
    assert [f.text for f in down if isinstance(f, TTSSentenceTimingFrame)] == [said]


async def test_orpheus_speaks_the_words_between_its_emotion_tags():
    from models.orpheus.prompt import EMOTION_TAGS

    engine = ToneTTS(chunks=1)
    service = OrpheusTTSService(engine, voice="tara", model="orpheus", emotion_tags=EMOTION_TAGS)
    await run_test(service, frames_to_send=[TTSSpeakFrame("Dr. Lee <sigh> costs $5 <b>more</b> at 9:30 <laugh>.")])
    assert engine.sentences == ["Doctor Lee <sigh> costs five dollars more at nine thirty <laugh>."]
