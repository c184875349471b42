"""Reply text -> words an English TTS voice can say (pure: no I/O, no pipecat).

A voice reads what it is given: Piper says "https://" as "colon slash slash", "**Note**"
with its asterisks, "$12.50" as "dollar twelve point five zero". `speakable` rewrites one
chunk of a reply (a first phrase or a sentence, as the TTS service receives them) into
plain words. The stored reply keeps what the LLM wrote; only the voice gets this.

Choices, each for a listener who cannot see the text:
- Addresses are read as typed: "front.desk@oakwood-clinic.com" -> "front dot desk at
  oakwood dash clinic dot com". A hyphen is "dash", not a space: a caller writing down
  "oakwood clinic" cannot know a hyphen belongs there. Scheme, "www." and query are dropped.
- Digits that name rather than count (phone numbers, codes, numbers with a leading zero,
  five or more digits written without separators: ZIP codes, order numbers) are read one
  by one, groups split by commas so the voice pauses where the text had a separator.
  LLMs write large quantities with separators ("12,000"), which are read as numbers.
- Clock times: "9:30" -> "nine thirty", "9:00" -> "nine o'clock", "10:05" -> "ten oh
  five", "9:00 AM" -> "nine A M", "14:00" -> "two P M". "A M" in capitals: a lower-case "a"
  is read as the article.
- Four-digit numbers from 1100 to 1999 are read in pairs ("1990": "nineteen ninety").
- Sentence punctuation stays, for prosody: an abbreviation's full stop ("etc.", "a.m.")
  is kept when it ends the chunk, where it is also the sentence's end. Markdown line
  breaks (list items, table rows) become sentence ends.

`speakable(speakable(t)) == speakable(t)`: the rules run until the text settles, and their
output has no digits, markup or symbols a rule acts on, so text spoken once (or a chunk
seen twice) is left as it is. It never raises: `int()` only ever sees at most
`MAX_SPOKEN_DIGITS` digits (it refuses over 4300), and an unclosed emphasis marker looks at
most `MAX_EMPHASIS_CHARS` ahead.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
# Past the trillions nobody says a number as words; longer runs are read digit by digit.
MAX_SPOKEN_DIGITS = 15
# Plain digit runs this long or longer are identifiers (ZIP, order, account numbers).
MIN_IDENTIFIER_DIGITS = 5
# Plain four-digit numbers in this range are read in pairs, as years are ("1990": "nineteen
# ninety") and as round counts are said ("1500": "fifteen hundred"). From 2000 on, years are
# said as numbers ("two thousand five"), so those stay numbers.
YEAR_STYLE = range(1100, 2000)
# Rule passes over a chunk before it is taken as settled; garbage input may need a third.
MAX_PASSES = 4
_ORDINAL_ENDINGS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                    "nine": "ninth", "twelve": "twelfth"}


def number_words(n: int) -> str:
    """A non-negative integer in words, American style: 1250 -> "one thousand two hundred fifty"."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {number_words(rest)}" if rest else "")
    scale, name = next((s, w) for s, w in _SCALES if n >= s)
    high, rest = divmod(n, scale)
    return f"{number_words(high)} {name}" + (f" {number_words(rest)}" if rest else "")


def ordinal_words(n: int) -> str:
    head, last = re.match(r"(.*?)([a-z]+)$", number_words(n)).groups()
    if last in _ORDINAL_ENDINGS:
        return head + _ORDINAL_ENDINGS[last]
    return head + (last[:-1] + "ieth" if last.endswith("y") else last + "th")


def digit_words(digits: str) -> str:
    return " ".join(_ONES[int(d)] for d in digits if "0" <= d <= "9")


def _integer(digits: str, *, quantity: bool = False) -> str:
    """ASCII digits, maybe with thousands commas. `quantity`: money or a count, never an identifier."""
    plain = digits.replace(",", "")
    if len(plain) > MAX_SPOKEN_DIGITS or (len(plain) > 1 and plain[0] == "0"):
        return digit_words(plain)
    if not quantity and "," not in digits and len(plain) >= MIN_IDENTIFIER_DIGITS:
        return digit_words(plain)
    if not quantity and "," not in digits and YEAR_STYLE.start <= int(plain) < YEAR_STYLE.stop:
        high, low = divmod(int(plain), 100)  # "1990": "nineteen ninety", "1905": "nineteen oh five"
        return f"{number_words(high)} " + ("hundred" if not low else f"oh {_ONES[low]}" if low < 10
                                           else number_words(low))
    return number_words(int(plain))


