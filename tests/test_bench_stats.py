"""Bench summaries, the capacity search, caller plans and plots, on made-up turns."""

from pathlib import Path

import pytest
import yaml

from agent.agent_registry import limits_of
from agent.agents import parse_spec
from agent.config import load_config
from latency_bench import report
from latency_bench.callers.conversation import plan_caller
from latency_bench.callers.listen import is_audible
from latency_bench.callers.speech import MAX_UTTERANCE_S, MIN_UTTERANCE_S, QUESTIONS, available_voices, synthesize
from latency_bench.load.capacity import SLO, find_capacity, verdict
from latency_bench.load.runner import ramp_levels
from latency_bench.stats import join_server_turns, median_turn, percentile, summarize
from pipelines.llm import CUT_SHORT_REPLY, FALLBACK_REPLY
from pipelines.stt import NOT_HEARD_REPLY


def caller_turn(ttfs, *, end_at=100.0, error=None, underruns=0, barge_stop=None):
    return {"caller": 0, "turn": 0, "transport": "twilio", "voice": "v", "text": "q", "utterance_seconds": 2.0,
            "speech_end_at": end_at, "error": error, "ttfs_ms": ttfs, "ttfb_ms": None if ttfs is None else ttfs - 5,
            "reply_seconds": 2.0, "underruns": underruns, "underrun_seconds": 0.0, "barge_in_stop_ms": barge_stop,
            "barged_in": barge_stop is not None, "late_reply_seconds": 0.0, "server": None}


def server_turn(index, end_at, ttfs=900.0):
    return {"index": index, "user_text": "q", "reply_text": "a", "interrupted": False, "end_of_speech_at": end_at,
            "stage_ms": {"asr_final": 300.0, "llm_first_token": 500.0, "first_sentence": 600.0,
                         "tts_first_audio": 880.0, "first_audio_sent": 890.0}, "ttfs_ms": ttfs}


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 99) == 10
    assert percentile([], 50) is None
    assert percentile([5, None, 1], 100) == 5


def test_summary_counts_errors_and_underruns_and_ignores_unanswered_turns_in_ttfs():
    turns = [caller_turn(1000), caller_turn(2000, underruns=2), caller_turn(None, error="no reply within 20 s")]
    s = summarize(turns)
    assert s["turns"] == 3 and s["errors"] == 1 and s["error_kinds"] == {"no reply within 20 s": 1}
    assert s["turns_with_underruns"] == 1
    assert s["caller"]["ttfs_ms"]["n"] == 2 and s["caller"]["ttfs_ms"]["p50"] == 1500


@pytest.mark.parametrize("reply, apology", [
    (FALLBACK_REPLY, True), ("The clinic opens at" + CUT_SHORT_REPLY, True), (NOT_HEARD_REPLY, True),
    ("We open at nine on Saturdays.", False), ("Sorry, we are closed on Sundays.", False),
])
def test_a_turn_the_server_answered_with_its_apology_is_counted_as_one(reply, apology):
    turn = caller_turn(1000)
    turn["server"] = {**server_turn(0, 100.0), "reply_text": reply}
    assert summarize([turn, caller_turn(900)])["apologies"] == int(apology)


def test_server_turns_join_by_end_of_speech_time_not_by_order():
    turns = [caller_turn(1000, end_at=100.0), caller_turn(1000, end_at=110.0), caller_turn(1000, end_at=130.0)]
    # The server missed the second turn: its indexes no longer line up with the caller's.
    join_server_turns(turns, [server_turn(0, 100.05), server_turn(1, 129.9)])
    assert turns[0]["server"]["index"] == 0
    assert turns[1]["server"] is None
    assert turns[2]["server"]["index"] == 1


def test_median_turn_is_the_middle_one_with_server_stages():
    turns = [caller_turn(t, end_at=float(i)) for i, t in enumerate((900, 1500, 1100))]
    join_server_turns(turns, [server_turn(i, float(i)) for i in range(3)])
    assert median_turn(turns)["ttfs_ms"] == 1100


def test_verdict_names_each_reason_a_level_is_not_sustained():
    ok = summarize([caller_turn(1000)] * 5)
    assert verdict(ok, SLO(ttfs_p95_ms=1500)) == []
    slow = summarize([caller_turn(1000)] * 4 + [caller_turn(3000, underruns=1, error=None)])
    reasons = verdict(slow, SLO(ttfs_p95_ms=1500))
    assert any("p95" in r for r in reasons) and any("underrun" in r for r in reasons)


