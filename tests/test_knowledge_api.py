"""The knowledge HTTP API around a real KnowledgeBase (SQLite file, FTS5, sqlite-vec) and
a hashing embedder: every refusal, each file type, list/delete, background jobs, search."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from agent.ingest_cli import ingest
from agent.knowledge_routes import knowledge_router
from knowledge.base import KnowledgeBase
from knowledge.jobs import IngestJobs
from knowledge.options import KnowledgeOptions
from tests.fakes import HashingEmbedder
from tests.test_knowledge_documents import minimal_pdf

AGENTS = {"clinic", "shop"}
OPTIONS = KnowledgeOptions(max_file_bytes=64 * 1024, max_files_per_request=3, max_documents_per_agent=5,
                           background_threshold_bytes=8 * 1024, max_pending_jobs=1, chunk_words=40)
CLINIC_MD = b"# Clinic\n\n## Opening hours\nWe open at 9:30 a.m. on weekdays. Dr. Lee works on Mondays.\n"


class GatedEmbedder(HashingEmbedder):
    """Blocks in embed_blocking until the test opens the gate; fails on texts with 'EXPLODE'."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        self.entered.set()
        assert self.gate.wait(10), "test gate never opened"
        if any("EXPLODE" in t for t in texts):
            raise RuntimeError("embedder failure")
        return super().embed_blocking(texts)


async def _exists(name: str) -> bool:
    return name in AGENTS


def make_app(knowledge: KnowledgeBase, jobs: IngestJobs, options: KnowledgeOptions) -> FastAPI:
    app = FastAPI()
    app.include_router(knowledge_router(knowledge, jobs, _exists, options))
    return app


@pytest.fixture
def embedder() -> GatedEmbedder:
    return GatedEmbedder()


@pytest.fixture
async def service(tmp_path, embedder) -> AsyncIterator[tuple[httpx.AsyncClient, KnowledgeBase, IngestJobs]]:
    knowledge = KnowledgeBase(str(tmp_path / "cadence.sqlite3"), embedder, OPTIONS)
    await knowledge.open()
    jobs = IngestJobs(knowledge)
    jobs.start()
    transport = httpx.ASGITransport(app=make_app(knowledge, jobs, OPTIONS))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client, knowledge, jobs
    embedder.gate.set()
    await jobs.close()
    await knowledge.close()


def files(*items: tuple[str, bytes] | tuple[str, bytes, str]) -> list:
    return [("file", (item[0], item[1], item[2] if len(item) > 2 else "application/octet-stream")) for item in items]


async def upload(client: httpx.AsyncClient, agent: str, *items) -> httpx.Response:
    return await client.post(f"/api/agents/{agent}/knowledge", files=files(*items))


async def stored(client: httpx.AsyncClient, agent: str) -> list[dict]:
    response = await client.get(f"/api/agents/{agent}/knowledge")
    assert response.status_code == 200
    return response.json()["documents"]


def assert_error(response: httpx.Response, status: int, *words: str, retryable: bool = False) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "retryable"} and body["retryable"] is retryable
    for word in words:
        assert word in body["error"]


async def test_each_file_type_ingests_and_is_searchable(service):
    client, _, _ = service
    html = b"<html><body><nav>Menu</nav><h1>Parking</h1><p>Parking is behind the bakery.</p></body></html>"
    pdf = minimal_pdf([["Flu jabs are given on Thursdays without an appointment."]])
    response = await upload(client, "clinic", ("hours.md", CLINIC_MD), ("parking.html", html),
                            ("flu.pdf", pdf, "application/pdf"))
    assert response.status_code == 201, response.text
    documents = response.json()["documents"]
    assert [(d["source"], d["kind"]) for d in documents] == [("hours.md", "markdown"), ("parking.html", "html"),
                                                             ("flu.pdf", "pdf")]
    assert all(d["chunk_count"] >= 1 and not d["duplicate"] for d in documents)
    response = await upload(client, "clinic", ("prices.txt", b"A check-up costs 40 pounds.", "text/plain"))
    assert response.status_code == 201
    assert len(await stored(client, "clinic")) == 4
    for question, source in (("when do you open on weekdays", "hours.md"), ("where is parking", "parking.html"),
                             ("flu jabs thursdays", "flu.pdf"), ("check-up cost", "prices.txt")):
        results = (await client.get("/api/agents/clinic/search", params={"q": question, "k": 1})).json()["results"]
        assert results[0]["source"] == source, question


