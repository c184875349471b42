"""Orpheus audio tokens <-> SNAC codes: pure functions, no model.

Orpheus (a Llama-3.2-3B fine-tune) speaks in 7-token frames. Token i of the generated
audio stream is `<custom_token_N>` with id 128266 + code + 4096 * (i mod 7); a frame's
seven codes fill SNAC's three levels (stride 4, 2, 1) as
    L0 = t0,  L1 = t1, t4,  L2 = t2, t3, t5, t6.
A token's slot is readable from its id, so a lost or extra token is detected at once
instead of shifting every later frame into the wrong codebooks (the click-and-garble
failure of public decoders).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# Orpheus' added tokens follow Llama 3's 128,000 ordinary and 256 special ones: <custom_token_N>
# is id CUSTOM_TOKEN_BASE + N, and audio starts at <custom_token_10>.
CUSTOM_TOKEN_BASE = 128_256
AUDIO_TOKEN_BASE = CUSTOM_TOKEN_BASE + 10  # 128266
CODEBOOK_SIZE = 4096  # codes per SNAC codebook level
FRAME_TOKENS = 7
SAMPLES_PER_FRAME = 2048  # SNAC 24 kHz: hop 512 x the 4 latent steps of one L0 code
SAMPLE_RATE = 24_000
AUDIO_TOKEN_END = AUDIO_TOKEN_BASE + FRAME_TOKENS * CODEBOOK_SIZE  # exclusive

# Special tokens around an Orpheus prompt and its generation.
START_OF_HUMAN = 128259
END_OF_TEXT = 128009
END_OF_HUMAN = 128260
START_OF_AI = 128261
START_OF_SPEECH = 128257
END_OF_SPEECH = 128258

# Which level, and which position within that level's per-frame codes, each slot feeds.
_SLOT_LEVEL = (0, 1, 2, 2, 1, 2, 2)
_SLOT_INDEX = (0, 0, 0, 1, 1, 2, 3)


class OrpheusTokenError(ValueError):
    """A token stream that is not a whole number of well-formed 7-token audio frames."""


def token_slot(token_id: int) -> int:
    """The frame position (0-6) a valid audio token id encodes."""
    if not AUDIO_TOKEN_BASE <= token_id < AUDIO_TOKEN_END:
        raise OrpheusTokenError(f"token id {token_id} is not an Orpheus audio token "
                                f"({AUDIO_TOKEN_BASE}..{AUDIO_TOKEN_END - 1})")
    return (token_id - AUDIO_TOKEN_BASE) // CODEBOOK_SIZE


def token_to_code(token_id: int, position: int) -> int:
    """The SNAC code of the audio token at `position` in the audio stream (0 <= code < 4096)."""
    slot = token_slot(token_id)
    if slot != position % FRAME_TOKENS:
        raise OrpheusTokenError(f"token {token_id} at audio position {position} encodes frame slot {slot}, "
                                f"expected {position % FRAME_TOKENS}: a token was lost or inserted")
    return token_id - AUDIO_TOKEN_BASE - CODEBOOK_SIZE * slot


def tokens_to_snac_codes(token_ids: Sequence[int]) -> list[np.ndarray]:
    """Whole frames of audio tokens -> [L0 (1, n), L1 (1, 2n), L2 (1, 4n)] int64 codes."""
    if len(token_ids) % FRAME_TOKENS:
        raise OrpheusTokenError(f"{len(token_ids)} audio tokens is not a whole number of {FRAME_TOKENS}-token "
                                f"frames ({len(token_ids) % FRAME_TOKENS} left over)")
    codes = np.fromiter((token_to_code(t, i) for i, t in enumerate(token_ids)), dtype=np.int64,
                        count=len(token_ids))
    return frames_to_levels(codes)


def snac_codes_to_tokens(l0: np.ndarray, l1: np.ndarray, l2: np.ndarray) -> list[int]:
    """[L0 (1, n), L1 (1, 2n), L2 (1, 4n)] -> Orpheus audio token ids (the inverse mapping)."""
    l0, l1, l2 = (np.asarray(x, dtype=np.int64).reshape(-1) for x in (l0, l1, l2))
    n = len(l0)
    if len(l1) != 2 * n or len(l2) != 4 * n:
        raise OrpheusTokenError(f"SNAC levels must hold n, 2n, 4n codes; got {len(l0)}, {len(l1)}, {len(l2)}")
    for name, level in (("L0", l0), ("L1", l1), ("L2", l2)):
        if level.size and (level.min() < 0 or level.max() >= CODEBOOK_SIZE):
            raise OrpheusTokenError(f"{name} holds a code outside 0..{CODEBOOK_SIZE - 1}")
    frames = np.empty((n, FRAME_TOKENS), dtype=np.int64)
    levels = (l0.reshape(n, 1), l1.reshape(n, 2), l2.reshape(n, 4))
    for slot in range(FRAME_TOKENS):
        frames[:, slot] = levels[_SLOT_LEVEL[slot]][:, _SLOT_INDEX[slot]]
    frames += AUDIO_TOKEN_BASE + CODEBOOK_SIZE * np.arange(FRAME_TOKENS)
    return frames.reshape(-1).tolist()


class FrameAssembler:
    """Generated token ids in, whole frames of codes out, as a generation streams.

    Tokens before the first audio token that are Orpheus control tokens are skipped; the
    end-of-speech token ends the stream. A trailing partial frame at the end is reported
    (`partial_tokens`), never padded or shifted into a frame.
    """

    _SKIPPABLE = frozenset({START_OF_SPEECH, START_OF_AI, END_OF_HUMAN, END_OF_TEXT})

    def __init__(self) -> None:
        self._pending: list[int] = []  # codes of the frame being filled
        self._position = 0  # audio tokens seen so far
        self.ended = False
        self.frames = 0

    def push(self, token_ids: Iterable[int]) -> np.ndarray:
        """Codes of the frames these tokens completed, shaped (frames, 7)."""
        done: list[list[int]] = []
        for token in token_ids:
            if self.ended:
                raise OrpheusTokenError("token after end of speech")
            if token == END_OF_SPEECH:
                self.ended = True
                continue
            if token in self._SKIPPABLE and self._position == 0:
                continue
            self._pending.append(token_to_code(token, self._position))
            self._position += 1
            if len(self._pending) == FRAME_TOKENS:
                done.append(self._pending)
                self._pending = []
        self.frames += len(done)
        return np.asarray(done, dtype=np.int64).reshape(-1, FRAME_TOKENS)

    @property
    def partial_tokens(self) -> int:
        return len(self._pending)


def frames_to_levels(frames: np.ndarray) -> list[np.ndarray]:
    """(n, 7) frame codes -> [L0 (1, n), L1 (1, 2n), L2 (1, 4n)]."""
    frames = np.asarray(frames, dtype=np.int64).reshape(-1, FRAME_TOKENS)
    return [frames[:, [slot for slot in range(FRAME_TOKENS) if _SLOT_LEVEL[slot] == level]].reshape(1, -1)
            for level in range(3)]