async def test_capacity_is_the_last_level_within_the_slo():
    async def level(callers):
        ttfs = 800 + 250 * callers  # 1 -> 1050, 2 -> 1300, 3 -> 1550 ms
        return {"callers": callers, "summary": summarize([caller_turn(ttfs)] * 4)}

    found = await find_capacity(level, SLO(ttfs_p95_ms=1500), max_callers=8)
    assert found["sustained_callers"] == 2
    assert found["stopped_by"]["callers"] == 3
    assert [lv["sustained"] for lv in found["levels"]] == [True, True, False]


async def test_capacity_reports_reaching_the_maximum():
    async def level(callers):
        return {"callers": callers, "summary": summarize([caller_turn(500)] * 2)}

    found = await find_capacity(level, SLO(), start=2, step=2, max_callers=6)
    assert found["sustained_callers"] == 6 and found["reached_max"]


def test_ramp_levels_double_up_to_the_maximum():
    assert ramp_levels(1) == [1]
    assert ramp_levels(8) == [1, 2, 4, 8]
    assert ramp_levels(6) == [1, 2, 4, 6]


def test_caller_plans_are_reproducible_and_barge_in_where_asked():
    a = plan_caller(1, 6, seed=3, barge_in_every=3)
    b = plan_caller(1, 6, seed=3, barge_in_every=3)
    assert [(p.utterance.text, p.pause_before_s) for p in a] == [(p.utterance.text, p.pause_before_s) for p in b]
    assert [p.barge_in_after_s is not None for p in a] == [False, False, False, True, False, False]
    assert all(0.5 <= p.pause_before_s <= 2.0 for p in a[1:])
    other = plan_caller(2, 6, seed=3)
    assert a[0].utterance.voice != other[0].utterance.voice  # callers sound different


@pytest.mark.slow
def test_every_voice_says_every_question_in_two_to_six_seconds():
    voices = available_voices()
    assert {v.engine for v in voices} >= {"espeak-ng", "flite"}, "make deps installs espeak-ng and flite"
    for voice in voices:
        for question in QUESTIONS:
            u = synthesize(question, voice)
            assert MIN_UTTERANCE_S <= u.seconds <= MAX_UTTERANCE_S, (voice, question, u.seconds)
            edge = u.rate // 100  # silent edges trimmed: the first and last 10 ms are speech
            assert is_audible(u.samples[:edge], u.rate) and is_audible(u.samples[-edge:], u.rate)


