"""Orpheus token <-> SNAC code mapping, prompts, and the streaming frame assembler (pure)."""

import numpy as np
import pytest

from models.orpheus import (
    FrameAssembler,
    OrpheusTokenError,
    prompt_ids,
    snac_codes_to_tokens,
    tokens_to_snac_codes,
)
from models.orpheus.tokens import AUDIO_TOKEN_BASE, END_OF_SPEECH, START_OF_SPEECH


def random_levels(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 4096, (1, n)), rng.integers(0, 4096, (1, 2 * n)), rng.integers(0, 4096, (1, 4 * n))


@pytest.mark.parametrize("n", [0, 1, 5, 33])
def test_round_trip_codes_tokens_codes(n):
    levels = random_levels(n)
    if n:
        levels[0][0, 0], levels[2][0, -1], levels[1][0, 0] = 0, 4095, 0  # the edge codes
    tokens = snac_codes_to_tokens(*levels)
    assert len(tokens) == 7 * n
    back = tokens_to_snac_codes(tokens)
    assert [b.shape for b in back] == [(1, n), (1, 2 * n), (1, 4 * n)]
    for original, decoded in zip(levels, back):
        np.testing.assert_array_equal(original, decoded)


def test_the_documented_id_formula_and_frame_layout():
    # Frame codes t0..t6 = 10..16: id = 128266 + code + 4096 * position.
    tokens = [AUDIO_TOKEN_BASE + code + 4096 * i for i, code in enumerate(range(10, 17))]
    l0, l1, l2 = tokens_to_snac_codes(tokens)
    assert l0.tolist() == [[10]] and l1.tolist() == [[11, 14]] and l2.tolist() == [[12, 13, 15, 16]]
    assert snac_codes_to_tokens(l0, l1, l2) == tokens


def test_code_zero_and_4095_survive():
    tokens = snac_codes_to_tokens(np.zeros((1, 1)), np.full((1, 2), 4095), np.zeros((1, 4)))
    assert tokens[0] == AUDIO_TOKEN_BASE and tokens[1] == AUDIO_TOKEN_BASE + 4096 + 4095


def test_a_partial_frame_is_an_error_not_a_shorter_frame():
    tokens = snac_codes_to_tokens(*random_levels(2))
    with pytest.raises(OrpheusTokenError, match="6 left over"):
        tokens_to_snac_codes(tokens[:13])


def test_a_lost_token_is_detected_where_it_happened():
    tokens = snac_codes_to_tokens(*random_levels(3))
    del tokens[9]
    with pytest.raises(OrpheusTokenError, match="position 9 encodes frame slot 3, expected 2"):
        tokens_to_snac_codes(tokens[:14])


@pytest.mark.parametrize("bad", [AUDIO_TOKEN_BASE - 1, AUDIO_TOKEN_BASE + 7 * 4096, 0, 128258])
def test_ids_outside_the_audio_range_are_refused(bad):
    tokens = snac_codes_to_tokens(*random_levels(1))
    tokens[0] = bad
    with pytest.raises(OrpheusTokenError, match="not an Orpheus audio token"):
        tokens_to_snac_codes(tokens)


def test_slot_six_code_4096_is_out_of_range_not_wrapped():
    # The off-by-one of public decoders: code 4096 in the last slot reads as the next frame's slot 0.
    with pytest.raises(OrpheusTokenError):
        tokens_to_snac_codes([AUDIO_TOKEN_BASE + 4096 * i for i in range(6)] + [AUDIO_TOKEN_BASE + 4096 * 6 + 4096])


@pytest.mark.parametrize("levels", [(np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((1, 4))),
                                    (np.zeros((1, 1)), np.zeros((1, 2)), np.full((1, 4), 4096)),
                                    (np.full((1, 1), -1), np.zeros((1, 2)), np.zeros((1, 4)))])
def test_bad_code_arrays_are_refused(levels):
    with pytest.raises(OrpheusTokenError):
        snac_codes_to_tokens(*levels)


def test_assembler_yields_whole_frames_as_tokens_stream_in():
    tokens = snac_codes_to_tokens(*random_levels(3, seed=4))
    assembler = FrameAssembler()
    got = [assembler.push([START_OF_SPEECH])]
    for token in tokens[:10]:
        got.append(assembler.push([token]))
    got.append(assembler.push(tokens[10:] + [END_OF_SPEECH]))
    frames = np.concatenate([g for g in got if len(g)])
    assert frames.shape == (3, 7) and assembler.ended and assembler.partial_tokens == 0
    np.testing.assert_array_equal(frames[:, 0], tokens_to_snac_codes(tokens)[0][0])
    with pytest.raises(OrpheusTokenError, match="after end of speech"):
        assembler.push([tokens[0]])


def test_assembler_reports_a_trailing_partial_frame():
    assembler = FrameAssembler()
    tokens = snac_codes_to_tokens(*random_levels(2))
    assert len(assembler.push(tokens[:11] + [END_OF_SPEECH])) == 1
    assert assembler.partial_tokens == 4


def test_prompt_wraps_voice_and_text_in_orpheus_special_tokens():
    seen = []

    def tokenize(text):
        seen.append(text)
        return [128000, 1, 2, 3]

    ids = prompt_ids(tokenize, "tara", "Hello  there <laugh> friend.")
    assert seen == ["tara: Hello there <laugh> friend."]
    assert ids == [128259, 128000, 1, 2, 3, 128009, 128260, 128261, 128257]
    with pytest.raises(ValueError, match="empty"):
        prompt_ids(tokenize, "tara", "   ")
    with pytest.raises(ValueError, match="voice name"):
        prompt_ids(tokenize, "tara: evil", "hi")
    with pytest.raises(ValueError, match="split it into sentences"):
        prompt_ids(tokenize, "tara", "word " * 400)