async def test_search_answers_in_its_shape(service):
    client, _, _ = service
    await upload(client, "clinic", ("hours.md", CLINIC_MD))
    response = await client.get("/api/agents/clinic/search", params={"q": "Dr. Lee Mondays", "k": 3})
    assert response.status_code == 200
    (result,) = response.json()["results"]
    assert set(result) == {"text", "score", "source", "chunk_id"}
    assert "Dr. Lee works on Mondays." in result["text"] and result["text"].startswith("Clinic > Opening hours\n")
    assert isinstance(result["chunk_id"], int) and result["score"] > 0


@pytest.mark.parametrize(("params", "names"), [
    ({}, "q"), ({"q": ""}, "q"), ({"q": "   "}, "q"), ({"q": "x" * 1001}, "q"),
    ({"q": "hours", "k": "0"}, "k"), ({"q": "hours", "k": "21"}, "k"), ({"q": "hours", "k": "five"}, "k"),
    ({"q": "hours", "mode": "magic"}, "mode"),
])
async def test_bad_search_parameters_are_400_naming_the_parameter(service, params, names):
    client, _, _ = service
    response = await client.get("/api/agents/clinic/search", params=params)
    assert_error(response, 400, f"parameter {names}")


async def test_search_accepts_the_limits(service):
    client, _, _ = service
    for params in ({"q": "x" * 1000, "k": "20"}, {"q": "h", "k": "1", "mode": "lexical"}, {"q": "?!", "mode": "dense"}):
        assert (await client.get("/api/agents/clinic/search", params=params)).status_code == 200


@pytest.mark.parametrize(("items", "status", "words"), [
    ((("empty.txt", b""),), 422, ("empty.txt", "empty")),
    ((("blank.md", b" \n\t\n"),), 422, ("blank.md",)),
    ((("photo.jpg", b"\xff\xd8\xff", "image/jpeg"),), 415, ("photo.jpg", ".pdf")),
    ((("fake.pdf", b"just some text"),), 422, ("fake.pdf", "not a PDF")),
    ((("latin.txt", "caf\xe9".encode("latin-1")),), 422, ("latin.txt", "UTF-8")),
    ((("big.txt", b"word " * 20_000),), 413, ("big.txt", "limit")),
    ((("a.txt", b"A."), ("b.txt", b"B."), ("c.txt", b"C."), ("d.txt", b"D.")), 413, ("more than 3 files",)),
    ((("good.txt", b"Good text."), ("bad.jpg", b"x")), 415, ("bad.jpg",)),
    ((("good.txt", b"Good text."), ("empty.md", b"")), 422, ("empty.md",)),
])
async def test_refused_uploads_store_nothing_of_their_request(service, items, status, words):
    client, knowledge, _ = service
    assert_error(await upload(client, "clinic", *items), status, *words)
    assert await stored(client, "clinic") == []
    assert await knowledge.usage("clinic") == (0, 0)