def _decimal(whole: str, fraction: str | None, *, quantity: bool = False) -> str:
    words = _integer(whole, quantity=quantity or bool(fraction))
    return f"{words} point {digit_words(fraction)}" if fraction else words


# ---- helpers shared by the rules ----------------------------------------------------------

def _ends_chunk(m: re.Match) -> bool:
    return not m.string[m.end():].strip()


def _stop(m: re.Match) -> str:
    """The full stop an abbreviation swallowed, when it was also the sentence's end."""
    return "." if m.group(0).endswith(".") and _ends_chunk(m) else ""


def _spaced(m: re.Match, words: str) -> str:
    """`words` in place of the match, kept apart from letters it touched ("room42", "5km")."""
    s = m.string
    before = " " if m.start() > 0 and s[m.start() - 1].isalnum() else ""
    after = " " if m.end() < len(s) and s[m.end()].isalnum() else ""
    return before + words + after


def _like(original: str, words: str) -> str:
    return words[:1].upper() + words[1:] if original[:1].isupper() else words


Rule = tuple[re.Pattern, Callable[[re.Match], str] | str]


def _apply(text: str, rules: tuple[Rule, ...]) -> str:
    for pattern, replacement in rules:
        text = pattern.sub(replacement, text)
    return text


# ---- markdown ---------------------------------------------------------------------------

_LINE_RULES: tuple[Rule, ...] = (
    (re.compile(r"^[ \t]*(?:```|~~~).*$", re.M), ""),  # code fences; the code itself is kept
    (re.compile(r"^[ \t]*([-*_])(?:[ \t]*\1){2,}[ \t]*$", re.M), ""),  # horizontal rules
    (re.compile(r"^[ \t]*\|?(?:[ \t]*:?-+:?[ \t]*\|)+(?:[ \t]*:?-+:?[ \t]*)?$", re.M), ""),  # |---|---|
    # headings, quotes, bullets and numbered items at a line's start, nested ones too
    (re.compile(r"^[ \t]*(?:(?:#{1,6}|>+|[-+*•]|[0-9]{1,3}[.)])[ \t]+)+(?=\S)", re.M), ""),
    (re.compile(r"^.*\|.*$", re.M),
     lambda m: ", ".join(c.strip() for c in m.group(0).strip().strip("|").split("|") if c.strip())),
)
_CLAUSE_END = ".!?,;:…"
# Emphasis spans a few words; a marker with no closer this near is left (then dropped as a
# stray), so an unclosed "**" costs a bounded look ahead, not a scan of the whole reply.
MAX_EMPHASIS_CHARS = 200
_INLINE_RULES: tuple[Rule, ...] = (
    (re.compile(r"<((?:https?://|mailto:)[^<>\s]+)>"), r"\1"),  # autolinks
    (re.compile(r"!?\[([^\[\]]*)\]\(([^()\s]*)\)"), lambda m: m.group(1) or m.group(2)),
    # citation marks: the reference passages reach the LLM labelled [1], [2], ...
    (re.compile(r"[ \t]*\[[0-9]{1,3}(?:[ \t]*[,–-][ \t]*[0-9]{1,3})*\]"), ""),
    (re.compile(r"`+([^`]*)`+"), r"\1"),
    (re.compile(rf"~~(?=\S)(.{{1,{MAX_EMPHASIS_CHARS}}}?)(?<=\S)~~"), r"\1"),
    (re.compile(rf"(?<![0-9*\\])(\*{{1,3}})(?=[^\s*])(.{{1,{MAX_EMPHASIS_CHARS}}}?)(?<=[^\s*])\1(?![0-9*])"), r"\2"),
    (re.compile(rf"(?<![^\W_])(_{{1,3}})(?=[^\s_])(.{{1,{MAX_EMPHASIS_CHARS}}}?)(?<=[^\s_])\1(?![^\W_])"), r"\2"),
    (re.compile(r"(?<=[0-9])[ \t]*\*[ \t]*(?=[0-9])"), " times "),
    (re.compile(r"(?<!\S)\*(?=[\s.,;:!?]|$)"), "star"),  # "press *": a phone keypad's key
    (re.compile(r"\\?\*+|`+|~~"), ""),
)


