import pytest

from pipelines.turn_timeline import KEPT_TURNS, STAGES, TurnTimeline


def run_reply(timeline: TurnTimeline, t0: float) -> None:
    timeline.transcript("what time is it", t0 + 0.5)
    timeline.stage("llm_first_token", t0 + 0.6)
    timeline.stage("first_sentence", t0 + 0.7)
    timeline.stage("tts_first_audio", t0 + 0.8)
    timeline.bot_started_speaking(t0 + 0.81)


def test_a_turn_records_each_stage_once_relative_to_end_of_speech():
    closed = []
    timeline = TurnTimeline(on_closed=closed.append)
    timeline.user_stopped_speaking(100.0)
    run_reply(timeline, 100.0)
    timeline.stage("tts_first_audio", 105.0)  # later audio chunks do not move the first
    timeline.spoken_text("It is")
    timeline.spoken_text("noon.")
    timeline.reply_generated()
    assert timeline.bot_stopped_speaking(103.0) is closed[0]
    turn = closed[0]
    assert turn.stage_ms() == {"asr_final": 500.0, "llm_first_token": 600.0, "first_sentence": 700.0,
                               "tts_first_audio": 800.0, "first_audio_sent": 810.0}
    assert turn.ttfs_ms == 810.0
    assert (turn.user_text, turn.reply_text, turn.interrupted) == ("what time is it", "It is noon.", False)


def test_a_long_turns_parts_go_to_the_turn_they_belong_to_in_order_and_move_no_stage():
    timeline = TurnTimeline()
    timeline.user_stopped_speaking(100.0)
    run_reply(timeline, 100.0)  # an answered turn is open while the next one is spoken
    timeline.transcript_part("first part")  # cut from the next turn while the caller talks on
    timeline.transcript_part("second part")
    assert timeline.current.user_text == "what time is it"  # not the answered turn's
    turn = timeline.user_stopped_speaking(200.0)
    timeline.transcript_part("third part")  # the last cut's transcript, after the turn ended
    assert turn.stage_at == {}  # parts move no stage: the reply waits for the turn's transcript
    timeline.transcript("and the end", 200.4)
    assert turn.user_text == "first part second part third part and the end"
    assert turn.stage_ms() == {"asr_final": 400.0}


def test_a_pause_before_any_reply_keeps_one_turn_and_moves_end_of_speech():
    timeline = TurnTimeline()
    timeline.user_stopped_speaking(10.0)
    timeline.user_stopped_speaking(12.0)  # the caller went on after a pause
    assert len(timeline.turns) == 1 and timeline.current.end_of_speech_at == 12.0


def test_audio_gap_mid_reply_does_not_end_the_turn_until_the_reply_is_generated():
    closed = []
    timeline = TurnTimeline(on_closed=closed.append)
    timeline.user_stopped_speaking(0.0)
    run_reply(timeline, 0.0)
    assert timeline.bot_stopped_speaking(2.0) is None  # second sentence still being synthesised
    timeline.bot_started_speaking(2.2)
    timeline.reply_generated()
    timeline.bot_stopped_speaking(4.0)
    assert len(closed) == 1 and closed[0].completed_at == 4.0


def test_barge_in_closes_the_turn_as_interrupted_with_what_was_said():
    closed = []
    timeline = TurnTimeline(on_closed=closed.append)
    timeline.user_stopped_speaking(0.0)
    run_reply(timeline, 0.0)
    timeline.spoken_text("It is")
    assert timeline.interrupted(1.5) is closed[0]
    assert closed[0].interrupted and closed[0].reply_text == "It is"
    assert timeline.interrupted(1.6) is None  # nothing open any more


def test_interruption_while_nobody_speaks_closes_nothing():
    timeline = TurnTimeline()
    timeline.user_stopped_speaking(0.0)
    assert timeline.interrupted(0.1) is None
    assert timeline.current is not None


def test_stages_before_a_transcript_are_ignored():
    timeline = TurnTimeline()
    timeline.user_stopped_speaking(0.0)
    timeline.stage("llm_first_token", 0.2)  # e.g. a greeting, not an answer to this turn
    assert timeline.current.stage_at == {}


