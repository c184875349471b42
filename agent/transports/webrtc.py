"""Browser callers over WebRTC (pipecat's SmallWebRTC transport on aiortc).

`POST /api/offer` takes `{"sdp": ..., "type": "offer"}` as pipecat's SmallWebRTC clients
send it and answers `{"sdp", "type": "answer", "pc_id", "call_id"}`; `PATCH /api/offer`
takes trickled ICE candidates. ICE servers come from config only: by default none, so
the server never contacts a public STUN server. A peer that has not connected within
limits.handshake_timeout_seconds of its answer is hung up, as a phone socket without `start` is.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiortc import RTCIceServer
from aiortc.sdp import SessionDescription, candidate_from_sdp
from pipecat.transports.base_transport import TransportParams
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport

from agent.auth import SessionLease
from agent.calls import ActiveCall, CallManager
from agent.config import CadenceConfig
from agent.errors import BadSignalingError
from agent.transports.jitter import ImmediateAudioJitterBuffer
from agent.metrics import CadenceMetrics

log = logging.getLogger(__name__)

TRANSPORT = "webrtc"
# Opus runs at 48 kHz. Handing aiortc 48 kHz spares its own 24 -> 48 kHz step, whose 20 ms
# packets wait on the next 10 ms frame (8 ms on the first reply audio, latency_bench/components/webrtc_path.py);
# the TTS's audio is resampled once, in pipecat, either way.
WEBRTC_OUTPUT_SAMPLE_RATE = 48_000
# aiortc's audio jitter buffer holds 4 packets before releasing one (prefetch=4): 80 ms on every
# frame of the caller's speech, so on every end of turn; and it waits out a lost packet for good
# (agent/transports/jitter.py). The caller's packets go on as they arrive instead.
MAX_CANDIDATES_PER_PATCH = 32
# A peer whose network is gone is hung up when ICE consent expires (RFC 7675; aioice: 6 checks
# ~5 s apart unanswered, 24-36 s); a shorter outage resumes by itself with no new offer. A call
# that ends after this long without the caller's audio is stored as `network_lost`.
NETWORK_SILENT_SECONDS = 10.0


def parse_offer(body: bytes, max_bytes: int) -> dict[str, Any]:
    if len(body) > max_bytes:
        raise BadSignalingError(f"offer is {len(body)} bytes; the limit is {max_bytes}")
    try:
        data = json.loads(body)
    # ValueError as well as JSONDecodeError: json.loads raises it bare for an integer past
    # Python's 4,300-digit int() limit, which JSON allows.
    except (ValueError, RecursionError):
        raise BadSignalingError("offer body must be JSON: {\"sdp\": \"...\", \"type\": \"offer\"}") from None
    if not isinstance(data, dict):
        raise BadSignalingError("offer body must be a JSON object")
    sdp, kind = data.get("sdp"), data.get("type")
    if kind != "offer":
        raise BadSignalingError("'type' must be \"offer\"")
    if not isinstance(sdp, str) or not sdp.startswith("v=0"):
        raise BadSignalingError("'sdp' must be an SDP offer starting with v=0")
    if not _is_unicode_text(sdp):
        raise BadSignalingError("'sdp' holds a lone surrogate (\\ud800-\\udfff), which is not text")
    if "m=audio" not in sdp:
        raise BadSignalingError("the offer has no audio media section (m=audio)")
    if not _has_dtls_fingerprints(sdp):
        raise BadSignalingError("malformed SDP offer: a media section has no DTLS fingerprint (a=fingerprint)")
    pc_id = data.get("pc_id")
    if pc_id is not None:
        raise BadSignalingError("renegotiating an existing connection is not supported; send a new offer without pc_id")
    return {"sdp": sdp, "type": kind, "agent": _agent_of(data)}


def _agent_of(offer: dict[str, Any]) -> str | None:
    """The agent an offer names: `agent` at the top, or in pipecat clients' request data."""
    request_data = offer.get("request_data", offer.get("requestData"))
    nested = request_data.get("agent") if isinstance(request_data, dict) else None
    agent = offer.get("agent", nested)
    if agent is not None and not (isinstance(agent, str) and _is_unicode_text(agent)):
        raise BadSignalingError("'agent' must be an agent's name (a string)")
    return agent


