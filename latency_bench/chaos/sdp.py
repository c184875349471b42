"""Chaos scenario: SDP fuzzing of POST /api/offer, against a running server.

Mutated offers (latency_bench/chaos/inputs/sdp_mutations.py) are sent `concurrency` at a time. Each must
be refused with a 4xx at once; one that is still a valid offer may be answered 200, and then
the bench hangs up as a caller can. A trickled offer gets end-of-candidates (PATCH
/api/offer) and, having no candidates, fails ICE; a whole offer's candidates point at a
`RefusingIcePeer` that answers each of the server's ICE checks with an error, so its ICE
fails too; either way the server then closes the peer connection and ends the call. An offer
whose candidates were mutated to lead nowhere is left to the server's connect deadline
(limits.handshake_timeout_seconds). A worker waits for its answered call to end before it
sends the next offer, so the bench never holds more calls than `concurrency` (keep it under
the server's call cap, or offers are refused 503).

Afterwards no call may be in progress and the server's open files must be back to where they
were (each peer connection holds UDP sockets). `run` returns the figures; `judge` judges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator

import httpx
from aioice import stun

from latency_bench.chaos.admission import calls_active
from latency_bench.chaos.inputs.sdp_mutations import LOOPBACK, FuzzedOffer, fuzzed_offer, real_offers
from latency_bench.chaos.server_figures import process_figures, settle
from latency_bench.chaos.verdict import Verdict

ANSWER_TIMEOUT_S = 10.0  # no answer by then counts as a hang
CALL_END_WAIT_S = 15.0  # an answered call must end this long after the hang-up (past the connect deadline)
SETTLE_TIMEOUT_S = 30.0  # for the server's open files to come back down, once no call is left
POLL_S = 0.05
KEPT_EXAMPLES = 5  # bodies kept per kind of failure, each cut to EXAMPLE_BYTES
EXAMPLE_BYTES = 4_096
PASS_ANSWER_MS = 200


class RefusingIcePeer(asyncio.DatagramProtocol):
    """Where the whole seed's candidates point: answers every ICE check with 403, signed with
    the seeds' ICE password (the server ignores an unsigned answer and keeps retrying), so an
    answered call's ICE fails at once, instead of at the server's connect deadline."""

    def __init__(self) -> None:
        self.password = b""  # the seeds' a=ice-pwd, known once they are made
        self.transport: asyncio.DatagramTransport | None = None
        self.checks_refused = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        try:
            check = stun.parse_message(data)
        except ValueError:
            return
        if check.message_class != stun.Class.REQUEST or self.transport is None:
            return
        refusal = stun.Message(message_method=check.message_method, message_class=stun.Class.ERROR,
                               transaction_id=check.transaction_id)
        refusal.attributes["ERROR-CODE"] = (403, "Forbidden")
        refusal.add_message_integrity(self.password)
        refusal.add_fingerprint()
        self.transport.sendto(bytes(refusal), addr)
        self.checks_refused += 1


@contextlib.asynccontextmanager
async def seeds_and_refuser() -> AsyncIterator[tuple[tuple[str, ...], RefusingIcePeer]]:
    """The real offers to mutate, their candidates on a loopback port a RefusingIcePeer holds."""
    loop = asyncio.get_running_loop()
    transport, peer = await loop.create_datagram_endpoint(RefusingIcePeer, local_addr=(LOOPBACK, 0))
    try:
        seeds = await real_offers(candidate_port=transport.get_extra_info("sockname")[1])
        peer.password = re.search(r"^a=ice-pwd:(\S+)", seeds[0], re.MULTILINE).group(1).encode()
        yield seeds, peer
    finally:
        transport.close()


def _error_of(text: str) -> str:
    """An error answer's message up to its first detail (a class name, a size), to count by."""
    try:
        message = str(json.loads(text).get("error"))
    except (ValueError, AttributeError):
        message = text
    return message.split(":")[0].split(";")[0][:80]


def _status_class(status: int | None) -> str:
    return "no_answer" if status is None else f"{status // 100}xx" if 200 <= status < 600 else "other"


