import sqlite3

from agent.store import SCHEMA_VERSION, CallStore
from pipelines.turn_timeline import Turn


async def test_calls_and_turns_round_trip_through_sqlite(tmp_path):
    store = CallStore(str(tmp_path / "db" / "calls.sqlite3"))
    await store.open()
    await store.call_started("c1", "default", "twilio", 100.0, external_id="CA1")
    turn = Turn(index=0, end_of_speech_at=100.5, stage_at={"asr_final": 101.0, "first_audio_sent": 101.4},
                user_text="hi", reply_text="hello there", interrupted=True, sentence_ttfb_ms=[180.5, 240.0])
    await store.save_turn("c1", turn)
    await store.call_ended("c1", 110.0, "caller_hung_up")
    await store.close()

    reopened = CallStore(str(tmp_path / "db" / "calls.sqlite3"))
    await reopened.open()
    call = await reopened.get_call("c1")
    assert call["end_reason"] == "caller_hung_up" and call["external_id"] == "CA1"
    assert call["turns"] == [{"index": 0, "user_text": "hi", "reply_text": "hello there", "interrupted": True,
                              "end_of_speech_at": 100.5, "stage_ms": {"asr_final": 500.0, "first_audio_sent": 900.0},
                              "ttfs_ms": 900.0, "sentence_ttfb_ms": [180.5, 240.0]}]
    assert [c["id"] for c in await reopened.list_calls(external_id="CA1")] == ["c1"]
    assert await reopened.list_calls(external_id="other") == []
    assert await reopened.get_call("missing") is None
    await reopened.close()


async def test_a_database_from_before_schema_versioning_is_migrated(tmp_path):
    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE calls (id TEXT PRIMARY KEY, agent TEXT NOT NULL, transport TEXT NOT NULL,
                            started_at REAL NOT NULL, ended_at REAL, end_reason TEXT);
        CREATE TABLE turns (call_id TEXT NOT NULL, idx INTEGER NOT NULL, user_text TEXT NOT NULL,
                            reply_text TEXT NOT NULL, interrupted INTEGER NOT NULL, end_of_speech_at REAL,
                            stage_ms TEXT NOT NULL, ttfs_ms REAL, PRIMARY KEY (call_id, idx));
        INSERT INTO calls VALUES ('old', 'default', 'twilio', 1.0, 2.0, 'completed');
        INSERT INTO turns VALUES ('old', 0, 'hi', 'hello', 0, 1.5, '{}', NULL);
    """)
    old.close()
    store = CallStore(str(path))
    await store.open()
    old_call = await store.get_call("old")
    assert old_call["external_id"] is None
    assert old_call["turns"][0]["sentence_ttfb_ms"] == []  # turns from before v4 had no sentence timings
    await store.call_started("new", "default", "webrtc", 3.0, external_id="pc")
    assert [c["id"] for c in await store.list_calls()] == ["new", "old"]
    await store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