def _has_dtls_fingerprints(sdp: str) -> bool:
    """aiortc answers an offer without a fingerprint, though its connection can never be
    secured: its connect task then fails on an assertion, an error nothing handles. An offer
    aiortc cannot parse at all passes here, and fails in setRemoteDescription as before."""
    try:
        session = SessionDescription.parse(sdp)
    except Exception:
        return True
    return all(media.dtls is not None and media.dtls.fingerprints for media in session.media)


def _is_unicode_text(value: str) -> bool:
    """False for a string with a lone surrogate: JSON's \\udcff escapes decode to one, and
    echoed back (aiortc copies the offer's mids into its answer, an error names the agent)
    it cannot be encoded into the response, which then fails with a 500."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def ice_servers(config: CadenceConfig) -> list[RTCIceServer]:
    return [RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
            for s in config.server.ice_servers]


class WebRTCCalls:
    """Creates a call per offer and keeps its connection reachable for ICE trickling."""

    def __init__(self, manager: CallManager, config: CadenceConfig, metrics: CadenceMetrics) -> None:
        self._manager = manager
        self._config = config
        self._metrics = metrics
        self._connections: dict[str, SmallWebRTCConnection] = {}

    async def answer(self, body: bytes, agent: str | None = None, lease: SessionLease | None = None) -> dict[str, Any]:
        """`agent` (the query parameter) wins over one named in the body. Raises
        BadSignalingError (-> 400), NotFoundError (-> 404) or CapacityError (-> 503).
        The call takes `lease` over; a refused offer gives it back at once."""
        try:
            offer = parse_offer(body, self._config.server.max_sdp_bytes)
        except BadSignalingError:
            self._metrics.bad_input.labels(TRANSPORT, "offer").inc()
            if lease is not None:
                self._manager.release_lease(lease)
            raise
        call = self._manager.admit(TRANSPORT, agent or offer["agent"], lease=lease)
        connection = SmallWebRTCConnection(ice_servers=ice_servers(self._config))
        try:
            await connection.initialize(sdp=offer["sdp"], type=offer["type"])
            answer = connection.get_answer()
            if answer is None:
                raise BadSignalingError("could not produce an answer for this offer")
        except Exception as exc:
            self._manager.release(call)
            self._metrics.bad_input.labels(TRANSPORT, "sdp").inc()
            await _disconnect_quietly(connection)
            if isinstance(exc, BadSignalingError):
                raise
            # aiortc's parser raises many exception types on malformed SDP (see FACTS).
            raise BadSignalingError(f"malformed SDP offer: {exc.__class__.__name__}") from None

        _shorten_caller_jitter_buffer(connection)
        transport = SmallWebRTCTransport(
            webrtc_connection=connection,
            params=TransportParams(audio_in_enabled=True, audio_out_enabled=True),
        )
        pc_id = answer["pc_id"]
        call.external_id = pc_id
        self._connections[pc_id] = connection
        connected, network_lost = asyncio.Event(), asyncio.Event()

        # The peer connection's own state, not pipecat's on_client_connected: that one also
        # waits for the pipeline to start, which is not the caller's to finish in time. A plain
        # function, so it runs inside aiortc's emit, before pipecat's own (async) handler closes
        # the connection on "failed" and reports a disconnect that reads like a hang-up.
        @connection.pc.on("connectionstatechange")
        def _on_state_change() -> None:
            if connection.pc.connectionState == "connected":
                connected.set()
            elif connection.pc.connectionState == "failed" and connected.is_set():
                network_lost.set()  # ICE gave up on the caller's address

        async def _caller_gone() -> None:
            # aiortc often reports a lost network as a plain close (its DTLS transport closes on
            # the ICE connection's end before ICE says "failed"); a caller who hangs up sends
            # audio until it does, and one whose network went sent none for the ~30 s before.
            silent_s = self._manager.caller_silent_seconds(call)
            if silent_s >= NETWORK_SILENT_SECONDS:
                network_lost.set()
            if network_lost.is_set():
                log.info("call %s: the caller's network went away (%.0f s without its audio)", call.id, silent_s)
            await self._manager.hang_up(call, "network_lost" if network_lost.is_set() else "caller_hung_up")

        @transport.event_handler("on_client_disconnected")
        async def _on_disconnected(_transport, _client) -> None:
            await _caller_gone()

        # A caller who hangs up stops its audio (RTCP BYE: the track ends) and closes the
        # connection (DTLS close). On a lossy network the close can be lost where the BYE was
        # not (seen at 10 % loss): without this the call held its slot until ICE consent ran out.
        for receiver in connection.pc.getReceivers():
            if receiver.track is not None and receiver.track.kind == "audio":
                receiver.track.on("ended", lambda: self._manager.spawn(call, _caller_gone()))

        self._manager.spawn(call, self._run_call(call, transport, connection, connected))
        return {**answer, "call_id": call.id}

    async def _run_call(self, call: ActiveCall, transport: SmallWebRTCTransport, connection: SmallWebRTCConnection,
                        connected: asyncio.Event) -> None:
        """The call, and what WebRTC needs around it. A peer that never connects would hold its
        slot until the idle timeout: an offer whose ICE cannot start (no candidates, and
        end-of-candidates) leaves the connection "new" for good, and pipecat's own 60 s
        deadline covers only "connecting". And pipecat closes only a peer connection that
        connected; one that never did would keep its sockets and ICE tasks after the call."""
        deadline = asyncio.create_task(self._hang_up_unless_connected(call, connected))
        try:
            await self._manager.run(call, transport, output_sample_rate=WEBRTC_OUTPUT_SAMPLE_RATE, enable_rtvi=True)
        finally:
            deadline.cancel()
            await asyncio.gather(deadline, return_exceptions=True)
            self._connections.pop(connection.pc_id, None)
            await _disconnect_quietly(connection)

    async def _hang_up_unless_connected(self, call: ActiveCall, connected: asyncio.Event) -> None:
        timeout_s = self._config.limits.handshake_timeout_seconds
        try:
            async with asyncio.timeout(timeout_s):
                await connected.wait()
        except TimeoutError:
            log.info("call %s: the WebRTC peer did not connect within %.1f s; hanging up", call.id, timeout_s)
            self._metrics.bad_input.labels(TRANSPORT, "handshake_timeout").inc()
            await self._manager.hang_up(call, "handshake_timeout")

    async def add_candidates(self, body: bytes) -> None:
        try:
            data = json.loads(body)
            pc_id = data["pc_id"]
            candidates = data["candidates"]
            if not isinstance(candidates, list) or len(candidates) > MAX_CANDIDATES_PER_PATCH:
                raise ValueError
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
            raise BadSignalingError(
                f"body must be {{\"pc_id\": ..., \"candidates\": [...]}} with at most {MAX_CANDIDATES_PER_PATCH}"
            ) from None
        connection = self._connections.get(pc_id) if isinstance(pc_id, str) else None
        if connection is None:
            raise LookupError("no such peer connection")
        for c in candidates:
            if not isinstance(c, dict) or not isinstance(c.get("candidate"), str):
                raise BadSignalingError("each candidate needs a 'candidate' string")
            if not c["candidate"]:
                await connection.add_ice_candidate(None)  # end-of-candidates marker
                continue
            try:
                candidate = candidate_from_sdp(c["candidate"].removeprefix("candidate:"))
            except Exception:
                raise BadSignalingError("malformed ICE candidate") from None
            candidate.sdpMid = c.get("sdp_mid", c.get("sdpMid"))
            candidate.sdpMLineIndex = c.get("sdp_mline_index", c.get("sdpMLineIndex"))
            if candidate.sdpMid is None and candidate.sdpMLineIndex is None:  # aiortc raises ValueError: a 500
                raise BadSignalingError("each candidate needs 'sdpMid' or 'sdpMLineIndex'")
            await connection.add_ice_candidate(candidate)


def _shorten_caller_jitter_buffer(connection: SmallWebRTCConnection) -> None:
    """aiortc offers no setting for it; pipecat replaces the video receiver's buffer the same way."""
    for transceiver in connection.pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.receiver._RTCRtpReceiver__jitter_buffer = ImmediateAudioJitterBuffer()


async def _disconnect_quietly(connection: SmallWebRTCConnection) -> None:
    try:
        await connection.disconnect()
    except Exception:  # a connection that never got going may fail to close; nothing to free
        log.debug("disconnect of a failed connection raised", exc_info=True)
