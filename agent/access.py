"""Access control at the server's edges: what credential a request carries, and the refusals.

The rules are pure (agent/auth.py); this module reads them off HTTP requests and WebSocket
handshakes. Every route that starts a call or changes an agent goes through a `Gatekeeper`:

- a call (WebRTC offer, phone socket, /v1/realtime) takes a `SessionLease` against its
  operator key, released when the call ends, however it ends;
- a change (agents, knowledge, transcriptions, minting a client token) needs an operator key.

With no keys configured the server is open to whoever reaches it, which the bind rule
(`bind_refusal`) confines to this machine. Credentials are never logged: only key ids
(key-1, key-2, ...) and refusal reasons are.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import time
from collections.abc import Callable, Mapping

from fastapi import Request

from agent.auth import ANONYMOUS_KEY_ID, AccessControl, AuthConfig, SessionLease, check_origin, presented_credential
from agent.errors import CadenceError, ForbiddenError, SessionLimitError, UnauthorizedError
from agent.metrics import CadenceMetrics
from agent.transports import twilio_protocol

log = logging.getLogger(__name__)

# Browsers cannot set headers on a WebSocket; OpenAI's Realtime API takes the key as a
# subprotocol instead ("openai-insecure-api-key.<key>", beside "realtime"). So do we.
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
TWILIO_KEY_ID = "twilio"  # sessions admitted by a valid Twilio signature count against this id
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Loggers that see a WebSocket handshake's headers: websockets logs each one at DEBUG
# ("< authorization: Bearer <key>") through the logger uvicorn hands it, else its own.
HANDSHAKE_LOGGERS = ("uvicorn.error", "websockets.server")
# A header that carries a credential, as a log line shows it: the rest of the line is masked.
_CREDENTIAL_HEADER = re.compile(r"\b(authorization|api-key|x-twilio-signature)(['\"]?\s*[:=]\s*)\S[^\n]*",
                                re.IGNORECASE)
_KEY_SUBPROTOCOL = re.compile(re.escape(KEY_SUBPROTOCOL_PREFIX) + r"[^\s,'\"]+")
REDACTED = "[redacted]"


def subprotocols(headers: Mapping[str, str]) -> list[str]:
    return [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def credential_of(headers: Mapping[str, str]) -> str | None:
    """`Authorization: Bearer`, `api-key`, or (WebSockets from browsers) the key subprotocol."""
    credential = presented_credential(headers)
    if credential is not None:
        return credential
    for protocol in subprotocols(headers):
        if protocol.startswith(KEY_SUBPROTOCOL_PREFIX) and len(protocol) > len(KEY_SUBPROTOCOL_PREFIX):
            return protocol[len(KEY_SUBPROTOCOL_PREFIX):]
    return None


def redact_credentials(text: str) -> str:
    """`text` with the values of credential headers and the key subprotocol masked."""
    text = _CREDENTIAL_HEADER.sub(lambda m: f"{m[1]}{m[2]}{REDACTED}", text)
    return _KEY_SUBPROTOCOL.sub(KEY_SUBPROTOCOL_PREFIX + REDACTED, text)


class CredentialRedactor(logging.Filter):
    """Keeps keys, tokens and Twilio signatures out of the handshake lines websockets logs at
    DEBUG: a debug log is still a log, and it is the one shared when asking for help. The line
    stays, masked, so it still shows that a credential came and how."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: its handler reports it, as without us
            return True
        masked = redact_credentials(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


_REDACTOR = CredentialRedactor()  # stateless: one instance, so installing it twice adds it once


def keep_credentials_out_of_logs() -> None:
    for name in HANDSHAKE_LOGGERS:
        logging.getLogger(name).addFilter(_REDACTOR)


def _is_ip_literal_or_localhost(hostname: str) -> bool:
    name = hostname.lower().removeprefix("[").removesuffix("]")
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def own_origin(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The origins of this server's own pages (the call page, the dashboard), as a browser on them
    sends them. Only when the Host is an IP address or localhost: a page on a domain name that
    resolves here (DNS rebinding) would otherwise pass as our own."""
    host = headers.get("host", "")
    hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    if not host or not _is_ip_literal_or_localhost(hostname):
        return ()
    return (f"http://{host}", f"https://{host}")


class Gatekeeper:
    def __init__(self, config: AuthConfig, raw_keys: tuple[str, ...], metrics: CadenceMetrics, *,
                 twilio_auth_token: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.control = AccessControl(config, raw_keys)
        self._metrics = metrics
        self._twilio_auth_token = twilio_auth_token
        self._clock = clock

    @property
    def keys_required(self) -> bool:
        return len(self.control.keys) > 0

    def _refused(self, action: str, exc: CadenceError) -> CadenceError:
        reason = getattr(exc, "reason", None) or (
            "origin" if isinstance(exc, ForbiddenError) else "session_limit" if isinstance(exc, SessionLimitError)
            else "other")
        self._metrics.access_refused.labels(action, reason).inc()
        log.info("access refused (%s): %s", action, reason)
        return exc

    def check_origin(self, headers: Mapping[str, str], action: str) -> None:
        try:
            check_origin(headers.get("origin"), (*self.control.config.allowed_origins, *own_origin(headers)))
        except ForbiddenError as exc:
            raise self._refused(action, exc) from None

    def operator(self, headers: Mapping[str, str], action: str = "operator") -> str:
        """The operator key id of a request that changes something; raises Unauthorized/Forbidden."""
        self.check_origin(headers, action)
        try:
            return self.control.operator_key_id(credential_of(headers))
        except UnauthorizedError as exc:
            raise self._refused(action, exc) from None

    def mint(self, headers: Mapping[str, str], ttl_s: float | None = None):
        key_id = self.operator(headers, "mint")
        token = self.control.tokens.mint(key_id, self.control.config.client_token_ttl_s if ttl_s is None else ttl_s,
                                         self._clock())
        log.info("client token minted under %s (expires in %.0f s)", key_id, token.expires_at - self._clock())
        return token

    def admit(self, headers: Mapping[str, str]) -> SessionLease:
        """A lease for a new session, from a key or a client token (used up here)."""
        self.check_origin(headers, "session")
        try:
            return self.control.admit(credential_of(headers), self._clock())
        except (UnauthorizedError, SessionLimitError) as exc:
            raise self._refused("session", exc) from None

    def check_phone(self, headers: Mapping[str, str], urls: tuple[str, ...]) -> None:
        """The phone socket, before it is accepted: a valid Twilio signature (when an auth token
        is configured), else a valid credential and Origin as for any session. Takes nothing:
        the session's lease waits for `admit_phone`, once the socket has sent `start`, so
        sockets that never finish the handshake hold none of a key's sessions. A signature that
        is present but wrong is refused, not passed on to the keys."""
        if self._signed_by_twilio(headers, urls):
            return
        self.check_origin(headers, "session")
        try:
            self.control.verify(credential_of(headers), self._clock())
        except UnauthorizedError as exc:
            raise self._refused("session", exc) from None

    def admit_phone(self, headers: Mapping[str, str], urls: tuple[str, ...]) -> SessionLease:
        """The phone call's lease, once `start` has come (SessionLimitError past a key's cap)."""
        if self._signed_by_twilio(headers, urls):
            try:
                return self.control.limits.acquire(TWILIO_KEY_ID)
            except SessionLimitError as exc:
                raise self._refused("session", exc) from None
        return self.admit(headers)

    def _signed_by_twilio(self, headers: Mapping[str, str], urls: tuple[str, ...]) -> bool:
        signature = headers.get("x-twilio-signature")
        if not self._twilio_auth_token or signature is None:
            return False
        if not twilio_protocol.signature_valid(self._twilio_auth_token, signature, urls):
            raise self._refused("session", UnauthorizedError(
                "X-Twilio-Signature does not match; check the auth token and the public URL", reason="signature"))
        return True

    def release(self, lease: SessionLease | None) -> None:
        if lease is not None:
            self.control.release(lease)

    def open_sessions(self, key_id: str = ANONYMOUS_KEY_ID) -> int:
        return self.control.limits.open_sessions(key_id)


def refusal_reason(exc: CadenceError) -> str:
    """The `reason` label of cadence_calls_refused_total for an access refusal."""
    if isinstance(exc, SessionLimitError):
        return "session_limit"
    return "origin" if isinstance(exc, ForbiddenError) else "unauthorized"


def operator_required(gate: Gatekeeper):
    """A FastAPI dependency for routers that change things: reads pass, writes need a key."""

    async def require(request: Request) -> None:
        if request.method not in SAFE_METHODS:
            gate.operator(request.headers)

    return require


def phone_socket_urls(headers: Mapping[str, str], path: str, query: str) -> tuple[str, ...]:
    """The URLs Twilio may have signed for this socket: wss:// as dialled, or ws:// without TLS."""
    host = headers.get("x-forwarded-host") or headers.get("host", "")
    suffix = f"{path}?{query}" if query else path
    return (f"wss://{host}{suffix}", f"ws://{host}{suffix}")