def test_report_writes_results_and_three_plots(tmp_path):
    turns = [caller_turn(t, end_at=float(i)) for i, t in enumerate((900, 1500, 1100, 1000))]
    join_server_turns(turns, [server_turn(i, float(i)) for i in range(4)])
    levels = [{"callers": 1, "summary": summarize(turns[:2]), "turns": turns[:2]},
              {"callers": 2, "summary": summarize(turns[2:]), "turns": turns[2:]}]
    written = report.write(tmp_path, {"levels": levels, "summary": summarize(turns)})
    assert sorted(p.name for p in written) == ["median_turn_waterfall.png", "results.json",
                                                "ttfs_distribution.png", "ttfs_vs_callers.png"]
    for png in written[1:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_the_started_servers_config_takes_the_benchs_settings_and_stays_valid(tmp_path):
    from agent.config import load_config
    from latency_bench.servers import DEFAULT_CONFIG, write_bench_config

    path = write_bench_config(tmp_path, DEFAULT_CONFIG, max_calls=8, deployment="none", schedule="arrival")
    config = load_config(path)
    assert (config.server.max_concurrent_calls, config.server.schedule, config.deployment) == (8, "arrival", None)
    assert config.store.path == str(tmp_path / "cadence-bench.sqlite3")
    assert load_config(write_bench_config(tmp_path, DEFAULT_CONFIG, max_calls=1)).server.schedule == "wanted-by"
    changed = load_config(write_bench_config(tmp_path, DEFAULT_CONFIG, max_calls=1,
                                             settings=["asr.partial_every_s=0.5", "vad.stop_secs=0.3"]))
    assert (changed.asr.partial_every_s, changed.vad.stop_secs, changed.asr.model) == (0.5, 0.3, "package:whisper-base")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        write_bench_config(tmp_path, DEFAULT_CONFIG, max_calls=1, settings=["asr.partial_every_s"])


def test_final_transcript_latency_is_read_on_the_callers_clock():
    from latency_bench.stats import final_transcript_ms

    turn = {"speech_end_at": 100.0, "server": {"end_of_speech_at": 100.05, "stage_ms": {"asr_final": 450.0}}}
    assert final_transcript_ms(turn) == 500.0  # the server's own clock started 50 ms late
    assert final_transcript_ms({"speech_end_at": 100.0, "server": None}) is None
    assert final_transcript_ms({"speech_end_at": 100.0, "server": {"stage_ms": {}}}) is None


async def test_the_stock_baseline_records_when_each_final_transcript_came():
    from pipecat.frames.frames import TranscriptionFrame, VADUserStoppedSpeakingFrame
    from pipecat.observers.base_observer import FramePushed
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

    from latency_bench.load.stock_pipecat import transcript_observer

    turns: list[dict] = []
    observer = transcript_observer(turns)
    hop = FrameProcessor()

    async def push(frame, first_push=True, direction=FrameDirection.DOWNSTREAM):
        await observer.on_push_frame(FramePushed(source=hop, destination=hop, frame=frame,
                                                 direction=direction, timestamp=0, first_push=first_push))

    await push(VADUserStoppedSpeakingFrame(stop_secs=0.2))
    await push(VADUserStoppedSpeakingFrame(stop_secs=0.2), direction=FrameDirection.UPSTREAM)  # its twin
    await push(TranscriptionFrame("Where is my package?", "caller", ""))
    await push(TranscriptionFrame("Where is my package?", "caller", ""), first_push=False)  # a later hop
    turn, = turns
    assert turn["user_text"] == "Where is my package?" and 200 <= turn["stage_ms"]["asr_final"] < 1000


def test_the_pause_bench_alternates_sentences_broken_mid_way_with_plain_questions():
    from latency_bench.quality.pauses import longest_silence_s, plan

    turns, paused = plan(0.6)
    assert paused == [True, False] * 5
    for turn, is_paused in zip(turns, paused):
        gap = longest_silence_s(turn.utterance.samples, turn.utterance.rate)
        assert (0.5 <= gap <= 0.8) if is_paused else gap < 0.3, (turn.utterance.text, gap)


def test_the_transports_summary_takes_medians_over_runs_and_compares_with_the_phone():
    from latency_bench.load import transports

    def run(p50, p95, server=None, errors=0):
        return {"ttfs_ms": {"p50": p50, "p95": p95}, "server_ttfs_ms_p50": server, "errors": errors, "turns": 5}

    summary = transports.summarize({"twilio": [run(1000, 1400), run(1100, 1300), run(900, 1500)],
                                    "webrtc": [run(1300, 1600, errors=1), run(None, None), run(1200, 1700)]})
    assert summary["twilio"] == {"ttfs_ms_p50": 1000, "ttfs_ms_p95": 1400, "server_ttfs_ms_p50": None,
                                 "errors": 0, "p50_minus_phone_ms": 0}
    assert summary["webrtc"]["ttfs_ms_p50"] == 1250 and summary["webrtc"]["p50_minus_phone_ms"] == 250
    assert summary["webrtc"]["errors"] == 1


def test_the_relay_agent_is_a_valid_speech_to_speech_agent():
    from agent.agents import AgentLimits, parse_spec
    from latency_bench.load import transports

    spec = parse_spec(transports.relay_agent("ws://127.0.0.1:8000", "default"),
                      AgentLimits(max_prompt_chars=1000, max_greeting_chars=100))
    assert spec.pipeline == "openai-realtime" and spec.speech_to_speech.base_url == "ws://127.0.0.1:8000/v1/realtime"


@pytest.mark.parametrize("name", ["no-knowledge", "long-prompt"])
def test_the_benchs_agent_files_are_valid_agents_under_the_default_limits(name):
    config = load_config(Path("configs/default.yaml"))
    spec = parse_spec(yaml.safe_load(Path(f"latency_bench/agents/{name}.yaml").read_text()), limits_of(config))
    assert spec.name == name
    if name == "long-prompt":  # what it is for: a prompt near the limit, read cold on a call's first turn
        assert 0.9 * config.agents.max_prompt_chars <= len(spec.system_prompt) <= config.agents.max_prompt_chars