async def hang_up(http: httpx.AsyncClient, answer: dict) -> float | None:
    """Ends an answered call as a caller can (end-of-candidates, so ICE fails at once unless the
    offer named candidates); seconds until the server has ended it, None if it had not in time."""
    started = time.monotonic()
    await http.patch("/api/offer", json={"pc_id": answer.get("pc_id"), "candidates": [{"candidate": ""}]})
    while time.monotonic() - started < CALL_END_WAIT_S:
        call = await http.get(f"/api/calls/{answer.get('call_id')}")
        if call.status_code == 200 and not call.json().get("live"):
            return time.monotonic() - started
        await asyncio.sleep(POLL_S)
    return None


class _Tally:
    """What the answers were, kept small: counts, answer times, a few examples of each failure."""

    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()  # 4xx by the start of their error message
        self.by_mutation: Counter[str] = Counter()
        self.answer_ms: list[float] = []
        self.call_end_s: list[float] = []
        self.calls_left_live = 0
        self.examples: dict[str, list[dict]] = {}

    def keep(self, kind: str, offer: FuzzedOffer, detail: str) -> None:
        kept = self.examples.setdefault(kind, [])
        if len(kept) < KEPT_EXAMPLES:
            kept.append({"mutations": list(offer.mutations), "answer": detail[:500],
                         "body": offer.body[:EXAMPLE_BYTES].decode("utf-8", "backslashreplace")})

    def add(self, offer: FuzzedOffer, status: int | None, ms: float, detail: str) -> None:
        kind = _status_class(status)
        self.statuses[kind] += 1
        self.by_mutation.update(f"{name} {kind}" for name in set(offer.mutations))
        self.answer_ms.append(ms)
        if kind == "4xx":
            self.refusals[f"{status} {_error_of(detail)}"] += 1
        if kind not in ("2xx", "4xx"):
            self.keep(kind, offer, detail)
        elif ms > PASS_ANSWER_MS:
            self.keep("slow", offer, f"{ms:.0f} ms: {detail}")

    def figures(self) -> dict:
        ms, ends = sorted(self.answer_ms) or [0.0], sorted(self.call_end_s)
        return {"status_classes": dict(self.statuses), "server_errors": self.statuses["5xx"],
                "no_answer": self.statuses["no_answer"],
                "answer_ms": {"p50": round(ms[len(ms) // 2], 1), "p99": round(ms[len(ms) * 99 // 100], 1),
                              "max": round(ms[-1], 1)},
                "answers_over_pass_ms": sum(1 for m in ms if m > PASS_ANSWER_MS),
                "answered_2xx": self.statuses["2xx"], "answered_calls_ended": len(ends),
                "answered_calls_left_live": self.calls_left_live,
                "answered_call_end_s": {"p50": round(ends[len(ends) // 2], 2), "max": round(ends[-1], 2)} if ends
                else None,
                "refusals": dict(self.refusals.most_common(20)),
                "by_mutation": dict(sorted(self.by_mutation.items())), "examples": self.examples}


async def _send(http: httpx.AsyncClient, offer: FuzzedOffer, tally: _Tally) -> int | None:
    """The answer's status (None: no answer), after hanging up the call if there was one."""
    sent = time.monotonic()
    try:
        response = await http.post("/api/offer", content=offer.body, headers={"content-type": "application/json"})
    except httpx.HTTPError as exc:  # a hang (timeout) or a dropped connection: no answer at all
        tally.add(offer, None, (time.monotonic() - sent) * 1000, f"{exc.__class__.__name__}: {exc}")
        return None
    tally.add(offer, response.status_code, (time.monotonic() - sent) * 1000, response.text)
    if response.is_success:
        try:
            ended = await hang_up(http, response.json())
        except httpx.HTTPError:
            ended = None
        if ended is None:
            tally.calls_left_live += 1
            tally.keep("left_live", offer, response.text)
        else:
            tally.call_end_s.append(ended)
    return response.status_code


async def _server_figures(base_url: str, http: httpx.AsyncClient, open_fds: float | None = None) -> dict[str, float]:
    """The server's figures once no call is left and its idle housekeeping has run (and, given
    `open_fds`, once the fuzzing's sockets are closed), or as they are when it waits no longer."""
    with contextlib.suppress(TimeoutError):  # calls still in progress: the figures say so
        await settle(base_url)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        figures = {**await process_figures(http), "calls_active": await calls_active(base_url)}
        if open_fds is None or figures["open_fds"] <= open_fds or time.monotonic() > deadline:
            return figures
        await asyncio.sleep(0.2)


async def _warm_up(http: httpx.AsyncClient, seeds: tuple[str, ...]) -> list[float | None]:
    """Each seed as it is: answered, hung up, ended. Also makes whatever a first call loads
    once (and keeps) part of the baseline, not of the figures."""
    ends = []
    for sdp in seeds:
        response = await http.post("/api/offer", json={"sdp": sdp, "type": "offer"})
        response.raise_for_status()
        ends.append(await hang_up(http, response.json()))
    return ends


async def run(base_url: str, *, offers: int, concurrency: int, seed: int) -> dict:
    async with seeds_and_refuser() as (seeds, refuser):
        figures = await _fuzz(base_url, seeds, offers=offers, concurrency=concurrency, seed=seed)
        return {**figures, "ice_checks_refused": refuser.checks_refused}


async def _fuzz(base_url: str, seeds: tuple[str, ...], *, offers: int, concurrency: int, seed: int) -> dict:
    rng = random.Random(seed)
    pending = (fuzzed_offer(seeds, rng) for _ in range(offers))  # each made as it is sent, not all held at once
    tally = _Tally()
    async with httpx.AsyncClient(base_url=base_url, timeout=ANSWER_TIMEOUT_S) as http:
        warm_up_ends = await _warm_up(http, seeds)
        before = await _server_figures(base_url, http)

    async def worker() -> None:
        own = httpx.AsyncClient(base_url=base_url, timeout=ANSWER_TIMEOUT_S)
        try:
            for offer in pending:
                status = await _send(own, offer, tally)
                if status is None or status >= 500:
                    # Starlette answers an unhandled exception 500 and uvicorn then drops the
                    # connection without saying so: the next offer must not be sent into it.
                    await own.aclose()
                    own = httpx.AsyncClient(base_url=base_url, timeout=ANSWER_TIMEOUT_S)
        finally:
            await own.aclose()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    took_s = time.monotonic() - started
    async with httpx.AsyncClient(base_url=base_url, timeout=ANSWER_TIMEOUT_S) as http:
        after = await _server_figures(base_url, http, open_fds=before["open_fds"])
    return {"offers": offers, "concurrency": concurrency, "seed": seed, "took_s": round(took_s, 1),
            "warm_up_calls_ended_s": [None if s is None else round(s, 2) for s in warm_up_ends], **tally.figures(),
            "calls_active_after": after["calls_active"], "open_fds_delta": after["open_fds"] - before["open_fds"],
            "rss_growth_mb": round(after["rss_mb"] - before["rss_mb"], 1)}


def judge(f: dict) -> Verdict:
    classes = f["status_classes"]
    unexpected = sum(n for kind, n in classes.items() if kind not in ("2xx", "4xx"))
    left_behind = f["calls_active_after"] + f["answered_calls_left_live"]
    passed = unexpected == 0 and f["answer_ms"]["max"] <= PASS_ANSWER_MS and left_behind == 0 \
        and f["open_fds_delta"] <= 0
    return Verdict(scenario="sdp-fuzzing",
                   pass_figure=f"{f['offers']} mutated offers: each refused 4xx (or answered 2xx and hung up) within "
                               f"{PASS_ANSWER_MS} ms, 0 5xx, 0 peer connections left behind",
                   measured=f"{classes.get('4xx', 0)} 4xx, {classes.get('2xx', 0)} 2xx ({f['answered_calls_ended']} "
                            f"ended after hang-up), {f['server_errors']} 5xx, {f['no_answer']} unanswered; p50 "
                            f"{f['answer_ms']['p50']} ms, slowest {f['answer_ms']['max']} ms "
                            f"({f['answers_over_pass_ms']} over {PASS_ANSWER_MS} ms); {left_behind} calls left "
                            f"behind, open files {f['open_fds_delta']:+.0f}",
                   passed=passed, figures=f)
