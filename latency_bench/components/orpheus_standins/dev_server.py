"""A CPU stand-in for an Orpheus token server, speaking the OpenAI completions protocol as
vLLM does for Orpheus: `prompt` as token ids, `stream: true`, `stop_token_ids`,
`skip_special_tokens: false`, and audio tokens streamed as `<custom_token_N>` text.

It serves the in-process tiny random-weight Llama (models/orpheus/tiny_llama.py), so it
runs anywhere and says nothing intelligible: it exists to test the HTTP token source and
the Orpheus plumbing end to end without a GPU, not to be a voice.

    python -m latency_bench orpheus-dev-server --port 8200
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from models.orpheus.tiny_llama import ORPHEUS_VOCAB, InProcessTokenSource
from models.orpheus.token_source import OrpheusSampling
from models.orpheus.tokens import CUSTOM_TOKEN_BASE

MAX_PROMPT_TOKENS = 4096


def create_app(model_name: str = "orpheus-tiny-random") -> FastAPI:
    app = FastAPI(title="Orpheus dev token server")
    source = InProcessTokenSource()
    app.state.requests_finished = 0
    app.state.requests_aborted = 0

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model"}]}

    @app.get("/stats")
    async def stats() -> dict:
        return {"finished": app.state.requests_finished, "aborted": app.state.requests_aborted}

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await request.json()
            prompt = body["prompt"]
            if not (isinstance(prompt, list) and 0 < len(prompt) <= MAX_PROMPT_TOKENS
                    and all(isinstance(t, int) and 0 <= t < ORPHEUS_VOCAB for t in prompt)):
                raise ValueError(f"prompt must be 1..{MAX_PROMPT_TOKENS} token ids below {ORPHEUS_VOCAB}")
            if body.get("stream") is not True:
                raise ValueError("only stream: true is served")
            sampling = OrpheusSampling(temperature=body.get("temperature", 0.6), top_p=body.get("top_p", 0.8),
                                       repetition_penalty=body.get("repetition_penalty", 1.1),
                                       max_tokens=body.get("max_tokens", 2048))
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, status_code=400)
        stop_ids = set(body.get("stop_token_ids") or [])
        request_id = f"cmpl-{uuid.uuid4().hex[:12]}"

        async def events():
            finished = False
            try:
                async for ids in source.stream(prompt, sampling):
                    for token in ids:
                        if token in stop_ids:
                            break
                        chunk = {"id": request_id, "object": "text_completion", "created": int(time.time()),
                                 "model": model_name,
                                 "choices": [{"index": 0, "text": f"<custom_token_{token - CUSTOM_TOKEN_BASE}>",
                                              "finish_reason": None}]}
                        yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"
                finished = True
            finally:  # the client went away (barge-in): generation stops with this generator
                if finished:
                    app.state.requests_finished += 1
                else:
                    app.state.requests_aborted += 1

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench orpheus-dev-server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    args = parser.parse_args(argv)
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")
    return 0