async def test_an_oversized_file_is_refused_without_reading_the_rest(service):
    client, _, _ = service
    boundary = "b0undary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"huge.txt\"\r\n"
            "Content-Type: text/plain\r\n\r\n").encode()
    piece, pieces = b"x" * 4096, 1000  # 4 MB offered; the limit is 64 KiB
    sent = 0

    async def body():
        nonlocal sent
        yield head
        for _ in range(pieces):
            sent += len(piece)
            yield piece
        yield f"\r\n--{boundary}--\r\n".encode()

    response = await client.post("/api/agents/clinic/knowledge", content=body(),
                                 headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert_error(response, 413, "huge.txt")
    assert sent < 2 * OPTIONS.max_file_bytes  # stopped soon after the limit, not at 4 MB


@pytest.mark.parametrize(("content_type", "body"), [
    ("application/json", b'{"file": "x"}'),
    ("multipart/form-data", b"no boundary"),
    ("multipart/form-data; boundary=zz",
     b"--zz\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nv\r\n--zz--\r\n"),
])
async def test_a_request_without_files_is_400(service, content_type, body):
    client, _, _ = service
    response = await client.post("/api/agents/clinic/knowledge", content=body, headers={"content-type": content_type})
    assert_error(response, 400)


async def test_unknown_agents_are_404_everywhere(service):
    client, _, _ = service
    for response in (await upload(client, "ghost", ("a.txt", b"Some text.")),
                     await client.get("/api/agents/ghost/knowledge"),
                     await client.delete("/api/agents/ghost/knowledge/abc"),
                     await client.get("/api/agents/ghost/knowledge/jobs/abc"),
                     await client.get("/api/agents/ghost/search", params={"q": "hours"})):
        assert_error(response, 404, "ghost")


async def test_list_and_delete(service):
    client, _, _ = service
    (doc,) = (await upload(client, "clinic", ("hours.md", CLINIC_MD))).json()["documents"]
    other = (await upload(client, "shop", ("returns.txt", b"Returns within 30 days."))).json()["documents"][0]
    assert [d["id"] for d in await stored(client, "clinic")] == [doc["id"]]
    assert_error(await client.delete(f"/api/agents/clinic/knowledge/{other['id']}"), 404)  # the shop's
    response = await client.delete(f"/api/agents/clinic/knowledge/{doc['id']}")
    assert response.status_code == 204 and response.content == b""
    assert await stored(client, "clinic") == []
    assert (await client.get("/api/agents/clinic/search", params={"q": "Dr. Lee"})).json()["results"] == []
    assert_error(await client.delete(f"/api/agents/clinic/knowledge/{doc['id']}"), 404)
    assert len(await stored(client, "shop")) == 1


async def test_the_same_bytes_twice_return_the_stored_document(service):
    client, _, _ = service
    first = (await upload(client, "clinic", ("hours.md", CLINIC_MD))).json()["documents"][0]
    again = (await upload(client, "clinic", ("copy.md", CLINIC_MD))).json()["documents"][0]
    assert again["id"] == first["id"] and again["duplicate"] is True
    assert len(await stored(client, "clinic")) == 1
    shop = (await upload(client, "shop", ("hours.md", CLINIC_MD))).json()["documents"][0]
    assert shop["id"] != first["id"]  # another agent's copy is its own


async def test_the_agent_document_cap_is_409(service):
    client, _, _ = service
    for n in range(OPTIONS.max_documents_per_agent):
        assert (await upload(client, "clinic", (f"{n}.txt", f"Note number {n}.".encode()))).status_code == 201
    assert_error(await upload(client, "clinic", ("one-more.txt", b"Too many.")), 409, "delete")


async def test_search_is_isolated_between_agents(service):
    client, _, _ = service
    await upload(client, "clinic", ("hours.md", CLINIC_MD))
    await upload(client, "shop", ("returns.txt", b"Returns of unworn shoes within 30 days."))
    clinic_ids = {r["chunk_id"] for r in (await client.get(
        "/api/agents/clinic/search", params={"q": "opening hours Dr. Lee", "k": 20})).json()["results"]}
    for mode in ("hybrid", "dense", "lexical"):
        params = {"q": "opening hours Dr. Lee Mondays", "k": 20, "mode": mode}
        results = (await client.get("/api/agents/shop/search", params=params)).json()["results"]
        assert all(r["source"] == "returns.txt" for r in results)
        assert not clinic_ids & {r["chunk_id"] for r in results}


async def test_a_large_upload_becomes_a_background_job_that_finishes(service):
    client, _, jobs = service
    text = " ".join(f"Room {n} was cleaned on Monday." for n in range(600)).encode()  # ~18 KB > 8 KiB
    response = await upload(client, "clinic", ("rooms.txt", text))
    assert response.status_code == 202, response.text
    job = response.json()["job"]
    assert response.headers["location"] == f"/api/agents/clinic/knowledge/jobs/{job['id']}"
    assert job["status"] in ("queued", "running") and job["files"][0]["source"] == "rooms.txt"
    await asyncio.wait_for(jobs.wait("clinic", job["id"]), 10)
    status = (await client.get(response.headers["location"])).json()["job"]
    assert status["status"] == "done" and status["error"] is None
    assert status["chunks_done"] == status["chunks_total"] > 1
    assert status["files"][0]["document"]["source"] == "rooms.txt"
    assert [d["source"] for d in await stored(client, "clinic")] == ["rooms.txt"]
    assert_error(await client.get(f"/api/agents/shop/knowledge/jobs/{job['id']}"), 404)  # not the shop's


async def test_a_full_job_queue_refuses_with_503_retryable(service, embedder):
    client, _, jobs = service
    big = [(f"r{n}.txt", " ".join(f"Room {n}-{i} was cleaned." for i in range(600)).encode()) for n in range(3)]
    embedder.gate.clear()
    embedder.entered.clear()
    first = (await upload(client, "clinic", big[0])).json()["job"]
    assert await asyncio.to_thread(embedder.entered.wait, 10)  # the worker is embedding job 1
    second = (await upload(client, "clinic", big[1])).json()["job"]  # waits in the queue (bound 1)
    assert jobs.depth == 1
    assert_error(await upload(client, "clinic", big[2]), 503, "retry", retryable=True)
    embedder.gate.set()
    for job in (first, second):
        assert (await asyncio.wait_for(jobs.wait("clinic", job["id"]), 10)).status == "done"


async def test_a_failing_job_reports_its_error_and_stores_nothing(service):
    client, knowledge, jobs = service
    text = (" ".join(f"Shelf {n} holds paint." for n in range(700)) + " EXPLODE now.").encode()
    job = (await upload(client, "shop", ("paint.txt", text))).json()["job"]
    finished = await asyncio.wait_for(jobs.wait("shop", job["id"]), 10)
    assert finished.status == "failed" and "embedder" in finished.error
    assert await knowledge.usage("shop") == (0, 0)


async def test_closing_cancels_a_running_job_and_stores_nothing(tmp_path, embedder):
    knowledge = KnowledgeBase(str(tmp_path / "k.sqlite3"), embedder, OPTIONS)
    await knowledge.open()
    jobs = IngestJobs(knowledge)
    jobs.start()
    prepared = await knowledge.prepare("rooms.txt", None, " ".join(f"Room {n} is blue." for n in range(900)).encode())
    embedder.gate.clear()
    embedder.entered.clear()
    job = jobs.submit("clinic", [prepared])
    assert await asyncio.to_thread(embedder.entered.wait, 10)
    closing = asyncio.create_task(jobs.close())
    embedder.gate.set()  # the running batch ends; the next one sees the stop flag
    await asyncio.wait_for(closing, 10)
    assert job.status == "failed" and "stopped" in job.error
    await knowledge.close()
    reopened = KnowledgeBase(str(tmp_path / "k.sqlite3"), HashingEmbedder(), OPTIONS)
    await reopened.open()
    assert await reopened.usage("clinic") == (0, 0)
    await reopened.close()


def test_the_cli_uploads_files_and_folders_and_reports_each(tmp_path, capsys):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "hours.md").write_bytes(CLINIC_MD)
    (docs / "sub" / "rooms.txt").write_bytes(" ".join(f"Room {n} was cleaned." for n in range(700)).encode())
    (docs / "notes.xyz").write_bytes(b"skipped: not a supported extension")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe not utf-8")
    options = replace(OPTIONS, max_pending_jobs=4)
    knowledge = KnowledgeBase(str(tmp_path / "k.sqlite3"), HashingEmbedder(), options)
    jobs = IngestJobs(knowledge)

    @asynccontextmanager
    async def lifespan(_app):
        await knowledge.open()
        jobs.start()
        yield
        await jobs.close()
        await knowledge.close()

    app = make_app(knowledge, jobs, options)
    app.router.lifespan_context = lifespan
    with TestClient(app, base_url="http://test") as client:
        code = ingest("http://test", "clinic", [docs, tmp_path / "bad.txt", tmp_path / "missing.md"],
                      progress=False, client=client, poll_interval_s=0.01)
        listed = client.get("/api/agents/clinic/knowledge").json()["documents"]
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert sorted(d["source"] for d in listed) == ["hours.md", "rooms.txt"]
    assert any(line.startswith("ok") and "hours.md" in line for line in out)
    assert any(line.startswith("ok") and "rooms.txt" in line for line in out)
    assert any(line.startswith("failed") and "bad.txt" in line and "422" in line for line in out)
    assert any(line.startswith("failed") and "missing.md" in line for line in out)
    assert not any("notes.xyz" in line for line in out)