def _strip_markdown(text: str) -> str:
    lines = [line.strip() for line in _apply(text, _LINE_RULES).splitlines()]
    lines = [line for line in lines if line]
    # A line break is a pause the voice would not hear: lines without their own
    # punctuation (list items, table rows, headings) end as sentences.
    joined = " ".join(line if line[-1] in _CLAUSE_END or i == len(lines) - 1 else line + "."
                      for i, line in enumerate(lines))
    return _apply(joined, _INLINE_RULES)


# ---- addresses --------------------------------------------------------------------------

_ADDRESS_SYMBOLS = {".": "dot", "-": "dash", "_": "underscore", "+": "plus", "/": "slash", ":": "colon",
                    "%": "percent", "~": "tilde", "=": "equals", "&": "and", "@": "at"}
_ADDRESS_SPELLED = re.compile(r"[0-9]|[" + re.escape("".join(_ADDRESS_SYMBOLS)) + "]")
_TRAILING_PUNCTUATION = re.compile(r"[.,;:!?]+$")
_TLD = r"(?:com|org|net|edu|gov|io|co|uk|us|ca|au|de|fr|eu|info|biz|app|dev|ai|me|health|clinic)"
_URL_CHAR = r"[^\s<>\"'`|(){}\[\]]"


def _spoken_address(address: str) -> str:
    words = _ADDRESS_SPELLED.sub(lambda m: f" {_ADDRESS_SYMBOLS.get(m.group(0)) or _ONES[int(m.group(0))]} ",
                                 address)
    return " ".join(words.split())


def _spoken_email(m: re.Match) -> str:
    return _spaced(m, f"{_spoken_address(m.group(1))} at {_spoken_address(m.group(2).lower())}")


def _spoken_url(m: re.Match) -> str:
    url = m.group(0)
    trail = _TRAILING_PUNCTUATION.search(url)
    if trail:
        url = url[: trail.start()]
    body = re.sub(r"(?i)^(?:[a-z]+://)?(?:www\.)?", "", url)
    body = re.split(r"[?#]", body, maxsplit=1)[0].rstrip("/")
    host, slash, path = body.partition("/")
    return _spaced(m, _spoken_address(host.lower() + slash + path)) + (trail.group(0) if trail else "")


_ADDRESS_RULES: tuple[Rule, ...] = (
    (re.compile(r"(?<![\w.+-])([A-Za-z0-9][A-Za-z0-9._%+-]*)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})"
                r"(?![\w-])"), _spoken_email),
    (re.compile(rf"(?i)\b(?:https?://|ftp://|www\.){_URL_CHAR}+"), _spoken_url),
    (re.compile(rf"(?i)(?<![\w@.-])(?:[a-z0-9-]+\.)+{_TLD}(?![\w-])(?:/{_URL_CHAR}*)?"), _spoken_url),
    (re.compile(r"(?i)(?:https?|ftp)://"), ""),
)

# ---- abbreviations ----------------------------------------------------------------------

_TITLES = {"dr": "Doctor", "mr": "Mister", "mrs": "Missus", "ms": "Miz", "prof": "Professor"}
_STREETS = {"st": "Street", "ave": "Avenue", "rd": "Road", "blvd": "Boulevard", "dr": "Drive"}
_STREET_NAME = r"\b([A-Z][a-z]+|[0-9]+(?:st|nd|rd|th))"
_DAYS = {"mon": "Monday", "tue": "Tuesday", "tues": "Tuesday", "wed": "Wednesday", "thu": "Thursday",
         "thur": "Thursday", "thurs": "Thursday", "fri": "Friday", "sat": "Saturday", "sun": "Sunday"}
# Capitalised or all capitals only: "sat", "sun" and "wed" are also English words.
_DAY = "(?:" + "|".join(f"{d.capitalize()}|{d.upper()}" for d in sorted(_DAYS, key=len, reverse=True)) + ")"
_UNITS = {"min": "minute", "mins": "minute", "hr": "hour", "hrs": "hour", "sec": "second", "secs": "second"}
_PER = {"hr": "hour", "h": "hour", "hour": "hour", "min": "minute", "day": "day", "wk": "week", "week": "week",
        "mo": "month", "month": "month", "yr": "year", "year": "year", "night": "night", "person": "person"}


