"""Sentence embeddings for agents' knowledge retrieval: all-MiniLM-L6-v2 on two runtimes.

all-MiniLM-L6-v2 gives 384 numbers per text: the mean of its token states over the
attention mask, L2-normalised, so a dot product between two vectors is their cosine.
  onnx                   the int8 ONNX export on onnxruntime (the embedded default: no torch,
                         a 23 MB file). The graph ends at the token states
                         (`last_hidden_state`); pooling and normalising happen here, in numpy.
  sentence-transformers  the float32 weights on torch via sentence-transformers, which pools
                         and normalises itself; it also takes a Hugging Face id on GPU hosts.
Both truncate every text to `max_tokens` word pieces: MiniLM was trained on 256, and
words past the cut do not count. Callers chunk documents below that length.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from models.assets import resolve_local
from models.base import EmbeddingEngine
from models.runner import ModelRunner, RunnerLoad

log = logging.getLogger(__name__)

ENGINES = ("onnx", "sentence-transformers")
DEVICES = ("cpu", "cuda")
# The packaged model each runtime reads when the options name none.
DEFAULT_MODELS = {
    "onnx": "package:all-minilm-l6-v2-int8",
    "sentence-transformers": "package:all-minilm-l6-v2",
}
MINILM_TRAINED_TOKENS = 256  # sequence length all-MiniLM-L6-v2 was fine-tuned on
BERT_MAX_POSITIONS = 512  # its position table: longer inputs cannot be encoded at all
_POOL_EPSILON = 1e-9  # as sentence-transformers: guards an all-padding row
_NORM_EPSILON = 1e-12  # as torch.nn.functional.normalize: guards a zero vector
_WARM_UP_TEXT = "How late are you open today?"


class EmbeddingError(Exception):
    """The embedder cannot run as configured; the message says what to change."""


@dataclass(frozen=True)
class EmbeddingOptions:
    engine: str = "onnx"  # "onnx" (int8, onnxruntime) or "sentence-transformers" (float32, torch)
    # package:<name>, a local path (.onnx file for onnx; model folder for sentence-transformers),
    # or a Hugging Face id (sentence-transformers only; downloaded). None: DEFAULT_MODELS[engine].
    model: str | None = None
    # onnx only: tokenizer.json as package:<name>, a file, a folder holding one, or a hub id.
    tokenizer: str = "package:all-minilm-l6-v2-tokenizer"
    device: str = "cpu"  # "cpu" or "cuda" (onnx needs onnxruntime-gpu, torch a CUDA build)
    # Intra-op threads; 0 leaves the runtime's default (one per core). torch's count is
    # process-wide, so the sentence-transformers engine changes it only when this is set.
    threads: int = 0
    # Word pieces kept per text, [CLS] and [SEP] included; the rest is cut off silently.
    max_tokens: int = MINILM_TRAINED_TOKENS
    batch_size: int = 32  # texts per forward pass when many are embedded at once (ingestion)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"embedding engine {self.engine!r} is unknown; known: {', '.join(ENGINES)}")
        if self.device not in DEVICES:
            raise ValueError(f"embedding device {self.device!r} is unknown; known: {', '.join(DEVICES)}")
        if not 3 <= self.max_tokens <= BERT_MAX_POSITIONS:
            raise ValueError(f"embedding max_tokens must be 3..{BERT_MAX_POSITIONS}, got {self.max_tokens}")
        if self.threads < 0 or self.batch_size < 1:
            raise ValueError("embedding threads must be >= 0 and batch_size >= 1")

    @property
    def model_reference(self) -> str:
        return self.model or DEFAULT_MODELS[self.engine]


def mean_pool(token_states: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """(batch, tokens, dims) -> (batch, dims): the mean over real tokens, padding left out."""
    mask = attention_mask[..., None].astype(np.float32)
    return (token_states * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), _POOL_EPSILON)


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, _NORM_EPSILON)).astype(np.float32, copy=False)


class _RunnerEmbedder(RunnerLoad, EmbeddingEngine):
    """What both runtimes share: one model thread, the empty case, the loaded check."""

    def __init__(self, options: EmbeddingOptions, *, max_waiting: int = 16) -> None:
        self.options = options
        self.dimensions = 0  # read from the model in load()
        self._runner = ModelRunner("embedder", max_waiting=max_waiting)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await self._runner.run(partial(self.embed_blocking, list(texts)))

    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        if not self._loaded():
            raise EmbeddingError(f"{type(self).__name__}.load() was not called")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        return self._encode(texts)

    def warm_up(self) -> None:
        self.embed_blocking([_WARM_UP_TEXT])

    async def close(self) -> None:
        self._runner.shutdown()
        self._release()

    @abstractmethod
    def _loaded(self) -> bool: ...

    @abstractmethod
    def _encode(self, texts: list[str]) -> np.ndarray:
        """Normalised vectors for a non-empty list, on the calling thread."""

    @abstractmethod
    def _release(self) -> None: ...


class SentenceTransformerEmbedder(_RunnerEmbedder):
    def __init__(self, options: EmbeddingOptions, *, max_waiting: int = 16) -> None:
        super().__init__(options, max_waiting=max_waiting)
        self._model: Any = None

    def load(self) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        if self.options.device == "cuda" and not torch.cuda.is_available():
            raise EmbeddingError("embedding device cuda: this torch has no CUDA device; use device cpu")
        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        local = resolve_local(self.options.model_reference)
        source = str(local) if local is not None else self.options.model_reference  # hub id
        log.info("loading sentence-transformers embedder from %s on %s", source, self.options.device)
        model = SentenceTransformer(source, device=self.options.device)
        model.max_seq_length = self.options.max_tokens
        self.dimensions = int(model.get_sentence_embedding_dimension())
        self._model = model

    def _loaded(self) -> bool:
        return self._model is not None

    def _encode(self, texts: list[str]) -> np.ndarray:
        vectors = self._model.encode(
            texts, batch_size=self.options.batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        )
        return vectors.astype(np.float32, copy=False)

    def _release(self) -> None:
        self._model = None


class OnnxEmbedder(_RunnerEmbedder):
    def __init__(self, options: EmbeddingOptions, *, max_waiting: int = 16) -> None:
        super().__init__(options, max_waiting=max_waiting)
        self._session: Any = None
        self._tokenizer: Any = None
        self._input_names: frozenset[str] = frozenset()
        self._pooled_in_graph = False  # some exports end at the sentence vector, not token states

    def load(self) -> None:
        import onnxruntime as ort

        path = resolve_local(self.options.model_reference)
        if path is None or path.suffix != ".onnx" or not path.is_file():
            raise EmbeddingError(
                f"onnx embedder model {self.options.model_reference!r} must be a package:<name> or a .onnx file path"
            )
        self._tokenizer = _load_tokenizer(self.options.tokenizer, self.options.max_tokens)
        log.info("loading onnx embedder %s on %s", path, self.options.device)
        self._session = ort.InferenceSession(str(path), sess_options=self._session_options(ort),
                                             providers=_providers(ort, self.options.device))
        self._input_names = frozenset(i.name for i in self._session.get_inputs())
        missing = {"input_ids", "attention_mask"} - self._input_names
        if missing:
            raise EmbeddingError(f"{path} lacks the BERT inputs {sorted(missing)}; is it a sentence encoder?")
        output_shape = self._session.get_outputs()[0].shape
        self._pooled_in_graph = len(output_shape) == 2
        dims = output_shape[-1]
        self.dimensions = dims if isinstance(dims, int) else self._encode([_WARM_UP_TEXT]).shape[1]

    def _session_options(self, ort: Any) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.options.threads
        options.inter_op_num_threads = 1  # one sequential graph; a second pool would only contend
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return options

    def _loaded(self) -> bool:
        return self._session is not None

    def _encode(self, texts: list[str]) -> np.ndarray:
        # Longest first, as sentence-transformers does, so each batch pads to similar lengths.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        batches = [order[start : start + self.options.batch_size]
                   for start in range(0, len(order), self.options.batch_size)]
        pieces = [(rows, self._encode_batch([texts[i] for i in rows])) for rows in batches]
        out = np.empty((len(texts), pieces[0][1].shape[1]), dtype=np.float32)
        for rows, vectors in pieces:
            out[rows] = vectors
        return out

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts)
        feed = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        feed = {name: value for name, value in feed.items() if name in self._input_names}
        states = self._session.run(None, feed)[0]
        pooled = states if self._pooled_in_graph else mean_pool(states, feed["attention_mask"])
        return l2_normalise(pooled)

    def _release(self) -> None:
        self._session = None
        self._tokenizer = None


def _providers(ort: Any, device: str) -> list[str]:
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise EmbeddingError("embedding device cuda: this onnxruntime has no CUDA provider; "
                             "install onnxruntime-gpu or use device cpu")
    return ["CUDAExecutionProvider", "CPUExecutionProvider"]


def _load_tokenizer(reference: str, max_tokens: int) -> Any:
    from tokenizers import Tokenizer

    local = resolve_local(reference)
    if local is None:
        tokenizer = Tokenizer.from_pretrained(reference)  # hub id, downloaded
    else:
        path = local / "tokenizer.json" if local.is_dir() else local
        if not path.is_file():
            raise EmbeddingError(f"embedding tokenizer {reference!r}: no tokenizer.json at {path}")
        tokenizer = Tokenizer.from_file(str(path))
    # The file ships fixed 128-token padding and truncation; we want max_tokens, and
    # padding only to the longest text of each batch.
    tokenizer.enable_truncation(max_length=max_tokens)
    pad_token = tokenizer.padding["pad_token"] if tokenizer.padding else "[PAD]"
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(pad_token) or 0, pad_token=pad_token)
    return tokenizer


def build_embedder(options: EmbeddingOptions, *, max_waiting: int = 16) -> EmbeddingEngine:
    if options.engine == "onnx":
        return OnnxEmbedder(options, max_waiting=max_waiting)
    return SentenceTransformerEmbedder(options, max_waiting=max_waiting)
