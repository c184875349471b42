"""Prometheus metrics, one registry per app (two apps in one process never collide)."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from pipelines.turn_timeline import STAGES, Turn

# Seconds from the caller's end of speech; dense below 1.5 s where voice agents live.
_LATENCY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 10.0)
# Event-loop lag: a healthy loop stays under 10 ms; from 100 ms callers hear gaps.
_LOOP_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _os_threads() -> float:
    try:
        return float(len(os.listdir("/proc/self/task")))
    except OSError:  # not Linux: Python's own threads only
        return float(threading.active_count())


class CadenceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # The process's own figures (process_resident_memory_bytes, process_open_fds, CPU
        # seconds) and its OS threads: what a leak shows in first.
        ProcessCollector(registry=self.registry)
        Gauge("cadence_process_threads", "OS threads of the server process (native ones included)",
              registry=self.registry).set_function(_os_threads)
        self._define_call_metrics()
        self._define_model_metrics()
        self._define_server_metrics()

    def _define_call_metrics(self) -> None:
        """Latency per stage, calls, access and bad input: what callers live through."""
        self.stage_seconds = Histogram(
            "cadence_stage_seconds", "Time from the caller's end of speech to each pipeline stage",
            ["stage", "transport"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.ttfs_seconds = Histogram(
            "cadence_ttfs_seconds", "Time to first sentence: caller's end of speech to first reply audio sent",
            ["transport"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.sentence_ttfb_seconds = Histogram(
            "cadence_tts_sentence_ttfb_seconds", "Per reply sentence: TTS request to its first audio",
            ["transport"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.calls_active = Gauge("cadence_calls_active", "Calls in progress", ["transport"], registry=self.registry)
        self.calls_total = Counter("cadence_calls_total", "Calls by how they ended", ["transport", "outcome"],
                                   registry=self.registry)
        self.calls_refused = Counter("cadence_calls_refused_total", "Calls refused at admission", ["transport", "reason"],
                                     registry=self.registry)
        self.access_refused = Counter(
            "cadence_access_refused_total",
            "Requests refused by access control, by what they tried (session, operator, mint) and why "
            "(missing, malformed, invalid, unknown, expired, reused, origin, signature, session_limit)",
            ["action", "reason"], registry=self.registry)
        self.bad_input = Counter("cadence_bad_input_total", "Rejected caller input", ["transport", "kind"],
                                 registry=self.registry)
        self.request_head_timeouts = Counter(
            "cadence_request_head_timeouts_total",
            "Connections closed because their request head was not complete within "
            "server.request_header_timeout_seconds (silent or trickling clients)", registry=self.registry)
        self.turns_total = Counter("cadence_turns_total", "Completed turns", ["transport", "interrupted"],
                                   registry=self.registry)

    def _define_model_metrics(self) -> None:
        """Engines, retrieval and what each turn's models decided or failed."""
        self.engine_queue_depth = Gauge("cadence_engine_queue_depth", "Requests queued or running per engine",
                                        ["engine"], registry=self.registry)
        self.retrieval_seconds = Histogram(
            "cadence_retrieval_seconds", "Knowledge search (query embedding + hybrid search)", ["path"],
            buckets=(0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0), registry=self.registry,
        )
        self.retrieval_misses = Counter("cadence_retrieval_misses_total",
                                        "Turns answered without passages because retrieval timed out or failed",
                                        ["reason"], registry=self.registry)
        self.redactions = Counter("cadence_redactions_total",
                                  "Reply clauses withheld because they quoted the system prompt or its secrets",
                                  ["path"], registry=self.registry)
        self.asr_guard_triggers = Counter(
            "cadence_asr_guard_triggers_total",
            "Transcripts the hallucination guard rejected (each retried hotter, then re-chunked), by reason",
            ["path", "reason"], registry=self.registry)
        self.pause_verdicts = Counter(
            "cadence_turn_end_verdicts_total",
            "Callers' pauses by how long the turn-end judge let them be (finished: short; "
            "words_unfinished / voice_unfinished: long; undecided: the agent's pause)",
            ["reason"], registry=self.registry)
        self.model_failures = Counter(
            "cadence_model_failures_total",
            "Turns a model failed (kind: error, or stalled past its deadlines.*): the caller heard an "
            "apology (asr, llm) or the sentence was skipped (tts)", ["model", "kind"], registry=self.registry)
        self.caller_audio_seconds = Counter(
            "cadence_caller_audio_seconds_total",
            "Seconds of callers' audio that reached the pipeline (VAD, then ASR); against the calls' length, "
            "what the network lost", ["transport"], registry=self.registry)
        self.long_turn_cuts = Histogram(
            "cadence_long_turn_cut_seconds",
            "Callers' turns longer than limits.max_user_turn_seconds, cut and transcribed while they went "
            "on: the length of each part cut off",
            buckets=(5.0, 10.0, 15.0, 20.0, 25.0, 30.0), registry=self.registry)
        self.eager_replies = Counter(
            "cadence_eager_replies_total",
            "Replies started at a pause, by how they ended (confirmed: used; missed / withdrawn / expired: dropped)",
            ["outcome"], registry=self.registry)

    def _define_server_metrics(self) -> None:
        """Transcription jobs, dashboard streams, the event loop and the garbage collector."""
        self.transcriptions = Counter("cadence_transcriptions_total", "Transcription jobs by how they ended",
                                      ["status"], registry=self.registry)
        self.transcribed_audio_seconds = Counter("cadence_transcribed_audio_seconds_total",
                                                 "Audio seconds of finished transcription jobs",
                                                 registry=self.registry)
        self.dashboard_streams = Gauge("cadence_dashboard_streams", "Open dashboard event streams",
                                       registry=self.registry)
        self.dashboard_backlog = Gauge("cadence_dashboard_backlog_events",
                                       "Events queued for the slowest dashboard stream", registry=self.registry)
        self.dashboard_dropped = Counter("cadence_dashboard_events_dropped_total",
                                         "Turn events a slow dashboard stream lost (oldest first)",
                                         registry=self.registry)
        self.event_loop_lag = Gauge("cadence_event_loop_lag_seconds",
                                    "How late the event loop ran a timer at its latest probe", registry=self.registry)
        self.event_loop_lag_max = Gauge("cadence_event_loop_lag_max_seconds",
                                        "Largest event-loop lag over the monitor's recent window (60 s by default)",
                                        registry=self.registry)
        self.event_loop_lag_probes = Histogram(
            "cadence_event_loop_lag_probe_seconds", "Every event-loop lag probe: how late its timer fired",
            buckets=_LOOP_LAG_BUCKETS, registry=self.registry)
        # Every collection holds the GIL, and so the event loop: a pause is lag (agent/gc_pauses.py).
        self.gc_pause_seconds = Histogram(
            "cadence_gc_pause_seconds", "Python's cyclic garbage collector: how long each collection took",
            ["generation"], buckets=_LOOP_LAG_BUCKETS, registry=self.registry)
        Gauge("cadence_gc_frozen_objects", "Objects taken out of the garbage collector's scans once the server loaded",
              registry=self.registry).set_function(gc.get_freeze_count)

    def observe_transcription(self, status: str, result: dict | None) -> None:
        self.transcriptions.labels(status).inc()
        if result is not None:
            self.transcribed_audio_seconds.inc(result["audio_seconds"])
            for reason, count in result["guard_triggers"].items():
                self.asr_guard_triggers.labels("file", reason).inc(count)

    def observe_turn(self, turn: Turn, transport: str) -> None:
        self.turns_total.labels(transport, str(turn.interrupted).lower()).inc()
        stage_ms = turn.stage_ms()
        for stage in STAGES:
            if stage in stage_ms:
                self.stage_seconds.labels(stage, transport).observe(stage_ms[stage] / 1000.0)
        if turn.ttfs_ms is not None:
            self.ttfs_seconds.labels(transport).observe(turn.ttfs_ms / 1000.0)
        for ttfb_ms in turn.sentence_ttfb_ms:
            self.sentence_ttfb_seconds.labels(transport).observe(ttfb_ms / 1000.0)

    def track_queue_depth(self, engine: str, depth: Callable[[], int]) -> None:
        self.engine_queue_depth.labels(engine).set_function(depth)

    def track_dashboard_streams(self, streams: Callable[[], int], backlog: Callable[[], int]) -> None:
        self.dashboard_streams.set_function(streams)
        self.dashboard_backlog.set_function(backlog)

    def track_event_loop_lag(self, latest: Callable[[], float | None], max_recent: Callable[[], float | None]) -> None:
        """Both read at scrape time; 0 before the first probe (a gauge cannot say "unknown")."""
        self.event_loop_lag.set_function(lambda: latest() or 0.0)
        self.event_loop_lag_max.set_function(lambda: max_recent() or 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
