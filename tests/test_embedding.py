"""all-MiniLM-L6-v2 on both runtimes, from the packaged weights (no network)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

from agent.errors import ModelAssetError
from models import assets
from models.embedding import (
    ENGINES,
    EmbeddingError,
    EmbeddingOptions,
    OnnxEmbedder,
    build_embedder,
)

pytestmark = pytest.mark.slow

DIMENSIONS = 384
SENTENCES = [
    "How do I reset my password?",
    "What time does the pharmacy open on Sundays?",
    "The delivery was left at the wrong address.",
    "Can I bring my dog on the train?",
    "Refunds are paid to the original card within five working days.",
    "",  # [CLS][SEP] only: still a unit vector
]
# Measured with the packaged models: the int8 ONNX and float32 torch vectors of the same
# text have cosine 0.996 (the empty text) to 0.9997; the bound leaves room.
RUNTIME_AGREEMENT = 0.98


def _load(engine: str) -> Iterator:
    embedder = build_embedder(EmbeddingOptions(engine=engine))
    embedder.load()
    embedder.warm_up()
    yield embedder
    asyncio.run(embedder.close())


@pytest.fixture(scope="module")
def onnx_embedder() -> Iterator:
    yield from _load("onnx")


@pytest.fixture(scope="module")
def torch_embedder() -> Iterator:
    yield from _load("sentence-transformers")


@pytest.fixture(params=ENGINES)
def embedder(request):
    fixture = {"onnx": "onnx_embedder", "sentence-transformers": "torch_embedder"}[request.param]
    return request.getfixturevalue(fixture)


def _long_text(words: int) -> str:
    vocabulary = "invoice shipment refund warehouse customer ticket schedule account".split()
    return " ".join(vocabulary[(i * 7 + i // 3) % len(vocabulary)] for i in range(words))


def test_vectors_are_unit_length_float32_rows(embedder):
    vectors = embedder.embed_blocking(SENTENCES)
    assert embedder.dimensions == DIMENSIONS
    assert vectors.shape == (len(SENTENCES), DIMENSIONS)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_rows_keep_the_input_order(embedder):
    # The onnx runtime sorts by length inside a call; each row must still match its text.
    together = embedder.embed_blocking(SENTENCES)
    alone = np.vstack([embedder.embed_blocking([s]) for s in SENTENCES])
    np.testing.assert_allclose(np.sum(together * alone, axis=1), 1.0, atol=1e-3)


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(embedder):
    question, paraphrase, unrelated = embedder.embed_blocking([
        "How do I reset my password?",
        "I forgot my password; how can I change it?",
        "The train to Boston leaves at noon.",
    ])
    assert question @ paraphrase > question @ unrelated + 0.4


def test_the_two_runtimes_agree(onnx_embedder, torch_embedder):
    texts = [*SENTENCES, _long_text(300)]
    cosines = np.sum(onnx_embedder.embed_blocking(texts) * torch_embedder.embed_blocking(texts), axis=1)
    assert cosines.min() > RUNTIME_AGREEMENT, cosines


def test_a_long_text_is_truncated_to_its_first_word_pieces(embedder):
    # Every word here is at least one word piece, so 400 words already pass the 256 cut:
    # the 5,000-word text and its first 400 words become the same tokens.
    long = _long_text(5_000)
    head = " ".join(long.split()[:400])
    vectors = embedder.embed_blocking([long, head])
    assert vectors.shape == (2, DIMENSIONS)
    assert vectors[0] @ vectors[1] > 0.9999


def test_an_empty_list_gives_no_rows(embedder):
    assert embedder.embed_blocking([]).shape == (0, DIMENSIONS)


async def test_an_empty_list_gives_no_rows_from_asyncio(embedder):
    assert (await embedder.embed([])).shape == (0, DIMENSIONS)


async def test_embed_leaves_the_event_loop_free(embedder):
    batch = [_long_text(200)] * 16
    task = asyncio.create_task(embedder.embed(batch))
    loop_ran_while_embedding = asyncio.Event()

    async def watch() -> None:
        # Runs only if the loop is free: the batch is on the model thread, not finished yet.
        while not task.done():
            if embedder.queue_depth == 1:
                loop_ran_while_embedding.set()
            await asyncio.sleep(0)

    await asyncio.gather(task, watch())
    assert loop_ran_while_embedding.is_set()
    assert task.result().shape == (16, DIMENSIONS)
    assert embedder.queue_depth == 0


def test_embedding_before_load_is_refused():
    with pytest.raises(EmbeddingError, match="load"):
        OnnxEmbedder(EmbeddingOptions()).embed_blocking(["hello"])


def test_a_model_with_the_wrong_sha256_is_refused(monkeypatch):
    spec = assets.PACKAGED_MODELS["all-minilm-l6-v2-int8"]
    monkeypatch.setitem(assets.PACKAGED_MODELS, "all-minilm-l6-v2-int8",
                        dataclasses.replace(spec, sha256="0" * 64))
    with pytest.raises(ModelAssetError, match="sha256"):
        OnnxEmbedder(EmbeddingOptions(engine="onnx")).load()


@pytest.mark.parametrize("bad", [
    {"engine": "tensorflow"}, {"device": "tpu"}, {"max_tokens": 1024}, {"batch_size": 0}, {"threads": -1},
])
def test_bad_options_are_refused(bad):
    with pytest.raises(ValueError):
        EmbeddingOptions(**bad)