def test_finish_closes_an_open_turn_once():
    closed = []
    timeline = TurnTimeline(on_closed=closed.append)
    timeline.user_stopped_speaking(0.0)
    run_reply(timeline, 0.0)
    timeline.finish(3.0)
    timeline.finish(4.0)
    assert len(closed) == 1 and closed[0].interrupted  # hung up while the agent spoke


def test_new_utterance_after_a_reply_started_opens_a_new_turn():
    closed = []
    timeline = TurnTimeline(on_closed=closed.append)
    timeline.user_stopped_speaking(0.0)
    run_reply(timeline, 0.0)
    timeline.user_stopped_speaking(5.0)
    assert len(timeline.turns) == 2 and len(closed) == 1


def test_unknown_stage_is_an_error():
    with pytest.raises(ValueError):
        TurnTimeline().stage("made_up", 0.0)
    assert STAGES[-1] == "first_audio_sent"


def test_an_eager_reply_gives_its_early_stages_to_the_turn_it_answers():
    timeline = TurnTimeline()
    timeline.stage_ahead("retrieval", 10.3)  # at the pause, before the turn ended
    timeline.user_stopped_speaking(10.0)
    timeline.transcript("Where is my package?", 10.4)
    assert timeline.current.stage_ms() == {"asr_final": 400.0, "retrieval": 300.0}


def test_an_eager_stage_reached_after_the_turn_ended_is_still_its_turns():
    timeline = TurnTimeline()
    timeline.user_stopped_speaking(10.0)
    timeline.transcript("Where is my package?", 10.2)
    timeline.stage_ahead("retrieval", 10.5)
    assert timeline.current.stage_ms()["retrieval"] == 500.0


def test_a_dropped_eager_reply_takes_its_stages_back():
    timeline = TurnTimeline()
    timeline.stage_ahead("retrieval", 10.3)
    timeline.eager_reply_dropped()  # the caller went on
    timeline.user_stopped_speaking(11.0)
    timeline.transcript("Where is my package from Monday?", 11.4)
    assert "retrieval" not in timeline.current.stage_at
    timeline.stage_ahead("retrieval", 11.3)  # a second guess, then other final words: dropped too
    timeline.eager_reply_dropped()
    assert "retrieval" not in timeline.current.stage_at
    timeline.stage("retrieval", 11.6)  # the turn answered afresh
    assert timeline.current.stage_ms()["retrieval"] == 600.0


def test_a_turn_whose_words_were_lost_is_its_own_turn_closed_by_its_spoken_apology():
    """Before: with no transcript the turn never ended, and the next utterance joined it."""
    closed = []
    timeline = TurnTimeline(on_closed=closed.append)
    timeline.user_stopped_speaking(100.0)
    timeline.transcript_lost(100.2)
    timeline.bot_started_speaking(100.5)
    timeline.spoken_text("Sorry, I didn't catch that.")
    assert timeline.bot_stopped_speaking(102.0) is closed[0]  # no LLM reply to wait for
    assert (closed[0].user_text, closed[0].ttfs_ms) == ("", 500.0)
    assert timeline.user_stopped_speaking(110.0) is not closed[0] and len(timeline.turns) == 2


def test_a_long_call_keeps_only_its_recent_turns_and_still_numbers_and_closes_every_one():
    """Before: every turn of a call stayed in memory until it ended (the soak's growth)."""
    closed = []
    timeline = TurnTimeline(on_closed=closed.append)
    for n in range(1000):
        timeline.user_stopped_speaking(n * 10.0)
        run_reply(timeline, n * 10.0)
        timeline.reply_generated()
        timeline.bot_stopped_speaking(n * 10.0 + 3.0)
    assert [t.index for t in closed] == list(range(1000))  # each closed turn went to the store
    assert timeline.turn_count == 1000
    assert len(timeline.turns) == KEPT_TURNS and list(timeline.turns) == closed[-KEPT_TURNS:]
    timeline.user_stopped_speaking(10_000.0)  # the open turn is always kept, as the newest
    assert timeline.turns[-1] is timeline.current and timeline.current.index == 1000
    assert len(timeline.turns) == KEPT_TURNS
