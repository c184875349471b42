"""The Orpheus token source against a real OpenAI-compatible server process: llama.cpp's
`llama-server` (the one `make setup` builds) serving a tiny random-weight Llama with Orpheus' vocabulary
(`latency_bench/components/orpheus_standins/tiny_gguf.py`). vLLM and trtllm-serve, which take the prompt as token
ids, cannot run here; llama.cpp's completions endpoint takes text (prompt_format="text")."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from latency_bench.servers import child, free_port
from workers.binaries import find_binary
from models.orpheus import FrameAssembler, prompt_ids
from models.orpheus.build import byte_detokenizer, byte_tokenizer
from models.orpheus.decode_service import SnacDecodeService
from models.orpheus.engine import OrpheusTTSEngine
from models.orpheus.snac_decoder import load_snac
from latency_bench.components.orpheus_standins.tiny_gguf import write_tiny_orpheus_gguf
from models.orpheus.token_source import OpenAICompletionsTokenSource, OrpheusSampling
from models.orpheus.tokens import FRAME_TOKENS, SAMPLES_PER_FRAME

pytestmark = pytest.mark.slow

FRAMES = 60
SAMPLING = OrpheusSampling(max_tokens=FRAMES * FRAME_TOKENS)  # the tiny model never ends speech itself


@pytest.fixture(scope="module")
def llama_cpp_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-cpp")
    model = folder / "tiny-orpheus.gguf"
    write_tiny_orpheus_gguf(model)
    binary = find_binary("llama-server")
    assert binary is not None, "llama-server is not built: run `make setup`"
    url = f"http://127.0.0.1:{free_port()}"
    argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], "-c", "4096",
            "--parallel", "1", "--threads", "2", "--no-webui"]
    with child(argv, folder / "server.log", url + "/health", timeout_s=60):
        yield url


def text_source(url: str) -> OpenAICompletionsTokenSource:
    return OpenAICompletionsTokenSource(url + "/v1", "tiny-orpheus", prompt_format="text", decode=byte_detokenizer)


async def test_the_server_tokenizes_the_text_prompt_into_orpheus_prompt_ids(llama_cpp_server):
    text = text_source(llama_cpp_server).request_body(prompt_ids(byte_tokenizer, "tara", "Hello there."), SAMPLING)
    async with httpx.AsyncClient(base_url=llama_cpp_server) as http:
        # As /v1/completions tokenizes a prompt: BOS added, special tokens parsed.
        ids = (await http.post("/tokenize", json={"content": text["prompt"], "add_special": True,
                                                  "parse_special": True})).json()["tokens"]
    # BOS (the server's), start of human, the text, end of text, end of human, start of AI, start of speech
    assert ids[:2] == [128000, 128259] and ids[-4:] == [128009, 128260, 128261, 128257]


async def test_audio_tokens_stream_from_llama_cpp_as_whole_well_formed_frames(llama_cpp_server):
    source = text_source(llama_cpp_server)
    assembler = FrameAssembler()  # raises on a token in the wrong frame slot
    codes = []
    try:
        async for ids in source.stream(prompt_ids(byte_tokenizer, "tara", "Hello there, friend."), SAMPLING):
            codes.append(assembler.push(ids))
    finally:
        await source.close()
    frames = np.concatenate(codes)
    assert assembler.frames == FRAMES and assembler.partial_tokens == 0
    assert len(np.unique(frames)) > FRAMES  # sampled codes, not one token repeated


async def test_the_orpheus_engine_speaks_from_llama_cpp(llama_cpp_server):
    engine = OrpheusTTSEngine(voice="tara", tokenize=byte_tokenizer, token_source=text_source(llama_cpp_server),
                              codec=lambda: SnacDecodeService(load_snac(None)), sampling=SAMPLING)
    engine.load()
    try:
        pcm = b"".join([chunk async for chunk in engine.synthesize("Hello there.")])
    finally:
        await engine.close()
    assert len(pcm) == FRAMES * SAMPLES_PER_FRAME * 2  # every frame's audio, exactly once (16-bit)
    assert np.abs(np.frombuffer(pcm, dtype=np.int16)).max() > 0
