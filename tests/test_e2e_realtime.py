"""A spoken conversation over /v1/realtime with the real models, driven by the official
`openai` SDK pointed at our server: server VAD commits each spoken question, reply audio and
its transcript come back, a barge-in cancels a reply, a response.cancel another, and a
conversation.item.truncate cuts a reply, in the model's context and in the stored call, to
what the caller heard."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.call_checks import assert_answered_capital_question, wait_until_ended
from tests.realtime_client import audio_ms, realtime_session, utterance

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def server(server_config, embedded_engines, tmp_path):
    """The default agent, allowed replies of several sentences: the barge-in below lands after
    a reply's first sentence has played and before its last (the shipped agent says one)."""
    from dataclasses import replace

    import yaml

    from tests.conftest import REPO_ROOT, running_server

    agent = yaml.safe_load((REPO_ROOT / "configs" / "agents" / "default.yaml").read_text())
    agent["llm"]["max_reply_sentences"] = 4
    (tmp_path / "agents").mkdir()
    (tmp_path / "knowledge").symlink_to(REPO_ROOT / "configs" / "knowledge" / "default")
    agent["knowledge_files"] = ["../knowledge/*.md"]  # relative to the agent's file, as shipped
    (tmp_path / "agents" / "default.yaml").write_text(yaml.safe_dump(agent))
    config = replace(server_config, agents=replace(server_config.agents, dir=str(tmp_path / "agents")))
    with running_server(config, embedded_engines) as running:
        yield running


async def test_a_spoken_conversation_with_barge_in_cancel_and_truncate(server):
    async with realtime_session(server.base_url) as rt:
        await rt.connection.session.update(session={"type": "realtime", "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": {"type": "server_vad"}}}})
        await rt.next("session.updated")

        # Turn 1: a question, answered in full.
        await rt.send_pcm(utterance("Hello. What is the capital of France?"))
        first = await rt.next("response.done", timeout_s=60)
        turn_one = rt.events[: rt.index_of(first) + 1]
        kinds = [e.type for e in turn_one]
        assert kinds.index("input_audio_buffer.speech_started") < kinds.index("input_audio_buffer.speech_stopped") \
            < kinds.index("input_audio_buffer.committed") < kinds.index("response.output_audio.delta")
        heard_question = (await rt.next("conversation.item.input_audio_transcription.completed")).transcript
        assert {"capital", "france"} & set(heard_question.lower().replace("?", " ").split()), heard_question
        assert first.response.status == "completed"
        spoken = "".join(e.delta for e in rt.of_type("response.output_audio_transcript.delta"))
        assert spoken and audio_ms(rt.of_type("response.output_audio.delta")) > 500

        # Turn 2: the caller speaks over the reply; it is cut off, and the item truncated to what played.
        mark = len(rt.events)
        await rt.send_pcm(utterance("Tell me about the weather in Paris in spring, please."))
        # A sentence's words come once its audio has gone out: barge in after the first one.
        second_words = await rt.next("response.output_audio_transcript.delta", after=mark, timeout_s=60)
        barge_in = asyncio.create_task(rt.send_pcm(utterance("Wait, actually, stop.")))
        cancelled = await rt.next("response.done", after=rt.index_of(second_words), timeout_s=30)
        assert cancelled.response.status == "cancelled"
        assert rt.of_type("input_audio_buffer.speech_started", after=rt.index_of(second_words))
        item_id = second_words.item_id
        # Cut just before the reply's last words: their audio position is where they arrived among
        # the audio deltas (server events come in the order the caller hears them).
        position, last_words_at = 0.0, 0.0
        for event in rt.events[mark:rt.index_of(cancelled)]:
            if getattr(event, "item_id", None) != item_id:
                continue
            if event.type == "response.output_audio.delta":
                position += audio_ms([event])
            elif event.type == "response.output_audio_transcript.delta":
                last_words_at = position
        cut_at = max(0, int(last_words_at) - 1)
        await rt.connection.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=cut_at)
        truncated = await rt.next("conversation.item.truncated", after=mark)
        assert truncated.item_id == item_id and truncated.audio_end_ms == cut_at
        await rt.connection.conversation.item.retrieve(item_id=item_id)
        heard = (await rt.next("conversation.item.retrieved", after=mark)).item.content[0].transcript
        said = "".join(e.delta for e in rt.of_type("response.output_audio_transcript.delta", after=mark)
                       if e.item_id == item_id)
        assert said.startswith(heard) and len(heard) < len(said)
        await barge_in

        # Turn 3 (the barge-in's reply): cancelled by the client as soon as it starts.
        third = await rt.next("response.created", after=rt.index_of(cancelled) + 1, timeout_s=60)
        await rt.connection.response.cancel()
        stopped = await rt.next("response.done", after=rt.index_of(third), timeout_s=30)
        assert stopped.response.status == "cancelled"
        assert stopped.response.status_details.reason == "client_cancelled"

        # The model's context holds the truncated reply as heard, not as generated.
        live = next(c for c in server.app.state.manager._active.values() if c.transport == "realtime")
        replies = [m["content"] for m in live.voice.context.get_messages() if m["role"] == "assistant"]
        assert said.strip() not in [r.strip() for r in replies]
        if heard.strip():
            assert heard.strip() in [r.strip() for r in replies]

    async with httpx.AsyncClient(base_url=server.base_url) as http:
        calls = (await http.get("/api/calls")).json()["calls"]
        assert calls[0]["transport"] == "realtime"
        call = await wait_until_ended(http, calls[0]["id"])
    assert_answered_capital_question(call)
    stored = [t["reply_text"] for t in call["turns"]]
    assert " ".join(heard.split()) in [" ".join(r.split()) for r in stored]
    assert " ".join(said.split()) not in [" ".join(r.split()) for r in stored]
