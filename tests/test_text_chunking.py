import pytest
from pipecat.frames.frames import LLMFullResponseEndFrame, LLMFullResponseStartFrame, LLMTextFrame
from pipecat.tests.utils import run_test

from pipelines.text_chunking import FirstPhraseAggregator, split_first_phrase
from pipelines.tts import EngineTTSService
from tests.fakes import ToneTTS


@pytest.mark.parametrize("text, expected", [
    ("Sure, ", None),  # too few words
    ("Well I think so, ", ("Well I think so,", " ")),
    ("It costs 1,000 ", None),
    ("The sky is blue because ", ("The sky is blue", "because ")),
    ("Paris is the capital and ", ("Paris is the capital", "and ")),
    ("And so it goes ", None),  # a starter word inside the first four does not split
    ("one two three four five six seven eight nine ", ("one two three four five six seven eight nine", " ")),
    ("one two three four five six seven eight", None),  # the last word may still be growing
    ("Meet me at 3:30 today ", None),
])
def test_split_first_phrase(text, expected):
    assert split_first_phrase(text) == expected


async def collect(aggregator, pieces):
    out = []
    for piece in pieces:
        out += [a.text async for a in aggregator.aggregate(piece)]
    tail = await aggregator.flush()
    return out + ([tail.text] if tail and tail.text else [])


async def test_only_the_first_phrase_of_a_reply_is_released_early():
    aggregator = FirstPhraseAggregator()
    pieces = ["The sky", " is blue", " because", " of Rayleigh", " scattering, which", " is neat. Bye", " now."]
    chunks = await collect(aggregator, pieces)
    assert chunks == ["The sky is blue", "because of Rayleigh scattering, which is neat.", "Bye now."]
    # The next reply gets an early first phrase again.
    assert (await collect(aggregator, ["Well I think so, ", "yes it is."]))[0] == "Well I think so,"


async def test_tts_service_speaks_the_first_phrase_before_the_sentence_is_complete():
    engine = ToneTTS(chunks=1)
    service = EngineTTSService(engine, voice="tone")
    frames = [LLMFullResponseStartFrame()] + [LLMTextFrame(t) for t in
              ["The moon", " is far", " away", " because", " space is big."]] + [LLMFullResponseEndFrame()]
    await run_test(service, frames_to_send=frames)
    assert engine.sentences == ["The moon is far away", "because space is big."]
