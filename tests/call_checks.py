"""Checks shared by the end-to-end call tests: what the server must have stored for a call."""

from __future__ import annotations

import asyncio

import httpx

from pipelines.turn_timeline import STAGES


async def wait_until_ended(http: httpx.AsyncClient, call_id: str, timeout_s: float = 15.0) -> dict:
    for _ in range(int(timeout_s / 0.1)):
        call = (await http.get(f"/api/calls/{call_id}")).json()
        if not call["live"] and call.get("ended_at"):
            return call
        await asyncio.sleep(0.1)
    raise AssertionError(f"call {call_id} did not end")


def assert_answered_capital_question(call: dict) -> None:
    """The first turn asked for the capital of France and got a timed, spoken answer."""
    assert call["end_reason"] == "caller_hung_up"
    stored = call["turns"][0]
    assert stored["ttfs_ms"] is not None and 0 < stored["ttfs_ms"] < 10_000
    assert set(stored["stage_ms"]) == set(STAGES), stored["stage_ms"]
    in_order = [stored["stage_ms"][s] for s in ("asr_final", "llm_first_token", "first_sentence", "first_audio_sent")]
    assert in_order == sorted(in_order), f"stages out of order: {stored['stage_ms']}"
    assert "capital" in stored["user_text"].lower() or "france" in stored["user_text"].lower()
    assert stored["reply_text"]