def _days(m: re.Match) -> str:
    spoken = re.sub(_DAY, lambda d: _DAYS[d.group(0).lower()], m.group(0).rstrip("."))
    spoken = re.sub(r"\.?[ \t]*(?:[-–—]|\bthrough\b|\bthru\b)[ \t]*", " to ", spoken)
    spoken = re.sub(r"\.?[ \t]*/[ \t]*", " and ", spoken)  # "Sat/Sun"
    return re.sub(r"\.(?=[ \t]*(?:,|&|\band\b|\bor\b))", "", spoken) + _stop(m)


def _street(m: re.Match) -> str:
    name, kind = m.groups()
    ends_sentence = m.group(0).endswith(".") and (_ends_chunk(m) or re.match(r"\s+[A-Z]", m.string[m.end():]))
    return f"{name} {_STREETS[kind.lower()]}{'.' if ends_sentence else ''}"


def _unit(m: re.Match) -> str:
    unit = _UNITS[m.group(2).lower()]
    return f"{m.group(1)} {unit}{'' if m.group(1) == '1' else 's'}{_stop(m)}"


_ABBREVIATION_RULES: tuple[Rule, ...] = (
    # After a name ("Oak Ave", "5th Ave"). "St" and "Dr" also begin names ("St. Louis", "Dr.
    # Patel"): those are streets where no name follows, or after a name that is not the
    # chunk's first word ("at 12 Main St. Come by").
    (re.compile(rf"{_STREET_NAME} (Ave|Rd|Blvd)\b\.?"), _street),
    (re.compile(rf"{_STREET_NAME} (St|Dr)\b(?!\.?[ \t]+[A-Z])\.?"), _street),
    (re.compile(rf"(?<=[A-Za-z0-9,] ){_STREET_NAME} (St)\b\.?"), _street),
    (re.compile(r"\b(Dr|Mr|Mrs|Ms|Prof)\b\.?(?=[ \t]+[A-Z])"), lambda m: _TITLES[m.group(1).lower()]),
    (re.compile(r"\bSt\b\.?(?=[ \t]+[A-Z])"), "Saint"),
    (re.compile(r"(?i)(?<![\w.])e\.[ \t]?g\.?(?!\w)"), lambda m: _like(m.group(0), "for example")),
    (re.compile(r"(?i)(?<![\w.])i\.[ \t]?e\.?(?!\w)"), lambda m: _like(m.group(0), "that is")),
    (re.compile(r"(?i)\betc\b\.?"), lambda m: _like(m.group(0), "et cetera") + _stop(m)),
    (re.compile(r"(?i)\bapprox\b\.?"), lambda m: _like(m.group(0), "approximately") + _stop(m)),
    (re.compile(r"(?i)\bvs\b\.?"), lambda m: _like(m.group(0), "versus") + _stop(m)),
    (re.compile(r"(?i)\bno\.[ \t]?(?=[0-9])|#[ \t]?(?=[0-9])"), lambda m: _like(m.group(0), "number ")),
    (re.compile(rf"\b{_DAY}\b\.?(?:[ \t]*(?:[-–—/,&]|\bto\b|\bthrough\b|\bthru\b|\band\b|\bor\b)[ \t]*"
                rf"{_DAY}\b\.?)+"), _days),
    (re.compile(r"\b(?:Mon|MON|Tues?|TUES?|Thu(?:rs?)?|THU(?:RS?)?|Fri|FRI)\b\.?"), _days),
    (re.compile(rf"\b{_DAY}\b\.?(?=[ \t]*(?::|[0-9]))"), _days),
    (re.compile(r"\b24/7\b"), "24 7"),
    (re.compile(r"(?<![\w.,-])911(?![\w.,-]?[0-9])"), "9 1 1"),  # said digit by digit, like a phone number
    (re.compile(r"(?<=[0-9])[ \t]?/[ \t]?(" + "|".join(_PER) + r")\b\.?"), lambda m: f" per {_PER[m.group(1)]}"),
    (re.compile(r"(?<![\w.])([0-9]+(?:\.[0-9]+)?)[ \t]?(mins?|hrs?|secs?)\b\.?", re.I), _unit),
)

# ---- times ------------------------------------------------------------------------------

_MERIDIEM = r"(?:[ \t]?([AaPp])(?:\.[ \t]?[Mm]\b\.?|[ \t]?[Mm]\b))"
_TIME = rf"([0-9]{{1,2}})(?::([0-5][0-9]))?{_MERIDIEM}?"


