"""Call lifecycle: admission, running one pipeline per call, persistence, cleanup.

`CallManager` owns every call task: it cancels and awaits them on shutdown, and a call
that ends, however it ends, releases its slot and leaves its record in the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipecat.observers.base_observer import BaseObserver
from pipecat.workers.runner import WorkerRunner
from pipecat.transports.base_transport import BaseTransport

from agent.agent_registry import AgentRegistry
from agent.auth import SessionLease
from agent.config import CadenceConfig
from agent.errors import CapacityError
from agent.events import TurnEvents
from agent.memory import IdleHousekeeping
from agent.metrics import CadenceMetrics
from agent.store import CallStore, turn_summary, turn_to_dict
from pipelines.call_agent import CallAgent
from pipelines.call_events import CallEvents
from pipelines.retrieval import SearchPassages
from pipelines.turn_end import PauseVerdict
from pipelines.turn_timeline import Turn
from pipelines.voice import AgentReach, CallerLine, Engines, VoiceCall, build_voice_call

log = logging.getLogger(__name__)

# Seconds a cancelled call gets to unwind before we stop waiting for it.
CANCEL_GRACE_SECONDS = 5.0


@dataclass
class ActiveCall:
    id: str
    transport: str
    started_at: float
    agent: CallAgent  # as it was when the call was admitted
    external_id: str | None = None  # the caller side's id (Twilio callSid, WebRTC pc_id)
    voice: VoiceCall | None = None
    end_reason: str = "completed"
    bad_messages: int = 0
    pending_writes: set[asyncio.Task] = field(default_factory=set)
    hearing: str = ""  # the caller's words so far in the turn under way (streaming partials)
    lease: SessionLease | None = None  # the operator key's session slot this call holds
    caller_audio_at: float | None = None  # when the caller's audio last reached the pipeline

    def heard(self, partial: str) -> None:
        self.hearing = partial

    def snapshot(self) -> dict[str, Any]:
        """The call so far: its newest turns (pipelines.turn_timeline.KEPT_TURNS; the stored call
        has every one) and `turn_count`, how many there were."""
        timeline = self.voice.observer.timeline if self.voice else None
        return {"id": self.id, "agent": self.agent.name, "transport": self.transport, "external_id": self.external_id,
                "started_at": self.started_at, "live": True, "hearing": self.hearing,
                "turn_count": timeline.turn_count if timeline else 0,
                "turns": [turn_to_dict(t) for t in timeline.turns] if timeline else []}

    def progress(self) -> dict[str, Any]:
        """What a dashboard shows of a call in progress: no transcript."""
        return {"id": self.id, "agent": self.agent.name, "transport": self.transport, "started_at": self.started_at,
                "turns": self.voice.observer.timeline.turn_count if self.voice else 0}


class CallManager:
    def __init__(self, config: CadenceConfig, engines: Engines, store: CallStore, metrics: CadenceMetrics,
                 agents: AgentRegistry, clock: Callable[[], float] = time.time, events: TurnEvents | None = None,
                 search_for: Callable[[CallAgent], SearchPassages | None] = lambda agent: None,
                 release_lease: Callable[[SessionLease], None] = lambda lease: None,
                 environ: Mapping[str, str] | None = None) -> None:
        self._release_lease = release_lease  # gives the call's key its session slot back
        self._environ = environ or {}  # where speech-to-speech agents' remote keys are read
        self._config = config
        self._agents = agents
        self._search_for = search_for  # the agent's knowledge search, if it has any
        self._engines = engines
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._events = events  # closed turns are published here for live dashboards
        self._active: dict[str, ActiveCall] = {}
        self._tasks: set[asyncio.Task] = set()
        self.draining = False  # set by drain(): refuse new calls, let the live ones finish
        self._none_active = asyncio.Event()  # set while no call holds a slot
        self._none_active.set()
        self._housekeeping = IdleHousekeeping(lambda: not self._active)  # memory back to the OS when idle

    @property
    def active_count(self) -> int:
        return len(self._active)

    def live(self, call_id: str) -> ActiveCall | None:
        return self._active.get(call_id)

    def in_progress(self) -> list[dict[str, Any]]:
        """Every admitted call, oldest first."""
        calls = sorted(self._active.values(), key=lambda c: c.started_at)
        return [c.progress() for c in calls]

    @property
    def full(self) -> bool:
        return self.draining or len(self._active) >= self._config.server.max_concurrent_calls

    def drain(self) -> None:
        """No new calls from now on; the calls in progress finish as they would."""
        self.draining = True

    @property
    def full_message(self) -> str:
        if self.draining:
            return "server is draining before it stops; call again (another replica answers)"
        return f"server is at its limit of {self._config.server.max_concurrent_calls} concurrent calls; retry later"

    def refuse(self, transport: str) -> None:
        self._metrics.calls_refused.labels(transport, "capacity").inc()

    def admit(self, transport: str, agent_name: str | None = None, lease: SessionLease | None = None) -> ActiveCall:
        """Reserves a call slot now (before any slow setup), or refuses: CapacityError, or
        NotFoundError for an agent that does not exist (None: the default agent). The call
        owns `lease` from here on, refused or not, and gives it back when it ends."""
        try:
            agent = self._agents.for_call(agent_name)
            if self.full:
                self.refuse(transport)
                raise CapacityError(self.full_message)
        except Exception:
            if lease is not None:
                self._release_lease(lease)
            raise
        call = ActiveCall(id=uuid.uuid4().hex, transport=transport, started_at=self._clock(), agent=agent,
                          lease=lease)
        self._active[call.id] = call
        self._none_active.clear()
        self._metrics.calls_active.labels(transport).inc()
        return call

    def release_lease(self, lease: SessionLease) -> None:
        """For a lease taken for a call that never got as far as `admit`."""
        self._release_lease(lease)

    def release(self, call: ActiveCall) -> None:
        """Frees a slot that was admitted but never ran (e.g. the offer was malformed)."""
        if self._active.pop(call.id, None) is not None:
            self._metrics.calls_active.labels(call.transport).dec()
        if not self._active:
            self._none_active.set()
            self._housekeeping.when_idle()
        if call.lease is not None:
            self._release_lease(call.lease)
            call.lease = None

    def spawn(self, call: ActiveCall, runs: Coroutine[Any, Any, None]) -> asyncio.Task:
        """Runs `runs` (the call's `run`, with whatever its transport does around it) in a task
        this manager owns and cancels on shutdown (WebRTC: the HTTP request returns at once)."""
        task = asyncio.create_task(runs, name=f"call-{call.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def run(self, call: ActiveCall, transport: BaseTransport, *, output_sample_rate: int,
                  enable_rtvi: bool = False, observers: Sequence[BaseObserver] = ()) -> None:
        """Runs the call to its end. `observers` watch its frames (a transport's own events)."""
        try:
            await self._store.call_started(call.id, call.agent.name, call.transport, call.started_at,
                                           call.external_id)
            # Built off the event loop: a pipeline's construction (a Silero ONNX session of its own,
            # the processors) takes 100-300 ms on 2 cores, and every other call's audio and every
            # handshake waited that long (found by the chaos bench: sdp, oversize).
            voice = await asyncio.to_thread(
                build_voice_call,
                CallerLine(transport, output_sample_rate, enable_rtvi=enable_rtvi, observers=observers),
                engines=self._engines, options=self._config.call_options(), agent=call.agent,
                events=_CallEventsCounted(self, call),
                reach=AgentReach(search=self._search_for(call.agent), remote_api_key=self._remote_api_key(call.agent)),
            )
            @voice.task.event_handler("on_idle_timeout")
            async def _on_idle(_task) -> None:  # pipecat then cancels the pipeline itself
                if call.end_reason == "completed":
                    call.end_reason = "idle_timeout"

            runner = WorkerRunner(handle_sigint=False, handle_sigterm=False)
            await runner.add_workers(voice.task)
            if call.end_reason != "completed":
                # Hung up while its pipeline was being built (a WebRTC peer's connect deadline,
                # a caller gone): hang_up had no pipeline to cancel, so none is started.
                log.info("call %s ended (%s) before its pipeline started", call.id, call.end_reason)
                return
            call.voice = voice  # from here hang_up cancels it; nothing awaits before it runs
            log.info("call %s started (%s)", call.id, call.transport)
            # A watchdog, not wait_for: pipecat's runner finishes normally when cancelled, and
            # wait_for then returns as if the call had simply ended.
            watchdog = asyncio.create_task(self._hang_up_after(call, self._config.limits.max_call_seconds))
            try:
                await runner.run()
            finally:
                watchdog.cancel()
                await asyncio.gather(watchdog, return_exceptions=True)
        except asyncio.CancelledError:
            call.end_reason = call.end_reason if call.end_reason != "completed" else "cancelled"
            await self._cancel_task(call)
            raise
        except Exception:
            call.end_reason = "error"
            log.exception("call %s failed", call.id)
        finally:
            await self._finish(call)

    def _caller_audio(self, call: ActiveCall, counter: Any, seconds: float) -> None:
        call.caller_audio_at = self._clock()
        counter.inc(seconds)

    def caller_silent_seconds(self, call: ActiveCall) -> float:
        """How long ago the caller's audio last reached the pipeline (or the call began, if none has)."""
        heard_at = call.caller_audio_at if call.caller_audio_at is not None else call.started_at
        return self._clock() - heard_at

    def _remote_api_key(self, agent: CallAgent) -> str | None:
        remote = agent.speech_to_speech
        if remote is None or remote.api_key_env is None:
            return None
        key = self._environ.get(remote.api_key_env)
        if not key:
            log.warning("agent %s: $%s is not set; connecting to its speech-to-speech server without a key",
                        agent.name, remote.api_key_env)
        return key or None

    async def _cancel_task(self, call: ActiveCall) -> None:
        if call.voice is not None:
            try:
                await asyncio.wait_for(asyncio.shield(call.voice.task.cancel()), CANCEL_GRACE_SECONDS)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                log.warning("call %s did not unwind within %.0f s", call.id, CANCEL_GRACE_SECONDS)

    async def _hang_up_after(self, call: ActiveCall, seconds: float) -> None:
        await asyncio.sleep(seconds)
        log.info("call %s reached its %.0f s limit", call.id, seconds)
        await self.hang_up(call, "max_duration")

    async def hang_up(self, call: ActiveCall, reason: str) -> None:
        """Ends a call from outside its pipeline (caller hung up, too many bad messages). One
        whose pipeline is still being built keeps the reason, and `run` then never starts it."""
        if call.end_reason == "completed":
            call.end_reason = reason
        if call.voice is not None:
            await call.voice.task.cancel()

    def _turn_closed(self, call: ActiveCall, turn: Turn) -> None:
        call.hearing = ""
        self._metrics.observe_turn(turn, call.transport)
        if self._events is not None:
            self._events.publish(turn_summary(call.id, call.agent.name, call.transport, turn))
        write = asyncio.get_running_loop().create_task(self._store.save_turn(call.id, turn))
        call.pending_writes.add(write)
        write.add_done_callback(call.pending_writes.discard)

    def turn_changed(self, call: ActiveCall, turn: Turn) -> None:
        """A closed turn was edited (its reply cut to what the caller heard): stored again."""
        write = asyncio.get_running_loop().create_task(self._store.save_turn(call.id, turn))
        call.pending_writes.add(write)
        write.add_done_callback(call.pending_writes.discard)

    async def _finish(self, call: ActiveCall) -> None:
        try:
            if call.voice is not None:
                call.voice.observer.finish()
            if call.pending_writes:
                await asyncio.wait(call.pending_writes, timeout=CANCEL_GRACE_SECONDS)
            await self._store.call_ended(call.id, self._clock(), call.end_reason)
        except Exception:
            log.exception("call %s: could not persist its end", call.id)
        finally:
            self._metrics.calls_total.labels(call.transport, call.end_reason).inc()
            self.release(call)
            log.info("call %s ended (%s)", call.id, call.end_reason)

    async def end_all(self, reason: str) -> None:
        """Ends every live call as `reason` and waits (a bounded time) until each is stored."""
        live = list(self._active.values())
        if not live:
            return
        log.info("ending %d live calls (%s)", len(live), reason)
        await asyncio.gather(*(self.hang_up(call, reason) for call in live), return_exceptions=True)
        try:
            await asyncio.wait_for(self._none_active.wait(), CANCEL_GRACE_SECONDS)
        except asyncio.TimeoutError:
            log.warning("%d calls still live %.0f s after being ended", len(self._active), CANCEL_GRACE_SECONDS)

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CANCEL_GRACE_SECONDS * 2)


class _CallEventsCounted(CallEvents):
    """One call's events, counted in the server's metrics, shown on its page and stored."""

    def __init__(self, manager: CallManager, call: ActiveCall) -> None:
        self._manager, self._call, self._metrics = manager, call, manager._metrics
        self._caller_audio_seconds = self._metrics.caller_audio_seconds.labels(call.transport)

    def turn_closed(self, turn: Turn) -> None:
        self._manager._turn_closed(self._call, turn)

    def caller_audio(self, seconds: float) -> None:
        self._manager._caller_audio(self._call, self._caller_audio_seconds, seconds)

    def partial(self, text: str) -> None:
        self._call.heard(text)

    def asr_rejected(self, reason: str) -> None:
        self._metrics.asr_guard_triggers.labels("live", reason).inc()

    def long_turn_cut(self, seconds: float) -> None:
        self._metrics.long_turn_cuts.observe(seconds)

    def pause_verdict(self, verdict: PauseVerdict) -> None:
        self._metrics.pause_verdicts.labels(verdict.reason).inc()

    def eager_reply(self, outcome: str) -> None:
        self._metrics.eager_replies.labels(outcome).inc()

    def retrieval_missed(self, reason: str) -> None:
        self._metrics.retrieval_misses.labels(reason).inc()

    def redacted(self, count: int) -> None:
        self._metrics.redactions.labels("call").inc(count)

    def model_failed(self, model: str, kind: str) -> None:
        self._metrics.model_failures.labels(model, kind).inc()
