"""Chaos scenarios: admission under pressure, against a running server.

`handshake`: sockets that open /ws/twilio and never send `start` (a scanner, or an attacker
holding slots) while a real caller calls. Slots count calls, not sockets, so the caller is
admitted, and the server closes each silent socket at limits.handshake_timeout_seconds.

`burst`: the server's call cap plus `extra` callers, all at once. Exactly the cap is admitted;
the rest are refused at once (close 1013) rather than queued or left hanging.

Each `run_*` returns the measured figures; `judge_handshake` and `judge_admission` judge them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import websockets

from latency_bench.chaos.verdict import Verdict

# How long an admitted call is held open while the others are judged.
ADMITTED_WAIT_S = 1.0


def start_event(n: int) -> str:
    return json.dumps({"event": "start", "start": {"streamSid": f"MZchaos{n}", "callSid": f"CAchaos{n}",
                                                   "customParameters": {}}})


# A WebSocket the server refuses as full is tried again this often, this long apart: the slot of a
# call that just closed is free only once that call has ended.
REFUSED_RETRIES, REFUSED_RETRY_S = 50, 0.2


async def connect_admitted(base_url: str, path: str, *, open_timeout_s: float = 10.0):
    """A WebSocket on `path` the server has admitted (/v1/realtime answers 503 while full)."""
    for _ in range(REFUSED_RETRIES):
        try:
            return await websockets.connect(f"{ws_url(base_url)}{path}", open_timeout=open_timeout_s, max_size=2**22)
        except websockets.InvalidStatus as exc:
            if exc.response.status_code != 503:
                raise
        await asyncio.sleep(REFUSED_RETRY_S)
    raise RuntimeError(f"{path}: still refused after {REFUSED_RETRIES} tries")


def ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)


async def calls_active(base_url: str) -> int:
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as http:
        return (await http.get("/api/drain")).json()["calls_active"]


async def phone_caller(base_url: str, n: int):
    """A phone socket that has sent `connected` and `start`, or was closed (refused) first."""
    ws = await websockets.connect(f"{ws_url(base_url)}/ws/twilio", open_timeout=5)
    with contextlib.suppress(websockets.ConnectionClosed):  # a full server closes at once
        await ws.send(json.dumps({"event": "connected"}))
        await ws.send(start_event(n))
    return ws


async def hang_up(ws) -> None:
    with contextlib.suppress(websockets.ConnectionClosed):
        await ws.send(json.dumps({"event": "stop"}))
    await ws.close()


async def _closed_after(ws, opened_at: float, wait_s: float) -> tuple[float | None, int | None]:
    """(seconds until the server closed it, close code); (None, None) if still open after wait_s."""
    try:
        async with asyncio.timeout_at(opened_at + wait_s):
            async for _ in ws:
                pass
    except TimeoutError:
        await ws.close()
        return None, None
    except websockets.ConnectionClosed:
        pass
    return asyncio.get_running_loop().time() - opened_at, ws.close_code


async def run_handshake(base_url: str, *, silent: int, timeout_s: float, slack_s: float = 2.0) -> dict:
    loop = asyncio.get_running_loop()
    sockets = []
    for _ in range(silent):
        sockets.append((await websockets.connect(f"{ws_url(base_url)}/ws/twilio", open_timeout=5), loop.time()))
    watchers = [asyncio.create_task(_closed_after(ws, opened, timeout_s + slack_s)) for ws, opened in sockets]
    real = await phone_caller(base_url, 0)
    admitted = False
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            while await calls_active(base_url) < 1:
                await asyncio.sleep(0.02)
            admitted = True
    closes = await asyncio.gather(*watchers)
    real_still_open = real.close_code is None
    await hang_up(real)
    seconds = [s for s, _ in closes if s is not None]
    return {"silent_sockets": silent, "handshake_timeout_s": timeout_s,
            "closed": len(seconds), "still_open": sum(1 for s, _ in closes if s is None),
            "close_codes": sorted({code for _, code in closes if code is not None}),
            "max_close_s": round(max(seconds), 3) if seconds else None,
            "real_caller_admitted": admitted, "real_caller_kept": real_still_open}


async def run_burst(base_url: str, *, cap: int, extra: int) -> dict:
    async def one(n: int) -> tuple[str, float | None, int | None, object]:
        ws = await phone_caller(base_url, n)
        sent = time.monotonic()
        try:
            async with asyncio.timeout(ADMITTED_WAIT_S):  # refused ones are closed long before this
                async for _ in ws:  # an admitted call may be sent audio (a greeting): read on
                    pass
        except TimeoutError:
            return "admitted", None, None, ws
        except websockets.ConnectionClosed:
            pass
        return "refused", time.monotonic() - sent, ws.close_code, ws

    outcomes = await asyncio.gather(*(one(n) for n in range(cap + extra)), return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    done = [o for o in outcomes if not isinstance(o, BaseException)]
    admitted = [ws for kind, _, _, ws in done if kind == "admitted"]
    refused = [(s, code) for kind, s, code, _ in done if kind == "refused"]
    active = await calls_active(base_url)
    await asyncio.gather(*(hang_up(ws) for ws in admitted))
    refusal_ms = sorted(s * 1000 for s, _ in refused)
    return {"cap": cap, "callers": cap + extra, "admitted": len(admitted), "refused": len(refused),
            "failed_to_connect": len(failed), "calls_active_at_peak": active,
            "refusal_codes": sorted({code for _, code in refused if code is not None}),
            "max_refusal_ms": round(refusal_ms[-1], 1) if refusal_ms else None,
            "p50_refusal_ms": round(refusal_ms[len(refusal_ms) // 2], 1) if refusal_ms else None}


def judge_handshake(f: dict) -> Verdict:
    passed = f["still_open"] == 0 and f["close_codes"] == [1008] and (f["max_close_s"] or 99) <= 10 \
        and f["real_caller_admitted"] and f["real_caller_kept"]
    return Verdict("handshake", f"{f['silent_sockets']} start-less sockets closed (1008) within 10 s; "
                                "a real caller admitted meanwhile",
                   f"{f['closed']} closed ({f['close_codes']}), slowest {f['max_close_s']} s; real caller "
                   f"{'admitted' if f['real_caller_admitted'] else 'NOT admitted'}", passed, f)


def judge_admission(f: dict) -> Verdict:
    passed = f["admitted"] == f["cap"] and f["refused"] == f["callers"] - f["cap"] and f["refusal_codes"] == [1013] \
        and (f["max_refusal_ms"] or 1e9) <= 200
    return Verdict("admission", f"cap {f['cap']} + {f['callers'] - f['cap']} at once: exactly {f['cap']} admitted, "
                                "the rest refused (1013) within 200 ms",
                   f"{f['admitted']} admitted, {f['refused']} refused ({f['refusal_codes']}), slowest refusal "
                   f"{f['max_refusal_ms']} ms", passed, f)