def _clock(hour: int, minute: int, meridiem: str | None, *, twenty_four: bool, alone: bool) -> str | None:
    """A time's words, or None if it is no time."""
    if meridiem:
        if not 1 <= hour <= 12:
            return None
        suffix = f"{meridiem.upper()} M"
    elif hour > 23:
        return None
    else:
        suffix = ("P M" if hour >= 12 else "A M") if twenty_four and hour != 12 else ""
    words = number_words(hour % 12 or 12)
    if minute:
        words += f" oh {_ONES[minute]}" if minute < 10 else f" {number_words(minute)}"
    elif alone and not suffix:
        words += " o'clock"
    return f"{words} {suffix}" if suffix else words


def _time_range(m: re.Match) -> str:
    h1, m1, p1, h2, m2, p2 = m.groups()
    if not (m1 or m2 or p1 or p2):
        return m.group(0)  # "9-5": a plain range, read later
    hours = (int(h1), int(h2))
    twenty_four = not (p1 or p2) and any(h == 0 or h >= 13 for h in hours)
    first = _clock(hours[0], int(m1 or 0), p1, twenty_four=twenty_four, alone=False)
    second = _clock(hours[1], int(m2 or 0), p2, twenty_four=twenty_four, alone=False)
    if first is None or second is None:
        return m.group(0)
    return _spaced(m, f"{first} to {second}{_stop(m)}")


def _single_time(m: re.Match) -> str:
    hour, minute, meridiem = m.groups()
    if minute is None and meridiem is None:
        return m.group(0)
    h = int(hour)
    words = _clock(h, int(minute or 0), meridiem, twenty_four=h == 0 or h >= 13, alone=True)
    return m.group(0) if words is None else _spaced(m, words + _stop(m))


_TIME_RULES: tuple[Rule, ...] = (
    (re.compile(rf"(?<![0-9.,:])([0-9]{{1,2}})\.([0-5][0-9])(?={_MERIDIEM})"), r"\1:\2"),  # British "9.30 a.m."
    (re.compile(rf"(?<![0-9:.,$€£]){_TIME}[ \t]*[-–—][ \t]*{_TIME}(?![0-9:])"), _time_range),
    (re.compile(rf"(?<![0-9:.,$€£]){_TIME}(?![0-9:])"), _single_time),
)

# ---- numbers, money, phone numbers ------------------------------------------------------

_NUMBER = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?"
_CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
               "£": ("pound", "pounds", "penny", "pence")}
_SCALE_WORD = "thousand|million|billion|trillion"
_SCALE_LETTER = "k|K|m|M|mn|bn|b|B"
_MONEY_SCALES = {"k": "thousand", "m": "million", "mn": "million", "b": "billion", "bn": "billion",
                 "thousand": "thousand", "million": "million", "billion": "billion", "trillion": "trillion"}


def _digit_groups(m: re.Match) -> str:
    groups = ", ".join(digit_words(g) for g in re.findall(r"[0-9]+", m.group(0)))
    return _spaced(m, ("plus " if m.group(0).startswith("+") else "") + groups)


def _dotted(m: re.Match) -> str:
    return _spaced(m, " dot ".join(_integer(g) for g in m.group(0).split(".")))


def _range(m: re.Match) -> str:
    sym1, n1, sym2, n2 = m.groups()
    if n1 == n2 and not (sym1 or sym2):
        return f"{n1} {n2}"  # "50-50" is an idiom ("fifty-fifty"), not a range
    if sym1 and not sym2:  # "$100-200": "one hundred to two hundred dollars"
        sym1, sym2 = "", sym1
    return f"{sym1}{n1} to {sym2}{n2}"


def _money_words(symbol: str, amount: str, scale: str | None) -> str:
    one, many, cent, cents = _CURRENCIES[symbol]
    whole, _, fraction = amount.partition(".")
    if scale:
        return f"{_decimal(whole, fraction, quantity=True)} {_MONEY_SCALES[scale.lower()]} {many}"
    if len(fraction) > 2 or len(whole.replace(",", "")) > MAX_SPOKEN_DIGITS:
        return f"{_decimal(whole, fraction, quantity=True)} {many}"
    units, hundredths = int(whole.replace(",", "")), int(fraction.ljust(2, "0")) if fraction else 0
    parts = [f"{_integer(whole, quantity=True)} {one if units == 1 else many}"] if units or not hundredths else []
    if hundredths:
        parts.append(f"{number_words(hundredths)} {cent if hundredths == 1 else cents}")
    return " and ".join(parts)


