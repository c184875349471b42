"""What one server holds, built in one place: the parts the routers serve and how they start and stop.

`compose` builds every part from the config (engines built, not loaded: no model is read
here); `ServerParts.lifespan` opens them, loads and warms the models in the background, and
closes everything in reverse however the server ends. `agent/app.py` then only mounts the
routers of each area on these parts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from agent import engine_factory
from agent.access import Gatekeeper
from agent.agent_registry import AgentRegistry, FileAgent, load_agent_files
from agent.auth import operator_keys
from agent.calls import CallManager
from agent.chat import TextChat
from agent.config import CadenceConfig
from agent.events import TurnEvents
from agent.gc_pauses import GcPauseWatch, freeze_startup_objects
from agent.health import Readiness, named_engines
from agent.knowledge_wiring import Knowledge
from agent.loop_lag import LoopLagMonitor
from agent.metrics import CadenceMetrics
from agent.model_plane import ModelPlane, model_plane_for
from agent.store import CallStore
from agent.transports.webrtc import WebRTCCalls
from pipelines.voice import Engines
from transcription.jobs import TranscriptionJobs

log = logging.getLogger(__name__)


@dataclass
class ServerParts:
    """Everything one server holds, each part built once by `compose` and handed to the
    routers that serve it; no part reaches for another through this object."""

    config: CadenceConfig
    environ: Mapping[str, str]  # where API keys and the Twilio auth token are read
    plane: ModelPlane  # the deployment's workers this server runs or reaches (none: all in-process)
    engines: Engines
    owns_engines: bool  # engines passed in belong to the caller (tests share one set across apps)
    engines_loaded: bool  # passed in loaded and warmed: startup loads nothing
    agent_files: dict[str, FileAgent]  # the YAML agents, checked against the LLM's context
    metrics: CadenceMetrics
    gate: Gatekeeper  # who may start calls and change things
    store: CallStore
    agents: AgentRegistry
    knowledge: Knowledge
    events: TurnEvents  # closed turns, for live dashboards
    manager: CallManager
    webrtc: WebRTCCalls
    chat: TextChat
    transcriptions: TranscriptionJobs
    readiness: Readiness
    loop_lag: LoopLagMonitor
    gc_pauses: GcPauseWatch
    started_at: float = field(default_factory=time.monotonic)  # for uptime

    def publish(self, state) -> None:
        """What tests and `agent/serve.py` read off `app.state`."""
        state.manager, state.metrics, state.store, state.events = self.manager, self.metrics, self.store, self.events
        state.agents, state.knowledge, state.readiness = self.agents, self.knowledge, self.readiness
        state.model_plane, state.engines = self.plane, self.engines
        state.transcriptions = self.transcriptions
        state.gate = self.gate
        state.loop_lag = self.loop_lag

    def lifespan(self, *, freeze_after_load: bool = False):
        """The app's lifespan: opens the parts, loads the models in the background, closes all.
        `freeze_after_load`: see `create_app`."""

        @asynccontextmanager
        async def lifespan(_app) -> AsyncIterator[None]:
            await self._open()
            loader = asyncio.create_task(self._load_models(freeze_after_load), name="load-models")
            try:
                yield
            finally:
                await self._close(loader)

        return lifespan

    async def _open(self) -> None:
        await self.store.open()
        await self.agents.open()
        await self.knowledge.open()
        self.loop_lag.start()  # stopped in _close, however the server ends
        self.gc_pauses.install()

    async def _close(self, loader: asyncio.Task) -> None:
        await self.loop_lag.stop()
        self.gc_pauses.uninstall()
        self.events.close()
        loader.cancel()
        await asyncio.gather(loader, return_exceptions=True)
        await self.manager.shutdown()
        await self.transcriptions.close()
        await self.knowledge.close()
        await self.store.close()
        if self.owns_engines:
            await engine_factory.close_engines(self.engines)
        if self.plane.supervisor is not None:
            await self.plane.supervisor.stop()

    async def _load_models(self, freeze_after_load: bool) -> None:
        """Workers, models and file agents' documents, then ready; a failure leaves the server
        up but not ready, with the reason on /readyz and /api/health."""
        try:
            if self.plane.supervisor is not None:
                await self.plane.supervisor.start()  # the workers this server runs, each ready
            if not self.engines_loaded:
                by_role = named_engines(self.engines)
                await asyncio.to_thread(engine_factory.load_and_warm, self.engines, lambda engine: (
                    self.readiness.loaded.update(role for role, each in by_role.items() if each is engine)))
            # File agents' documents: ingested once (unchanged files are skipped), before calls.
            await self.knowledge.sync_file_agents(self.agent_files)
            if freeze_after_load:
                log.info("%d startup objects frozen out of the garbage collector's scans", freeze_startup_objects())
            self.readiness.ready.set()
            log.info("models loaded; ready for calls")
        except Exception as exc:
            self.readiness.error = f"{exc.__class__.__name__}: {exc}"
            log.exception("model loading failed; the server stays up but not ready")


def compose(config: CadenceConfig, *, engines: Engines | None = None, engines_loaded: bool = False,
            environ: Mapping[str, str] | None = None) -> ServerParts:
    """Every part of one server, wired. A bad agent file raises ConfigError here, naming the
    file and the field. `engines` may be passed in already loaded (tests share one set)."""
    environ = os.environ if environ is None else environ
    owns_engines = engines is None
    plane = model_plane_for(config) if owns_engines else ModelPlane()
    engines = engines or engine_factory.build_engines(config, plane.endpoints)  # built, not loaded
    # Agents are checked against the LLM's context (a prompt that leaves no room for a dialogue is refused).
    agent_files = load_agent_files(config, llm_context_tokens=engines.llm.context_tokens)
    metrics = CadenceMetrics()
    gate = Gatekeeper(config.auth, operator_keys(config.auth, environ), metrics,
                      twilio_auth_token=environ.get(config.auth.twilio_auth_token_env) or None)
    store = CallStore(config.store.path)
    agents = AgentRegistry(config, store, agent_files, llm_context_tokens=engines.llm.context_tokens)
    knowledge = Knowledge(config, engines.embedder, metrics)
    events = TurnEvents(on_drop=metrics.dashboard_dropped.inc)
    manager = CallManager(config, engines, store, metrics, agents, events=events, search_for=knowledge.search_for,
                          release_lease=gate.release, environ=environ)
    parts = ServerParts(
        config=config, environ=environ, plane=plane, engines=engines, owns_engines=owns_engines,
        engines_loaded=engines_loaded, agent_files=agent_files, metrics=metrics, gate=gate, store=store,
        agents=agents, knowledge=knowledge, events=events, manager=manager,
        webrtc=WebRTCCalls(manager, config, metrics),
        chat=TextChat(config, agents, engines.llm, metrics, search_for=knowledge.search_for),
        transcriptions=TranscriptionJobs(config.transcription.options(), config.transcription.job_limits(),
                                         Path(config.transcription.upload_dir),
                                         on_end=metrics.observe_transcription),
        readiness=Readiness(), loop_lag=LoopLagMonitor(on_sample=metrics.event_loop_lag_probes.observe),
        gc_pauses=GcPauseWatch(lambda generation, seconds: (
            metrics.gc_pause_seconds.labels(str(generation)).observe(seconds))))
    if engines_loaded:
        parts.readiness.loaded.update(named_engines(engines))
    _track(parts)
    return parts


def _track(parts: ServerParts) -> None:
    """What the metrics read from the parts: stream backlogs, engine queues, loop lag."""
    metrics, events, loop_lag = parts.metrics, parts.events, parts.loop_lag
    metrics.track_dashboard_streams(lambda: events.subscriber_count, lambda: events.max_backlog)
    for name, engine in named_engines(parts.engines).items():
        metrics.track_queue_depth(name, lambda e=engine: e.queue_depth)
    metrics.track_event_loop_lag(lambda: loop_lag.latest_s, loop_lag.max_recent_s)
