"""Diarization error rate: the share of reference speech time whose speaker is wrong,
missed, or spoken over by a false alarm, under the best one-to-one naming of speakers.
As in the standard scoring, `collar_s` either side of each reference boundary is not scored
(where exactly a turn starts is not the diarizer's question)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

STEP_S = 0.01


def diarization_error_rate(reference: Sequence[tuple[float, float, str]],
                           hypothesis: Sequence[tuple[float, float, str]], *, collar_s: float = 0.25) -> float:
    from scipy.optimize import linear_sum_assignment

    end = max([e for _, e, _ in reference] + [e for _, e, _ in hypothesis] + [0.0])
    frames = int(np.ceil(end / STEP_S)) + 1
    ref_names = sorted({s for *_, s in reference})
    hyp_names = sorted({s for *_, s in hypothesis})
    ref = _timeline(reference, ref_names, frames)
    hyp = _timeline(hypothesis, hyp_names, frames)
    scored = np.ones(frames, bool)
    for start, end, _ in reference:
        for edge in (start, end):
            scored[max(0, int((edge - collar_s) / STEP_S)): int((edge + collar_s) / STEP_S)] = False
    ref, hyp = ref[scored], hyp[scored]
    speech = ref >= 0
    if not speech.any():
        return 0.0
    overlap = np.zeros((len(ref_names), max(1, len(hyp_names))))
    for r in range(len(ref_names)):
        for h in range(len(hyp_names)):
            overlap[r, h] = np.sum((ref == r) & (hyp == h))
    rows, cols = linear_sum_assignment(-overlap)
    mapping = {int(h): int(r) for r, h in zip(rows, cols)}
    mapped = np.array([mapping.get(int(h), -2) if h >= 0 else -1 for h in hyp])
    wrong = np.sum(speech & (mapped != ref))  # confusion and missed speech
    false_alarm = np.sum(~speech & (hyp >= 0))
    return float((wrong + false_alarm) / speech.sum())


def _timeline(spans: Sequence[tuple[float, float, str]], names: list[str], frames: int) -> np.ndarray:
    line = np.full(frames, -1)
    for start, end, name in spans:
        line[int(start / STEP_S): int(end / STEP_S)] = names.index(name)
    return line