def _ordinal(m: re.Match) -> str:
    digits = m.group(1)
    if len(digits) > MAX_SPOKEN_DIGITS:
        return _spaced(m, digit_words(digits))
    return _spaced(m, ordinal_words(int(digits)))


def _number(m: re.Match) -> str:
    sign, whole, fraction = m.groups()
    return _spaced(m, ("minus " if sign else "") + _decimal(whole, fraction))


_NUMBER_RULES: tuple[Rule, ...] = (
    # (555) 013-4567, +1 555 013 4567, 555.013.4567
    (re.compile(r"(?<![\w.,$€£+-])(?:\+?[0-9]{1,3}[ \t.-]?)?(?:\([0-9]{3}\)[ \t]?|[0-9]{3}[ \t.-])[0-9]{3}[ \t.-]"
                r"[0-9]{4}(?![0-9])"), _digit_groups),
    (re.compile(r"(?<![\w.,$€£+-])\+?[0-9]+(?:-[0-9]+){2,}(?![0-9])"), _digit_groups),  # 1-800-555-0134
    (re.compile(r"(?<![\w.,$€£+-])[0-9]{3}-[0-9]{4}(?![0-9-])"), _digit_groups),  # 555-0134
    (re.compile(r"(?<![\w.])[0-9]+(?:\.[0-9]+){2,}(?![0-9])"), _dotted),  # versions, addresses
    (re.compile(rf"(?<![\w.,:-])([$€£]?)({_NUMBER})(?:-|[ \t]?[–—][ \t]?)([$€£]?)({_NUMBER})(?![0-9:-])"),
     _range),
    # $45, $12.50, $2.5 million, $3k; and 20 € as Europeans write it
    (re.compile(rf"([$€£])[ \t]?({_NUMBER})(?:[ \t]?({_SCALE_WORD})\b|({_SCALE_LETTER})\b)?"),
     lambda m: _spaced(m, _money_words(m.group(1), m.group(2), m.group(3) or m.group(4)))),
    (re.compile(rf"(?<![0-9.,])({_NUMBER})[ \t]?(€)"),
     lambda m: _spaced(m, _money_words(m.group(2), m.group(1), None))),
    (re.compile(r"(?<![0-9])([0-9]+)(?:st|nd|rd|th|ST|ND|RD|TH)\b"), _ordinal),
    # every digit left, so spoken text has none: -5, 1,250, 3.5, 42
    (re.compile(r"(?:(?<![^\s(\[\"'])([-−])(?=[0-9]))?([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.([0-9]+))?"),
     _number),
)

# ---- symbols left over ------------------------------------------------------------------

_SYMBOL_RULES: tuple[Rule, ...] = (
    (re.compile(r"°[ \t]?F\b"), " degrees Fahrenheit"),
    (re.compile(r"°[ \t]?C\b"), " degrees Celsius"),
    (re.compile(r"°"), " degrees"),
    (re.compile(r"%"), " percent"),
    (re.compile(r"&"), " and "),
    (re.compile(r"@"), " at "),
    (re.compile(r"~(?=[ \t]*\w)"), "about "),
    (re.compile(r"(?<!\S)#(?=[\s.,;:!?]|$)"), "pound"),  # "press #": the phone keypad's key
    (re.compile(r"[#~_|\\]+"), " "),
    (re.compile(r"[ \t\u00a0]+"), " "),
    (re.compile(r" +(?=[.,!?;:…])"), ""),
)


def _speakable_once(text: str) -> str:
    spoken = _strip_markdown(text)
    for rules in (_ADDRESS_RULES, _ABBREVIATION_RULES, _TIME_RULES, _NUMBER_RULES, _SYMBOL_RULES):
        spoken = _apply(spoken, rules)
    return spoken.strip()


def speakable(text: str) -> str:
    """`text` (one chunk of a reply) as words a TTS voice says right; whitespace around it kept."""
    body = text.strip()
    if not body:
        return text
    lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()):]
    # One rule's words can complete another's pattern ("Fri2" -> "Fri two", where "Fri" is
    # now a word): the rules run again until nothing changes, which is what makes speaking
    # spoken text a no-op. Real replies settle in one pass (plus the pass that checks).
    for _ in range(MAX_PASSES):
        again = _speakable_once(body)
        if again == body:
            break
        body = again
    return lead + body + trail
