"""Who spoke when: labels for a transcript's pieces.

- A stereo recording (a phone call with each side on its own channel) is labelled per
  channel: each piece goes to the louder channel over its time ("ch1", "ch2").
- Mono audio: each piece of at least `min_piece_s` gets a voice embedding (Resemblyzer's
  GE2E speaker encoder, real pretrained weights from its wheel); the embeddings are
  clustered (average-linkage agglomerative on cosine distance) into the given number of
  speakers, or estimated: one speaker when even the two most different groups are as close
  as one voice's embeddings are to each other, else the number whose clusters separate best
  (silhouette). Shorter pieces take the label of the nearest labelled piece in time.
  Speakers are named S1, S2, ... in order of first appearance.

One more pass over the file (audio_file.spans): memory stays bounded. A piece holding a
change of speaker gets one label: Whisper's pieces rarely span a turn with a pause between.
pyannote.audio's pipeline is the better choice on GPU hosts with its weights; not used here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from transcription.audio_file import SAMPLE_RATE, probe, spans
from transcription.result import Piece


@dataclass(frozen=True)
class DiarizationOptions:
    encoder: str = "package:resemblyzer-ge2e"  # the GE2E weights: packaged, or a path
    min_piece_s: float = 0.8  # shorter pieces are too short for a reliable voice embedding
    max_speakers: int = 8  # most speakers estimated when the number is not given
    min_silhouette: float = 0.15  # below this no split separates voices: one speaker
    # GE2E embeddings of one voice sit within this cosine distance of each other (average
    # linkage); two groups farther apart than this are two voices.
    same_voice_distance: float = 0.3

    def __post_init__(self) -> None:
        if self.min_piece_s <= 0 or self.max_speakers < 1 or not -1 <= self.min_silhouette <= 1:
            raise ValueError("diarization: min_piece_s > 0, max_speakers >= 1, -1 <= min_silhouette <= 1")


class Diarizer:
    def __init__(self, options: DiarizationOptions = DiarizationOptions()) -> None:
        self._options = options
        self._encoder = None

    def load(self) -> None:
        """Blocking: the speaker encoder (17 MB of weights, a second or two)."""
        from resemblyzer import VoiceEncoder

        from models.assets import resolve_local

        weights = resolve_local(self._options.encoder)
        self._encoder = VoiceEncoder("cpu", verbose=False, weights_fpath=weights or self._options.encoder)

    def label(self, path: str | Path, pieces: list[Piece], *, speakers: int | None = None) -> tuple[list[Piece], int]:
        """Blocking: the pieces with `speaker` set, and how many speakers there are."""
        if not pieces:
            return [], 0
        if speakers is not None and speakers < 1:
            raise ValueError("speakers must be >= 1")
        if probe(path).channels == 2:
            return by_channel(path, pieces)
        if self._encoder is None:
            self.load()
        long_enough = [i for i, p in enumerate(pieces) if p.end - p.start >= self._options.min_piece_s]
        if not long_enough:
            return [replace(p, speaker="S1") for p in pieces], 1
        times = [(pieces[i].start, pieces[i].end) for i in long_enough]
        embeddings = np.stack([self._encoder.embed_utterance(audio) for audio in spans(path, times)])
        labels = cluster(embeddings, speakers, max_speakers=self._options.max_speakers,
                         min_silhouette=self._options.min_silhouette,
                         same_voice_distance=self._options.same_voice_distance)
        by_index = dict(zip(long_enough, labels))
        centres = np.array([(pieces[i].start + pieces[i].end) / 2 for i in long_enough])
        named: dict[int, str] = {}
        out = []
        for i, piece in enumerate(pieces):
            label = by_index.get(i)
            if label is None:  # too short: the nearest labelled piece's speaker
                label = labels[int(np.argmin(np.abs(centres - (piece.start + piece.end) / 2)))]
            name = named.setdefault(int(label), f"S{len(named) + 1}")
            out.append(replace(piece, speaker=name))
        return out, len(set(labels))


def by_channel(path: str | Path, pieces: list[Piece]) -> tuple[list[Piece], int]:
    out = []
    for piece, audio in zip(pieces, spans(path, [(p.start, p.end) for p in pieces], per_channel=True)):
        energy = (audio.astype(np.float64) ** 2).sum(axis=-1) if audio.shape[-1] else np.zeros(2)
        out.append(replace(piece, speaker=f"ch{int(np.argmax(energy)) + 1}"))
    return out, len({p.speaker for p in out})


def cluster(embeddings: np.ndarray, speakers: int | None, *, max_speakers: int = 8,
            min_silhouette: float = 0.15, same_voice_distance: float = 0.3) -> list[int]:
    """Cluster labels (0..k-1) for unit-length embeddings; pure."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import pdist, squareform

    n = len(embeddings)
    if n == 1 or speakers == 1:
        return [0] * n
    distances = pdist(embeddings, metric="cosine")
    tree = linkage(distances, method="average")
    if speakers is not None:
        return [int(c) - 1 for c in fcluster(tree, t=min(speakers, n), criterion="maxclust")]
    if tree[-1, 2] <= same_voice_distance:  # the last merge joins groups as close as one voice
        return [0] * n
    square = squareform(distances)
    best, best_score = [0] * n, min_silhouette
    for k in range(2, min(max_speakers, n - 1) + 1):
        labels = fcluster(tree, t=k, criterion="maxclust") - 1
        score = silhouette(square, labels)
        if score > best_score:
            best, best_score = [int(c) for c in labels], score
    return best


def silhouette(square: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette of a clustering from its square distance matrix; pure."""
    labels = np.asarray(labels)
    if len(set(labels.tolist())) < 2:
        return -1.0
    scores = []
    for i in range(len(labels)):
        own = labels == labels[i]
        if own.sum() <= 1:
            scores.append(0.0)
            continue
        a = square[i, own].sum() / (own.sum() - 1)
        b = min(square[i, labels == other].mean() for other in set(labels.tolist()) if other != labels[i])
        scores.append((b - a) / max(a, b) if max(a, b) > 0 else 0.0)
    return float(np.mean(scores))
