"""HTTP routes for agents: CRUD, and text chat with one.

    POST   /api/agents                 create (201); 409 if the name exists
    GET    /api/agents                 list
    GET    /api/agents/{name}          the definition as given, its source, and what calls get
    PUT    /api/agents/{name}          replace (200)
    PATCH  /api/agents/{name}          JSON Merge Patch (200); null returns a field to the default
    DELETE /api/agents/{name}          204; its knowledge goes too; calls in progress carry on
    POST   /api/agents/{name}/chat     server-sent events (see agent/chat.py)

Malformed JSON is 400, a wrong field 422 (the message names it), a body over the limit
413, an unknown agent 404, a duplicate name or a file-defined agent 409.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agent.agent_registry import AgentRegistry
from agent.chat import TextChat, parse_chat_request, sse
from agent.errors import CadenceError
from agent.http_util import error_for, json_body


def agents_router(agents: AgentRegistry, chat: TextChat, *, max_body_bytes: int,
                  forget_knowledge: Callable[[str], Awaitable[None]]) -> APIRouter:
    router = APIRouter()

    @router.post("/api/agents")
    async def create(request: Request) -> Response:
        try:
            spec = await agents.create(await json_body(request, max_body_bytes))
        except CadenceError as exc:
            return error_for(exc)
        return JSONResponse(agents.describe(spec.name), status_code=201,
                            headers={"Location": f"/api/agents/{spec.name}"})

    @router.get("/api/agents")
    async def list_agents() -> dict:
        return {"agents": agents.list()}

    @router.get("/api/agents/{name}")
    async def show(name: str) -> Response:
        try:
            return JSONResponse(agents.describe(name))
        except CadenceError as exc:
            return error_for(exc)

    async def update(name: str, request: Request, change) -> Response:
        try:
            await change(name, await json_body(request, max_body_bytes))
        except CadenceError as exc:
            return error_for(exc)
        return JSONResponse(agents.describe(name))

    @router.put("/api/agents/{name}")
    async def replace(name: str, request: Request) -> Response:
        return await update(name, request, agents.replace)

    @router.patch("/api/agents/{name}")
    async def patch(name: str, request: Request) -> Response:
        return await update(name, request, agents.patch)

    @router.delete("/api/agents/{name}")
    async def delete(name: str) -> Response:
        try:
            await agents.delete(name)
        except CadenceError as exc:
            return error_for(exc)
        await forget_knowledge(name)
        return Response(status_code=204)

    @router.post("/api/agents/{name}/chat")
    async def chat_with(name: str, request: Request) -> Response:
        try:
            chat_request = parse_chat_request(await json_body(request, max_body_bytes))
            events = chat.events(name, chat_request)
            first = await anext(events)  # an unknown agent is a 404, not an event in a 200 stream
        except CadenceError as exc:
            return error_for(exc)

        async def stream():
            try:
                yield sse(first)
                async for event in events:
                    yield sse(event)
            finally:
                await events.aclose()  # a client that left stops the generation

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return router
