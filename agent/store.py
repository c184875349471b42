"""Calls and turns in SQLite (the embedded default store).

sqlite3 is blocking, so `CallStore` runs every statement on one dedicated thread: the
event loop never waits on disk, and one connection serialises writes without locks.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pipelines.turn_timeline import Turn

# Bump with a new entry in _MIGRATIONS whenever the schema changes; stored in PRAGMA user_version.
SCHEMA_VERSION = 5

_SCHEMA = """
PRAGMA journal_mode = WAL;
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    transport TEXT NOT NULL,
    external_id TEXT,          -- the caller side's id: Twilio callSid/streamSid, WebRTC pc_id
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT
);
CREATE TABLE IF NOT EXISTS turns (
    call_id TEXT NOT NULL REFERENCES calls(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    user_text TEXT NOT NULL,
    reply_text TEXT NOT NULL,
    interrupted INTEGER NOT NULL,
    end_of_speech_at REAL,
    stage_ms TEXT NOT NULL,   -- JSON: stage name -> ms after the caller's end of speech
    ttfs_ms REAL,
    sentence_ttfb_ms TEXT NOT NULL DEFAULT '[]',  -- JSON: per reply sentence, TTS request to first audio
    PRIMARY KEY (call_id, idx)
);
CREATE TABLE IF NOT EXISTS agents (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,        -- JSON: the definition as its author gave it (defaults left out)
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS calls_started ON calls(started_at DESC);
CREATE INDEX IF NOT EXISTS turns_spoken ON turns(end_of_speech_at);
"""

# version reached -> statements that bring a database of the previous version there.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: ("ALTER TABLE calls ADD COLUMN external_id TEXT",),
    # The dashboard reads recent turns across calls by time.
    3: ("CREATE INDEX IF NOT EXISTS turns_spoken ON turns(end_of_speech_at)",),
    # Per-sentence TTS latency: a slow later sentence leaves a hole mid-reply.
    4: ("ALTER TABLE turns ADD COLUMN sentence_ttfb_ms TEXT NOT NULL DEFAULT '[]'",),
    # Agents defined through the HTTP API (YAML agents live in their files).
    5: ("CREATE TABLE IF NOT EXISTS agents (name TEXT PRIMARY KEY, spec TEXT NOT NULL, "
        "created_at REAL NOT NULL, updated_at REAL NOT NULL)",),
}
_POST_MIGRATION = "CREATE INDEX IF NOT EXISTS calls_external ON calls(external_id);"

MAX_LIST_LIMIT = 500
# Turns read for one TTFS summary. A week at the default 4 concurrent calls is ~250k
# turns; past this many the newest are summarised and the answer says it was truncated.
MAX_SUMMARY_TURNS = 50_000


class CallStore:
    def __init__(self, path: str) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._db: sqlite3.Connection | None = None

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        if self._path != ":memory:":
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self._path, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        self._migrate()

    def _migrate(self) -> None:
        assert self._db is not None
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        existed = self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'calls'").fetchone() is not None
        if version > SCHEMA_VERSION:
            raise RuntimeError(f"{self._path} has schema v{version}, newer than this Cadence (v{SCHEMA_VERSION})")
        if not existed:
            self._db.executescript(_SCHEMA)  # a fresh database is created at the current version
        else:
            # Databases from before versioning (user_version 0) had the first schema.
            for target in range(max(version, 1) + 1, SCHEMA_VERSION + 1):
                with self._db:
                    for statement in _MIGRATIONS[target]:
                        self._db.execute(statement)
        self._db.executescript(_POST_MIGRATION)
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    async def close(self) -> None:
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._executor.shutdown(wait=True)

    async def ping(self) -> None:
        """One trivial statement on the store's thread; raises if the database is closed or
        broken. It waits behind whatever that thread is doing: a busy store shows as slow."""
        await self._run(self._ping)

    def _ping(self) -> None:
        if self._db is None:
            raise sqlite3.ProgrammingError("the call store is not open")
        self._db.execute("SELECT 1").fetchone()

    async def _run(self, fn, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def call_started(self, call_id: str, agent: str, transport: str, at: float,
                           external_id: str | None = None) -> None:
        await self._run(self._write,
                        "INSERT INTO calls (id, agent, transport, external_id, started_at) VALUES (?, ?, ?, ?, ?)",
                        (call_id, agent, transport, external_id, at))

    async def call_ended(self, call_id: str, at: float, reason: str) -> None:
        await self._run(self._write, "UPDATE calls SET ended_at = ?, end_reason = ? WHERE id = ?", (at, reason, call_id))

    async def save_turn(self, call_id: str, turn: Turn) -> None:
        row = (call_id, turn.index, turn.user_text, turn.reply_text, int(turn.interrupted), turn.end_of_speech_at,
               json.dumps(turn.stage_ms()), turn.ttfs_ms, json.dumps(turn.sentence_ttfb_ms))
        await self._run(self._write, "INSERT OR REPLACE INTO turns (call_id, idx, user_text, reply_text, interrupted, "
                        "end_of_speech_at, stage_ms, ttfs_ms, sentence_ttfb_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def _write(self, sql: str, params: tuple) -> None:
        assert self._db is not None, "CallStore.open() was not awaited"
        with self._db:
            self._db.execute(sql, params)

    async def save_agent(self, name: str, spec: dict[str, Any], at: float, *, create: bool) -> bool:
        """Creates (create=True) or replaces an agent; False if that would clash (it exists, or it does not)."""
        return await self._run(self._save_agent, name, json.dumps(spec), at, create)

    def _save_agent(self, name: str, spec: str, at: float, create: bool) -> bool:
        assert self._db is not None
        with self._db:
            if create:
                cursor = self._db.execute("INSERT OR IGNORE INTO agents (name, spec, created_at, updated_at) "
                                          "VALUES (?, ?, ?, ?)", (name, spec, at, at))
            else:
                cursor = self._db.execute("UPDATE agents SET spec = ?, updated_at = ? WHERE name = ?", (spec, at, name))
            return cursor.rowcount == 1

    async def delete_agent(self, name: str) -> bool:
        return await self._run(self._delete_agent, name)

    def _delete_agent(self, name: str) -> bool:
        assert self._db is not None
        with self._db:
            return self._db.execute("DELETE FROM agents WHERE name = ?", (name,)).rowcount == 1

    async def list_agents(self) -> list[dict[str, Any]]:
        """Every API-defined agent: name, spec (dict), created_at, updated_at; by name."""
        return await self._run(self._list_agents)

    def _list_agents(self) -> list[dict[str, Any]]:
        assert self._db is not None
        rows = self._db.execute("SELECT * FROM agents ORDER BY name").fetchall()
        return [{**dict(r), "spec": json.loads(r["spec"])} for r in rows]

    async def list_calls(self, limit: int = 50, offset: int = 0, external_id: str | None = None) -> list[dict[str, Any]]:
        limit = max(1, min(limit, MAX_LIST_LIMIT))
        return await self._run(self._list_calls, limit, max(0, offset), external_id)

    def _list_calls(self, limit: int, offset: int, external_id: str | None) -> list[dict[str, Any]]:
        assert self._db is not None
        where, params = ("WHERE c.external_id = ?", (external_id,)) if external_id else ("", ())
        rows = self._db.execute(
            f"SELECT c.*, COUNT(t.idx) AS turns FROM calls c LEFT JOIN turns t ON t.call_id = c.id {where} "
            "GROUP BY c.id ORDER BY c.started_at DESC LIMIT ? OFFSET ?",
            (*params, limit, offset),
        ).fetchall()
        return [dict(r) for r in rows]

    async def get_call(self, call_id: str) -> dict[str, Any] | None:
        return await self._run(self._get_call, call_id)

    def _get_call(self, call_id: str) -> dict[str, Any] | None:
        assert self._db is not None
        call = self._db.execute("SELECT * FROM calls WHERE id = ?", (call_id,)).fetchone()
        if call is None:
            return None
        turns = self._db.execute("SELECT * FROM turns WHERE call_id = ? ORDER BY idx", (call_id,)).fetchall()
        return {**dict(call), "turns": [turn_row_to_dict(t) for t in turns]}

    async def recent_turns(self, *, limit: int, since: float | None = None, agent: str | None = None,
                           transport: str | None = None) -> list[dict[str, Any]]:
        """Turns across calls, newest first, with their call's agent and transport (`turn_summary` shape)."""
        limit = max(1, min(limit, MAX_LIST_LIMIT))
        return await self._run(self._recent_turns, limit, since, agent, transport)

    def _recent_turns(self, limit: int, since: float | None, agent: str | None,
                      transport: str | None) -> list[dict[str, Any]]:
        assert self._db is not None
        where, params = _turn_filter(since, agent, transport)
        rows = self._db.execute(
            "SELECT t.call_id, c.agent, c.transport, t.idx, t.end_of_speech_at, t.interrupted, t.stage_ms, t.ttfs_ms "
            f"FROM turns t JOIN calls c ON c.id = t.call_id WHERE {where} "
            "ORDER BY t.end_of_speech_at DESC, t.idx DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [{"call_id": r["call_id"], "agent": r["agent"], "transport": r["transport"], "index": r["idx"],
                 "end_of_speech_at": r["end_of_speech_at"], "interrupted": bool(r["interrupted"]),
                 "stage_ms": json.loads(r["stage_ms"]), "ttfs_ms": r["ttfs_ms"]} for r in rows]

    async def ttfs_samples(self, *, since: float, limit: int = MAX_SUMMARY_TURNS) -> list[tuple[float, float, str, str]]:
        """(end_of_speech_at, ttfs_ms, agent, transport) of turns since `since` that reached the
        caller, newest first, at most `limit` (MAX_SUMMARY_TURNS)."""
        return await self._run(self._ttfs_samples, since, max(1, min(limit, MAX_SUMMARY_TURNS)))

    def _ttfs_samples(self, since: float, limit: int) -> list[tuple[float, float, str, str]]:
        assert self._db is not None
        rows = self._db.execute(
            "SELECT t.end_of_speech_at, t.ttfs_ms, c.agent, c.transport FROM turns t JOIN calls c ON c.id = t.call_id "
            "WHERE t.end_of_speech_at >= ? AND t.ttfs_ms IS NOT NULL ORDER BY t.end_of_speech_at DESC LIMIT ?",
            (since, limit),
        ).fetchall()
        return [tuple(r) for r in rows]


def _turn_filter(since: float | None, agent: str | None, transport: str | None) -> tuple[str, tuple]:
    """A WHERE clause over turns t joined with calls c. `since` is exclusive: a client that
    polls with the newest time it holds must not get that turn again."""
    clauses, params = ["t.end_of_speech_at IS NOT NULL"], []
    if since is not None:
        clauses.append("t.end_of_speech_at > ?")
        params.append(since)
    if agent is not None:
        clauses.append("c.agent = ?")
        params.append(agent)
    if transport is not None:
        clauses.append("c.transport = ?")
        params.append(transport)
    return " AND ".join(clauses), tuple(params)


def turn_summary(call_id: str, agent: str, transport: str, turn: Turn) -> dict[str, Any]:
    """A turn's timing with its call's agent and transport, as the dashboard shows it (no transcript)."""
    return {"call_id": call_id, "agent": agent, "transport": transport, "index": turn.index,
            "end_of_speech_at": turn.end_of_speech_at, "interrupted": turn.interrupted,
            "stage_ms": turn.stage_ms(), "ttfs_ms": turn.ttfs_ms}


def turn_row_to_dict(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "index": row["idx"],
        "user_text": row["user_text"],
        "reply_text": row["reply_text"],
        "interrupted": bool(row["interrupted"]),
        "end_of_speech_at": row["end_of_speech_at"],
        "stage_ms": json.loads(row["stage_ms"]),
        "ttfs_ms": row["ttfs_ms"],
        "sentence_ttfb_ms": json.loads(row["sentence_ttfb_ms"]),
    }


def turn_to_dict(turn: Turn) -> dict[str, Any]:
    """The same shape as a stored turn, for turns still in progress."""
    return {
        "index": turn.index,
        "user_text": turn.user_text,
        "reply_text": turn.reply_text,
        "interrupted": turn.interrupted,
        "end_of_speech_at": turn.end_of_speech_at,
        "stage_ms": turn.stage_ms(),
        "ttfs_ms": turn.ttfs_ms,
        "sentence_ttfb_ms": list(turn.sentence_ttfb_ms),
    }
